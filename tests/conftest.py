"""Test-wide set-up: the offline compiler and the local anvil for Ape (see docs/platform.md)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Ape compiles lazily and finds anvil with shutil.which at connect time, both after this runs,
# so `pytest` works without the Makefile's environment too.
os.environ.setdefault("SOLCX_BINARY_PATH", str(ROOT / "tools" / "solc"))
_bin = str(ROOT / "node_modules" / ".bin")
if _bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")
