"""Live job logs on the wire: what an agent posts while a job runs, what readers get back.

An agent posts a running attempt's stdout/stderr as :class:`LogBatch` es to
:data:`NODE_LOGS` (node bearer token; only the node assigned that attempt), numbered by
``seq`` per attempt (a repost of the same ``seq`` is a no-op). Readers page through
:data:`JOB_LOGS` with ``?after=<id>``. The job's output is hostile: :func:`clean_text` makes any
bytes safe to store and to print on a terminal (UTF-8 with replacement, control characters
other than newline and tab escaped), and every size here is capped.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

__all__ = [
    "JOB_LOGS",
    "MAX_BATCH_CHARS",
    "MAX_CHUNKS",
    "MAX_TEXT",
    "NODE_LOGS",
    "LogBatch",
    "LogChunk",
    "clean_text",
    "split_lines",
]

NODE_LOGS = "/v1/nodes/{node_id}/jobs/{job_id}/logs"
"""POST: a node's :class:`LogBatch` of a running attempt."""
JOB_LOGS = "/v1/jobs/{job_id}/logs"
"""GET ``?after=<id>&limit=<n>``: the stored log lines of a job, every attempt, oldest first."""

MAX_CHUNKS = 64
"""Chunks in one batch."""
MAX_TEXT = 4096
"""Characters in one chunk (a run of whole lines, or a piece of a longer one)."""
MAX_BATCH_CHARS = 64 * 1024
"""Characters of text in one batch, all chunks together (the agent ships at most 16 KiB)."""

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_text(data: bytes | str) -> str:
    """``data`` as text safe to store and print: invalid UTF-8 replaced (U+FFFD), and control
    characters other than ``\\n`` and ``\\t`` (escape sequences, carriage returns, bells, NUL)
    written as ``\\xNN`` so that a log cannot drive the reader's terminal."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def split_lines(text: str) -> list[str]:
    """``text`` cut after each newline (kept); a last piece without one is kept too."""
    return _LINES.findall(text)


_LINES = re.compile(r"[^\n]*\n|[^\n]+")


class LogChunk(BaseModel):
    """A piece of one stream (whole lines, newlines kept, or a piece of a longer line),
    stamped by the agent when it read it. ``system`` chunks are the agent's own notes
    (``[log truncated: ...]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stream: Literal["stdout", "stderr", "system"]
    ts: float = Field(ge=0, lt=2**40)
    text: Annotated[str, StringConstraints(max_length=MAX_TEXT)]


class LogBatch(BaseModel):
    """Chunks of one attempt, in order; ``seq`` counts the attempt's batches from 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempt: int = Field(ge=1, lt=2**16)
    seq: int = Field(ge=0, lt=2**31)
    chunks: list[LogChunk] = Field(min_length=1, max_length=MAX_CHUNKS)

    def chars(self) -> int:
        return sum(len(c.text) for c in self.chunks)


LogStream = Literal["stdout", "stderr", "system"]
