"""The `pipeline` extra: the packages the PySpark pipeline needs and the broker does not.

`pip install zonebus` installs the broker only; `pip install 'zonebus[pipeline]'` adds PySpark, matplotlib,
numpy and nats-py (the demo's clients). The commands that run the pipeline (`zonebus cost`, `zonebus
streams`, `zonebus demo`) call `require_pipeline_extra()` before they import any of them, so that a missing
package is one line naming the extra, not a stack trace. This module imports none of them: it asks the
import system whether they are there.
"""

from __future__ import annotations

import importlib.util
import sys

from zonebus.pipeline.errors import PipelineEnvironmentError

EXTRA = "pipeline"
INSTALL = "python3 -m pip install 'zonebus[pipeline]'"
# module -> the distribution that provides it
PACKAGES = {"pyspark": "pyspark", "matplotlib": "matplotlib", "numpy": "numpy", "nats": "nats-py"}


def missing_packages() -> list[str]:
    """The distributions of the extra whose modules cannot be imported here."""
    return [dist for module, dist in PACKAGES.items() if not _importable(module)]


def _importable(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None  # None: imports of it are blocked
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require_pipeline_extra() -> None:
    """Raise `PipelineEnvironmentError` naming the missing packages and the extra that installs them."""
    missing = missing_packages()
    if missing:
        raise PipelineEnvironmentError(
            f"{', '.join(missing)} not installed: this command needs zonebus's `{EXTRA}` extra "
            f"(`{INSTALL}`; from a checkout: `python3 -m pip install '.[{EXTRA}]'`)")
