"""Sandboxed execution of jobs: the :class:`Executor` protocol and its Docker and WASM adapters.

The adapters live in :mod:`agent.executors.docker` and :mod:`agent.executors.wasm` and are
imported explicitly, so importing this package needs neither the docker SDK nor wasmtime.
"""

from agent.executors._output import OutputMode
from agent.executors.base import (
    ExecutionResult,
    ExecutionSpec,
    Executor,
    Limits,
    Reason,
)

__all__ = ["ExecutionResult", "ExecutionSpec", "Executor", "Limits", "OutputMode", "Reason"]
