"""Security tests reuse the raw-socket scenario runner of tests/wire (script.py, rawclient.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "wire"))
