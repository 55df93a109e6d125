"""Content-addressed storage on an IPFS daemon (Kubo RPC API ``/api/v0``, via ``ipfshttpclient``),
shared by the agent (datasets in, outputs out) and the scheduler (job specs, output checks).

Works with Kubo and with the js-ipfs daemon of the dev stack. Nothing fetched is trusted: entry
names are checked before anything touches the disk, sizes are counted while streaming, and the
finished tree must hash back to the requested CID (:mod:`gridmarket.cid`) or it is deleted.
Outputs are added as CIDv1 with raw leaves (Kubo's ``--cid-version=1`` defaults, spelled out
because js-ipfs does not imply raw leaves) and the daemon's answer is checked the same way.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from gridmarket.cid import CidError, bytes_cid, normalize_cid, params_for, path_cid

log = logging.getLogger(__name__)

# ipfshttpclient 0.8.0a2 passes urllib3 a parameter it deprecated; the warning is noise.
warnings.filterwarnings("ignore", message="The 'strict' parameter", category=FutureWarning)

_DIR, _FILE = 1, 2  # `ls` link types
MAX_DEPTH = 64


class IpfsError(OSError):
    """The daemon failed, timed out, or refused an operation."""


class ContentTooLargeError(IpfsError, ValueError):
    """Content larger than the caller's cap (nothing is kept)."""


class ContentVerificationError(IpfsError, ValueError):
    """Bytes that do not hash back to the requested CID, or an unsafe tree (nothing is kept)."""


class _Budget:
    def __init__(self, store: IpfsStore, cid: str, max_bytes: int, max_entries: int) -> None:
        self.store = store
        self.cid, self.max_bytes, self.max_entries = cid, max_bytes, max_entries
        self.bytes = self.entries = 0

    def add_bytes(self, n: int) -> None:
        self.bytes += n
        if self.bytes > self.max_bytes:
            raise self.store.too_large_error(
                f"{self.store.noun} {self.cid} is larger than the {self.max_bytes}-byte cap"
            )

    def add_entry(self) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise self.store.too_large_error(
                f"{self.store.noun} {self.cid} has over {self.max_entries} files and directories"
            )


