"""Verification of a provider's output before the escrow pays it.

The output CID a provider signed must be retrievable from IPFS, its bytes must hash back to
that CID (recomputed in Python: :mod:`gridmarket.cid`), and its size must be within the job's
cap. Nothing is trusted while fetching: names, sizes and the final hash are checked by
:meth:`gridmarket.ipfs.IpfsStore.fetch`, into a temporary directory that is always removed.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from gridmarket.cid import CidError, normalize_cid
from gridmarket.ipfs import ContentTooLargeError, ContentVerificationError, IpfsError, IpfsStore

__all__ = ["Verdict", "VerdictCode", "verify_output"]


class VerdictCode(StrEnum):
    OK = "ok"
    UNREACHABLE = "unreachable"  # not retrievable within the time limit
    TOO_LARGE = "too_large"
    CID_MISMATCH = "cid_mismatch"  # the bytes hash to another CID, or an unsafe tree
    INVALID = "invalid"  # not a CID at all


@dataclass(frozen=True, slots=True)
class Verdict:
    code: VerdictCode
    message: str
    bytes: int = 0
    files: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.code is VerdictCode.OK


def _count(root: Path) -> tuple[int, int]:
    total = files = 0
    for p in [root] if root.is_file() else root.rglob("*"):
        if p.is_file():
            files += 1
            total += p.stat().st_size
    return total, files


def verify_output(
    store: IpfsStore, output_cid: str, *, max_bytes: int, timeout_s: float, work_dir: Path
) -> Verdict:
    """Check ``output_cid`` as described in the module doc; never raises for a bad output."""
    t0 = time.monotonic()
    try:
        normalize_cid(output_cid)
    except CidError as exc:
        return Verdict(VerdictCode.INVALID, f"{output_cid!r} is not a CID: {exc}")
    work_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="verify-", dir=work_dir))
    saved = store.resolve_timeout
    store.resolve_timeout = timeout_s
    try:
        target = store.fetch(output_cid, tmp / "out", max_bytes)
        size, files = _count(target)
        took = time.monotonic() - t0
        return Verdict(
            VerdictCode.OK,
            f"{output_cid}: {size} bytes in {files} files hash back to the CID",
            size,
            files,
            took,
        )
    except ContentTooLargeError as exc:
        return Verdict(VerdictCode.TOO_LARGE, str(exc), seconds=time.monotonic() - t0)
    except ContentVerificationError as exc:
        return Verdict(VerdictCode.CID_MISMATCH, str(exc), seconds=time.monotonic() - t0)
    except IpfsError as exc:
        return Verdict(
            VerdictCode.UNREACHABLE,
            f"{output_cid} not retrievable within {timeout_s:.0f} s: {exc}",
            seconds=time.monotonic() - t0,
        )
    finally:
        store.resolve_timeout = saved
        shutil.rmtree(tmp, ignore_errors=True)
