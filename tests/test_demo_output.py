"""`make demo` in a pipe: whole hashes and CIDs on one line each (rich wraps at 80 columns)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HASH = "0x" + "ab" * 32
CID = "bafybeiakl24cnkepg63rogv2wqdknvqufdleyz73lzwbaovbp7hcaf56pu"


def test_demo_lines_are_not_wrapped_in_a_pipe() -> None:
    code = (
        "import runpy, sys; sys.argv = ['demo']; "
        f"d = runpy.run_path({str(ROOT / 'scripts' / 'demo.py')!r}, run_name='not_main'); "
        f"d['log']('funded job {HASH} (tx {HASH}) output {CID} and more words after it'); "
        f"d['console'].print('paid job {HASH} output {CID} provider {HASH[:42]} tx {HASH}')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert HASH in lines[0] and CID in lines[0] and lines[0].endswith("after it")
    assert lines[1].startswith("paid job") and lines[1].endswith(HASH)
    assert all(line == line.rstrip() for line in lines)  # no padding to a width
