"""Builds the optional compiled core path (`zonebus/server/corerun.pyx`, Cython) next to the pure-Python package.

Everything else is in pyproject.toml. Without a C compiler (or Cython) the extension is skipped and zonebus
runs on its pure-Python `zonebus.server.corepath.run`.
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # (pip installs Cython for the build: pyproject.toml's build-system; by hand it may be absent)
    extensions = []
else:
    extensions = cythonize([Extension("zonebus.server.corerun", ["zonebus/server/corerun.pyx"])],
                           compiler_directives={"language_level": "3"}, quiet=True)
    for ext in extensions:
        ext.optional = True  # a failed compile is a warning: the package then runs on the pure-Python path

setup(ext_modules=extensions)