class IpfsStore:
    """Verified, capped reads and checked adds on an IPFS daemon; a context manager.

    Subclasses name their errors (the agent raises its own ``Dataset*`` errors) and the noun
    used in messages through the class attributes below.
    """

    error: type[Exception] = IpfsError
    too_large_error: type[Exception] = ContentTooLargeError
    verification_error: type[Exception] = ContentVerificationError
    noun = "content"

    def __init__(
        self,
        api_addr: str = "/ip4/127.0.0.1/tcp/5001/http",
        *,
        timeout: float = 120.0,
        resolve_timeout: float = 30.0,
        max_entries: int = 100_000,
    ) -> None:
        """``api_addr`` is the daemon's RPC multiaddr; ``resolve_timeout`` bounds finding a CID."""
        import ipfshttpclient  # here, not at the top: an idle agent does not pay for it

        self._errors = ipfshttpclient.exceptions
        # Client() directly: ipfshttpclient.connect() refuses daemons newer than it knows.
        self._client = ipfshttpclient.Client(api_addr, timeout=timeout)
        self.api_addr = api_addr
        self.resolve_timeout = resolve_timeout
        self.max_entries = max_entries

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> IpfsStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ fetch

    def fetch(self, cid: str, dest: Path, max_bytes: int) -> Path:
        try:
            cid = normalize_cid(cid)
            candidates = params_for(cid)
        except CidError as exc:
            raise self.verification_error(str(exc)) from None
        dest.mkdir(parents=True, exist_ok=True)
        if any(dest.iterdir()):
            raise self.error(f"fetch destination {dest} is not empty")
        budget = _Budget(self, cid, max_bytes, self.max_entries)
        try:
            kind, size = self._stat(cid)
            if kind == "file":
                if size > max_bytes:
                    raise self.too_large_error(
                        f"{self.noun} {cid} is {size} bytes, over the {max_bytes}-byte cap"
                    )
                target = dest / cid
                self._fetch_file(cid, target, budget)
            elif kind == "directory":
                target = dest
                self._fetch_dir(cid, dest, budget, 0)
            else:
                raise self.verification_error(
                    f"{self.noun} {cid} is a {kind}, not a file or directory"
                )
            self._verify(cid, target, candidates)
        except BaseException:
            _empty(dest)
            raise
        log.info("fetched %s: %d bytes, %d entries", cid, budget.bytes, budget.entries)
        return target

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self._errors.TimeoutError as exc:
            raise self.error(f"IPFS {what} timed out ({exc}): is the content reachable?") from exc
        except self._errors.ConnectionError as exc:
            raise self.error(f"IPFS daemon at {self.api_addr} unreachable: {exc}") from exc
        except self._errors.Error as exc:
            raise self.error(f"IPFS {what} failed: {exc}") from exc

    def _stat(self, cid: str) -> tuple[str, int]:
        stat = self._call(
            f"stat of {cid}", self._client.files.stat, f"/ipfs/{cid}", timeout=self.resolve_timeout
        )
        return str(stat["Type"]), int(stat.get("Size", 0))

    def _fetch_file(self, cid: str, target: Path, budget: _Budget) -> None:
        budget.add_entry()
        chunks: Iterator[bytes] = self._call(f"cat of {cid}", self._client.cat, cid, stream=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            try:
                for chunk in chunks:
                    budget.add_bytes(len(chunk))
                    out.write(chunk)
            except self._errors.Error as exc:
                raise self.error(f"IPFS cat of {cid} failed: {exc}") from exc
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()

    def _fetch_dir(self, cid: str, target: Path, budget: _Budget, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.verification_error(f"{self.noun} {budget.cid} nests deeper than {MAX_DEPTH}")
        listing = self._call(f"ls of {cid}", self._client.ls, cid, timeout=self.resolve_timeout)
        target.mkdir(mode=0o755, exist_ok=depth == 0)
        target.chmod(0o755)
        for link in listing["Objects"][0].get("Links") or []:
            name = str(link.get("Name", ""))
            if not name or name in (".", "..") or "/" in name or "\0" in name:
                raise self.verification_error(
                    f"{self.noun} {budget.cid} holds an unsafe entry name {name!r}"
                )
            child, kind = str(link["Hash"]), int(link.get("Type", -1))
            if kind == _DIR:
                budget.add_entry()
                self._fetch_dir(child, target / name, budget, depth + 1)
            elif kind == _FILE:
                self._fetch_file(child, target / name, budget)
            else:
                raise self.verification_error(
                    f"{self.noun} {budget.cid}: {name!r} is neither a file nor a directory"
                )

    def _verify(self, cid: str, target: Path, candidates: list[Any]) -> None:
        computed = ""
        for params in candidates:
            computed = path_cid(target, params)
            if computed == cid:
                return
        raise self.verification_error(
            f"{self.noun} {cid} failed verification: its bytes hash to {computed}. Either the data "
            "was tampered with, or it was added with options this node cannot recompute "
            "(a chunker other than the default 256 KiB, the trickle layout, mode/mtime "
            "metadata, sharded directories)"
        )

    # ------------------------------------------------------------------ add

    def add_dir(self, path: Path) -> str:
        if not path.is_dir() or path.is_symlink():
            raise self.error(f"{path} is not a directory")
        try:
            expected = path_cid(path)
        except CidError as exc:
            raise self.error(f"cannot add {path}: {exc}") from None
        entries = self._call(
            f"add of {path}",
            self._client.add,
            str(path),
            recursive=True,
            cid_version=1,
            raw_leaves=True,
            period_special=False,  # also add dot-files: '**' skips them otherwise
            follow_symlinks=False,
            pin=True,
        )
        if not isinstance(entries, list):
            entries = [entries]
        roots = [e for e in entries if e.get("Name") == path.name]
        if not roots:
            raise self.error(f"IPFS add of {path} returned no root entry: {entries[-1:]}")
        root = normalize_cid(str(roots[-1]["Hash"]))
        if root != expected:
            raise self.error(
                f"IPFS built {root} for {path} but its bytes hash to {expected}: "
                "the daemon changed the tree (metadata, sharding) or the tree changed meanwhile"
            )
        log.info("added %s as %s", path, root)
        return root

    def add_bytes(self, data: bytes) -> str:
        """Add one file's bytes (a job spec, a module) as CIDv1 raw leaves; its checked CID."""
        expected = bytes_cid(data)
        entry = self._call(
            "add of bytes",
            self._client.add_bytes,
            data,
            opts={"cid-version": "1", "raw-leaves": "true", "pin": "true"},
        )
        got = normalize_cid(str(entry if isinstance(entry, str) else entry["Hash"]))
        if got != expected:
            raise self.error(f"IPFS built {got} for {len(data)} bytes that hash to {expected}")
        return got

    def cat(self, cid: str, *, max_bytes: int, timeout_s: float | None = None) -> bytes:
        """The bytes of the single file ``cid``, at most ``max_bytes``, checked against ``cid``."""
        try:
            cid = normalize_cid(cid)
            candidates = params_for(cid)
        except CidError as exc:
            raise self.verification_error(str(exc)) from None
        stat = self._call(
            f"stat of {cid}",
            self._client.files.stat,
            f"/ipfs/{cid}",
            timeout=timeout_s or self.resolve_timeout,
        )
        if stat["Type"] != "file":
            raise self.verification_error(f"{self.noun} {cid} is a {stat['Type']}, not a file")
        if int(stat.get("Size", 0)) > max_bytes:
            raise self.too_large_error(
                f"{self.noun} {cid} is {stat['Size']} bytes, over the {max_bytes}-byte cap"
            )
        data = bytearray()
        chunks: Iterator[bytes] = self._call(f"cat of {cid}", self._client.cat, cid, stream=True)
        try:
            for chunk in chunks:
                data += chunk
                if len(data) > max_bytes:
                    raise self.too_large_error(
                        f"{self.noun} {cid} is over the {max_bytes}-byte cap"
                    )
        except self._errors.Error as exc:
            raise self.error(f"IPFS cat of {cid} failed: {exc}") from exc
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        if not any(bytes_cid(bytes(data), p) == cid for p in candidates):
            raise self.verification_error(f"{self.noun} {cid}: bytes do not hash to the CID")
        return bytes(data)


def _empty(directory: Path) -> None:
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
