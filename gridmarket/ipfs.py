"""Content-addressed storage on an IPFS daemon (Kubo RPC API ``/api/v0``, via ``ipfshttpclient``),
shared by the agent (datasets in, outputs out) and the scheduler (job specs, output checks).

Works with Kubo and with the js-ipfs daemon of the dev stack. Nothing fetched is trusted: entry
names are checked before anything touches the disk, sizes are counted while streaming, and the
finished tree must hash back to the requested CID (:mod:`gridmarket.cid`) or it is deleted.
Outputs are added as CIDv1 with raw leaves (Kubo's ``--cid-version=1`` defaults, spelled out
because js-ipfs does not imply raw leaves) and the daemon's answer is checked the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
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
MAX_NAME_BYTES = 255
"""The longest entry name a directory may hold (what file systems allow)."""


class IpfsError(OSError):
    """The daemon failed, timed out, or refused an operation."""


class ContentTooLargeError(IpfsError, ValueError):
    """Content larger than the caller's cap (nothing is kept)."""


class ContentVerificationError(IpfsError, ValueError):
    """Bytes that do not hash back to the requested CID, or an unsafe tree (nothing is kept)."""


class _Budget:
    """What one fetch may still spend: bytes, entries and, with a deadline, time."""

    def __init__(
        self,
        store: IpfsStore,
        cid: str,
        max_bytes: int,
        max_entries: int,
        timeout_s: float | None = None,
    ) -> None:
        self.store = store
        self.cid, self.max_bytes, self.max_entries = cid, max_bytes, max_entries
        self.bytes = self.entries = 0
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def add_bytes(self, n: int) -> None:
        self.bytes += n
        if self.bytes > self.max_bytes:
            raise self.store.too_large_error(
                f"{self.store.noun} {self.cid} is larger than the {self.max_bytes}-byte cap"
            )
        self.check_time()

    def add_entry(self) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise self.store.too_large_error(
                f"{self.store.noun} {self.cid} has over {self.max_entries} files and directories"
            )

    def check_time(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise self.store.error(
                f"IPFS fetch of {self.cid} timed out: not complete within {self.timeout_s:g} s"
            )

    def timeout(self, default: float) -> float:
        """The timeout for the next daemon call: ``default``, cut to what the deadline leaves."""
        if self.deadline is None:
            return default
        self.check_time()
        return max(0.05, min(default, self.deadline - time.monotonic()))


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
        self.timeout = timeout
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

    def fetch(
        self, cid: str, dest: Path, max_bytes: int, *, timeout_s: float | None = None
    ) -> Path:
        """Fetch ``cid`` (a file or a directory tree) under ``dest``; return the file or ``dest``.

        ``dest`` must be empty. The content must hash back to ``cid`` and stay within
        ``max_bytes`` and ``max_entries``, else nothing is kept and ``too_large_error`` or
        ``verification_error`` is raised. ``timeout_s`` bounds the whole fetch (every daemon
        call and the streaming between them): past it, ``error`` says it timed out. Without
        it, each call has its own limit (``resolve_timeout`` to find, ``timeout`` to read).
        """
        try:
            cid = normalize_cid(cid)
            candidates = params_for(cid)
        except CidError as exc:
            raise self.verification_error(str(exc)) from None
        dest.mkdir(parents=True, exist_ok=True)
        if any(dest.iterdir()):
            raise self.error(f"fetch destination {dest} is not empty")
        budget = _Budget(self, cid, max_bytes, self.max_entries, timeout_s)
        try:
            kind, size = self._stat(cid, budget.timeout(self.resolve_timeout))
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

    def _stat(self, cid: str, timeout: float) -> tuple[str, int]:
        stat = self._call(
            f"stat of {cid}", self._client.files.stat, f"/ipfs/{cid}", timeout=timeout
        )
        return str(stat["Type"]), int(stat.get("Size", 0))

    def _fetch_file(self, cid: str, target: Path, budget: _Budget) -> None:
        budget.add_entry()
        chunks: Iterator[bytes] = self._call(
            f"cat of {cid}",
            self._client.cat,
            cid,
            stream=True,
            timeout=budget.timeout(self.timeout),  # also bounds each read of the stream
        )
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out, self._reading(cid, chunks):
            for chunk in chunks:
                budget.add_bytes(len(chunk))
                out.write(chunk)

    @contextlib.contextmanager
    def _reading(self, cid: str, chunks: Iterator[bytes]) -> Iterator[None]:
        """While ``cid``'s stream is read: its failures as this store's errors; then closed."""
        try:
            yield
        except self._errors.TimeoutError as exc:
            raise self.error(f"IPFS cat of {cid} timed out ({exc})") from exc
        except self._errors.Error as exc:
            raise self.error(f"IPFS cat of {cid} failed: {exc}") from exc
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _fetch_dir(self, cid: str, target: Path, budget: _Budget, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.verification_error(f"{self.noun} {budget.cid} nests deeper than {MAX_DEPTH}")
        listing = self._call(
            f"ls of {cid}", self._client.ls, cid, timeout=budget.timeout(self.resolve_timeout)
        )
        target.mkdir(mode=0o755, exist_ok=depth == 0)
        target.chmod(0o755)
        seen: set[str] = set()
        for link in listing["Objects"][0].get("Links") or []:
            name = str(link.get("Name", ""))
            if not name or name in (".", "..") or "/" in name or "\0" in name:
                raise self.verification_error(
                    f"{self.noun} {budget.cid} holds an unsafe entry name {name!r}"
                )
            if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
                raise self.verification_error(
                    f"{self.noun} {budget.cid} holds an entry name of "
                    f"{len(name.encode('utf-8', 'surrogateescape'))} bytes, over the "
                    f"{MAX_NAME_BYTES}-byte limit of file names: {name[:40]!r}..."
                )
            if name in seen:
                raise self.verification_error(
                    f"{self.noun} {budget.cid} holds two entries named {name[:80]!r} in one "
                    "directory"
                )
            seen.add(name)
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
        """The bytes of the single file ``cid``, at most ``max_bytes``, checked against ``cid``.

        ``timeout_s`` bounds the whole read (default: ``resolve_timeout`` to find the file,
        ``timeout`` to read it).
        """
        try:
            cid = normalize_cid(cid)
            candidates = params_for(cid)
        except CidError as exc:
            raise self.verification_error(str(exc)) from None
        budget = _Budget(self, cid, max_bytes, 1, timeout_s)
        kind, size = self._stat(cid, budget.timeout(self.resolve_timeout))
        if kind != "file":
            raise self.verification_error(f"{self.noun} {cid} is a {kind}, not a file")
        if size > max_bytes:
            raise self.too_large_error(
                f"{self.noun} {cid} is {size} bytes, over the {max_bytes}-byte cap"
            )
        data = bytearray()
        chunks: Iterator[bytes] = self._call(
            f"cat of {cid}",
            self._client.cat,
            cid,
            stream=True,
            timeout=budget.timeout(self.timeout),
        )
        with self._reading(cid, chunks):
            for chunk in chunks:
                data += chunk
                budget.add_bytes(len(chunk))
        if not any(bytes_cid(bytes(data), p) == cid for p in candidates):
            raise self.verification_error(f"{self.noun} {cid}: bytes do not hash to the CID")
        return bytes(data)

    # ------------------------------------------------------------------ pins

    def unpin(self, cid: str) -> bool:
        """Unpin ``cid`` (recursively) on this daemon, so its garbage collection may drop it;
        False when it was not pinned (nothing to do), :attr:`error` when the daemon failed."""
        try:
            cid = normalize_cid(cid)
        except CidError as exc:
            raise self.verification_error(str(exc)) from None
        try:
            self._client.pin.rm(cid, recursive=True, timeout=self.resolve_timeout)
        except self._errors.Error as exc:
            if "not pinned" in str(exc).lower():
                return False
            raise self.error(f"IPFS unpin of {cid} failed: {exc}") from exc
        return True

    def pinned(self, cid: str) -> bool:
        """Whether ``cid`` is pinned (directly or recursively) on this daemon."""
        try:
            cid = normalize_cid(cid)
        except CidError as exc:
            raise self.verification_error(str(exc)) from None
        try:
            self._client.pin.ls(cid, timeout=self.resolve_timeout)
        except self._errors.Error as exc:
            if "not pinned" in str(exc).lower():
                return False
            raise self.error(f"IPFS pin ls of {cid} failed: {exc}") from exc
        return True


def _empty(directory: Path) -> None:
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
