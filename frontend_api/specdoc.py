"""A job's spec as the front end reads it: decoded once, defensively, for every view.

A spec is whatever its submitter put on IPFS, so anyone can fund a job whose spec is hostile:
nested 20,000 deep (Python's ``json`` raises RecursionError on it, which is not a ValueError),
over the size cap, not JSON, JSON of the wrong shape, or with wrong types in the fields the
pages read. :func:`decode_spec` takes the bytes in one place: size bounded
(:data:`gridmarket.wire.MAX_SPEC_BYTES`), nesting depth counted *before* any parser sees them
(:data:`MAX_SPEC_DEPTH`), then parsed and checked against :class:`gridmarket.wire.JobSpec`
(the scheduler's schema, so the front end and the scheduler agree on which spec is invalid).
A view gets either the validated spec (every field of its type) or the reason it is invalid,
never an exception. :class:`SpecReader` fetches and caches the result by CID (content-addressed:
a spec's problem never changes; a fetch that failed is retried after a while).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gridmarket.ipfs import ContentTooLargeError, ContentVerificationError, IpfsStore
from gridmarket.wire import MAX_SPEC_BYTES, JobSpec

MAX_SPEC_DEPTH = 32
"""Arrays and objects nested deeper than this are refused before parsing (a valid spec nests 3
deep: ``spot``, ``resources.gpu_models``)."""
CACHE_MAX = 512
MISS_RETRY_S = 30.0
"""A spec that could not be fetched is not asked for again for this long."""
MAX_PROBLEM_CHARS = 300

_OPEN, _CLOSE, _QUOTE, _BACKSLASH = frozenset(b"[{"), frozenset(b"]}"), ord('"'), ord("\\")


@dataclass(frozen=True)
class SpecDoc:
    """What a view knows of a job's spec: ``spec`` (``JobSpec`` as JSON: every field present
    and of its type) when valid; ``problem`` (why the spec is invalid: it never will be valid)
    or ``missing`` (why it could not be fetched now) otherwise."""

    spec: dict[str, Any] | None = None
    problem: str | None = None
    missing: str | None = None


def nests_deeper_than(data: bytes, limit: int = MAX_SPEC_DEPTH) -> bool:
    """Whether arrays and objects nest more than ``limit`` deep in JSON text ``data`` (brackets
    inside strings not counted). One pass, no recursion, no backtracking: linear on any input,
    and it stops at the first bracket past ``limit``."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            if depth > limit:
                return True
        elif byte in _CLOSE:
            depth -= 1
    return False


def decode_spec(data: bytes) -> SpecDoc:
    """Spec bytes as a view may use them: the validated spec, or the problem."""
    if len(data) > MAX_SPEC_BYTES:
        return SpecDoc(problem=f"the spec is {len(data)} bytes, over the {MAX_SPEC_BYTES}-byte cap")
    if nests_deeper_than(data, MAX_SPEC_DEPTH):
        return SpecDoc(problem=f"the spec nests deeper than {MAX_SPEC_DEPTH} levels")
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return SpecDoc(problem=_clip(f"the spec is not JSON: {exc}"))
    return check_spec(value)


def check_spec(value: object) -> SpecDoc:
    """An already parsed spec (the scheduler's copy, or :func:`decode_spec`'s) checked against
    ``JobSpec``."""
    if not isinstance(value, dict):
        return SpecDoc(problem=f"the spec is a JSON {_kind(value)}, not an object")
    try:
        spec = JobSpec.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "spec"
        more = exc.error_count() - 1
        return SpecDoc(
            problem=_clip(
                f"the spec is invalid: {where}: {first.get('msg')}"
                + (f" (and {more} more)" if more else "")
            )
        )
    except (ValueError, TypeError, RecursionError) as exc:  # a validator's own error
        return SpecDoc(problem=_clip(f"the spec is invalid: {exc}"))
    return SpecDoc(spec=spec.model_dump(mode="json"))


def _kind(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_PROBLEM_CHARS else text[: MAX_PROBLEM_CHARS - 1] + "…"


class SpecReader:
    """Specs fetched from IPFS (integrity-checked against the CID, capped) and decoded, cached
    by CID: a decoded spec or its problem for good, a failed fetch for :data:`MISS_RETRY_S`."""

    def __init__(self, open_store: Callable[[], IpfsStore], timeout_s: float = 5.0) -> None:
        self._open = open_store
        self.timeout_s = timeout_s
        self._docs: dict[str, SpecDoc] = {}
        self._misses: dict[str, tuple[float, SpecDoc]] = {}
        self._lock = threading.Lock()

    def read(self, cid: str) -> SpecDoc:
        with self._lock:
            known = self._docs.get(cid)
            miss = self._misses.get(cid)
        if known is not None:
            return known
        if miss is not None and miss[0] > time.monotonic():
            return miss[1]  # failed a moment ago: do not make every page view wait again
        try:
            with self._open() as store:
                data = store.cat(cid, max_bytes=MAX_SPEC_BYTES, timeout_s=self.timeout_s)
        except ContentTooLargeError as exc:
            return self._keep(cid, SpecDoc(problem=_clip(f"the spec is too large: {exc}")))
        except ContentVerificationError as exc:
            return self._keep(cid, SpecDoc(problem=_clip(f"the spec is unusable: {exc}")))
        except (OSError, ValueError) as exc:
            doc = SpecDoc(missing=_clip(f"the spec could not be fetched from IPFS: {exc}"))
            with self._lock:
                if len(self._misses) >= CACHE_MAX:
                    self._misses.clear()
                self._misses[cid] = (time.monotonic() + MISS_RETRY_S, doc)
            return doc
        return self._keep(cid, decode_spec(data))

    def _keep(self, cid: str, doc: SpecDoc) -> SpecDoc:
        with self._lock:
            if len(self._docs) >= CACHE_MAX:
                self._docs.clear()
            self._docs[cid] = doc
            self._misses.pop(cid, None)
        return doc


def job_spec(reader: SpecReader, spec_cid: str | None, scheduler_view: object) -> SpecDoc:
    """A job's spec for its views: the scheduler's copy when it holds a valid one (no fetch),
    else the one at ``spec_cid`` on IPFS."""
    held = scheduler_view.get("spec") if isinstance(scheduler_view, dict) else None
    if held is not None:
        doc = check_spec(held)
        if doc.spec is not None:
            return doc
    if not spec_cid:
        return SpecDoc(missing="the job names no spec")
    return reader.read(spec_cid)
