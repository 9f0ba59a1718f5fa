"""Which compiled twins this process runs: `twin("zonebus.server.corerun", "run")` is the compiled function, or
None when its extension was not built (no C compiler, Cython or header where the package was installed:
`setup.py`) or `ZONEBUS_PURE_PYTHON` is set (the tests run the pure-Python twins that way too)."""

from __future__ import annotations

import importlib
import os
from typing import Any


def twin(module: str, name: str) -> Any | None:
    """The compiled `module.name`, or None (then the caller uses its pure-Python twin)."""
    if os.environ.get("ZONEBUS_PURE_PYTHON"):
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        return None
