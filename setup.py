"""Builds the optional compiled twins (Cython) next to the pure-Python package: the core path
(`zonebus/server/corerun.pyx`) and the file store's runs of records (`zonebus/store/recordrun.pyx`, over zlib).

Everything else is in pyproject.toml. Without a C compiler (or Cython, or zlib's header) an extension is skipped
and zonebus runs on its pure-Python twin (`zonebus.server.corepath.run`, `zonebus.store.records.encode_run_py`).
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # (pip installs Cython for the build: pyproject.toml's build-system; by hand it may be absent)
    extensions = []
else:
    extensions = cythonize([Extension("zonebus.server.corerun", ["zonebus/server/corerun.pyx"]),
                            Extension("zonebus.store.recordrun", ["zonebus/store/recordrun.pyx"], libraries=["z"])],
                           compiler_directives={"language_level": "3"}, quiet=True)
    for ext in extensions:
        ext.optional = True  # a failed compile is a warning: the package then runs on the pure-Python path

setup(ext_modules=extensions)
