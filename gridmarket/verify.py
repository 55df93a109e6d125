"""Verification of a provider's output before the escrow pays it (docs/scheduler-verify.md).

The output CID a provider signed must be a UnixFS CID this node can recompute, retrievable from
IPFS within ``timeout_s``, its bytes must hash back to that CID (recomputed in Python:
:mod:`gridmarket.cid`), and its size must be within the job's cap. Nothing is trusted while
fetching: names, sizes and the final hash are checked by :meth:`gridmarket.ipfs.IpfsStore.fetch`,
into a temporary directory that is always removed. The run's exit status is checked by the
caller (the result report) before this runs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from gridmarket.cid import CidError, normalize_cid, params_for
from gridmarket.ipfs import ContentTooLargeError, ContentVerificationError, IpfsError, IpfsStore

__all__ = ["Verdict", "VerdictCode", "verify_output"]


class VerdictCode(StrEnum):
    """Why an output was accepted or refused."""

    OK = "ok"
    UNREACHABLE = "unreachable"  # not retrievable (whole) within the time limit
    TOO_LARGE = "too_large"  # over the job's byte cap (or the entry cap)
    CID_MISMATCH = "cid_mismatch"  # the bytes hash to another CID, or an unsafe tree
    INVALID = "invalid"  # not a CID, or not one of a UnixFS file or directory (sha2-256)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of :func:`verify_output`; ``message`` names what failed (or what passed)."""

    code: VerdictCode
    message: str
    bytes: int = 0  # of the verified output (0 unless ok)
    files: int = 0  # regular files in it (1 for a single-file output)
    seconds: float = 0.0  # the check's wall time

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
    """Check ``output_cid`` as described in the module doc; never raises for a bad output.

    ``timeout_s`` bounds the whole fetch: an output the daemon cannot find, or cannot finish
    reading, comes back ``unreachable`` after about ``timeout_s``. The fetched copy lives in a
    temporary directory under ``work_dir`` that is removed before this returns.
    """
    t0 = time.monotonic()
    try:
        params_for(normalize_cid(output_cid))
    except CidError as exc:
        return Verdict(VerdictCode.INVALID, f"output CID {output_cid!r} is invalid: {exc}")
    work_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="verify-", dir=work_dir))
    try:
        target = store.fetch(output_cid, tmp / "out", max_bytes, timeout_s=timeout_s)
        size, files = _count(target)
        return Verdict(
            VerdictCode.OK,
            f"{output_cid}: {size} bytes in {files} files hash back to the CID",
            size,
            files,
            time.monotonic() - t0,
        )
    except ContentTooLargeError as exc:
        return Verdict(VerdictCode.TOO_LARGE, str(exc), seconds=time.monotonic() - t0)
    except ContentVerificationError as exc:
        return Verdict(VerdictCode.CID_MISMATCH, str(exc), seconds=time.monotonic() - t0)
    except IpfsError as exc:
        return Verdict(
            VerdictCode.UNREACHABLE,
            f"output {output_cid} not retrievable within {timeout_s:g} s: {exc}",
            seconds=time.monotonic() - t0,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
