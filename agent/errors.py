"""The agent's exceptions: one tree, rooted at :class:`AgentError`.

Each also inherits the builtin it resembles, so callers may catch either. Messages say what to do.

    AgentError
    ├── CliError                            a command line problem, reported in one line
    ├── StorageError (OSError)              IPFS unreachable, add/cat failed
    │   ├── DatasetTooLargeError (ValueError)   a dataset above the job's byte cap
    │   └── DatasetVerificationError (ValueError)   bytes that do not hash back to the CID
    └── ExecutorError (RuntimeError)        the engine failed, not the job
        ├── InvalidSpecError (ValueError)       a spec this executor cannot run
        ├── ImageNotFoundError (LookupError)    image absent locally (never pulled)
        ├── WorkloadError (ValueError)          a WASM module that does not compile or link
        └── GpuUnavailableError                 GPUs requested, none the engine can give

A job that starts and then fails (exit code, timeout, OOM, output cap) is no exception: it is an
:class:`agent.executors.ExecutionResult` with a ``reason``.
"""

from __future__ import annotations

from gridmarket.ipfs import ContentTooLargeError, ContentVerificationError, IpfsError


class AgentError(Exception):
    """Base of every error raised by the agent."""


class CliError(AgentError):
    """A problem to report in one line (exit status 1)."""


class StorageError(AgentError, IpfsError):
    """The content store (IPFS) failed or refused an operation."""


class DatasetTooLargeError(StorageError, ContentTooLargeError):
    """A dataset is larger than the byte cap the job allows."""


class DatasetVerificationError(StorageError, ContentVerificationError):
    """Fetched bytes do not hash back to the requested CID (tampered, or built unusually)."""


class ExecutorError(AgentError, RuntimeError):
    """The execution engine could not run a job (the job itself did not fail)."""


class InvalidSpecError(ExecutorError, ValueError):
    """The execution spec is incomplete or inconsistent for this executor."""


class ImageNotFoundError(ExecutorError, LookupError):
    """The Docker image is not present locally; images are never pulled."""


class WorkloadError(ExecutorError, ValueError):
    """The workload (a WASM module) is invalid: it does not compile or cannot be linked."""


class GpuUnavailableError(ExecutorError):
    """The job asks for GPUs and the engine cannot provide them."""
