"""Sandboxed execution of jobs: the :class:`Executor` protocol and its Docker and WASM adapters.

- :mod:`agent.executors.base`: ``ExecutionSpec``, ``Limits``, ``ExecutionResult``, ``Reason``,
  the ``Executor`` protocol, capped log tails.
- :mod:`agent.executors.docker`: ``DockerExecutor`` (no network, read-only root, non-root, no
  capabilities, resource limits, GPUs on request; labels its containers so that an agent's
  start removes what its crashed run left).
- :mod:`agent.executors.wasm`: ``WasmExecutor`` (wasmtime/WASI, preopened dirs, fuel and time).
- :mod:`agent.executors._output`: the output area and its caps, shared by both.

The adapters are imported explicitly, so importing this package needs neither the docker SDK
nor wasmtime.
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
