"""CUDA versions and compute capabilities as the wire carries them: ``"major.minor"`` text.

A job spec may require a minimum CUDA version (``JobResources.min_cuda``, e.g. ``"12.2"``: the
highest CUDA the node's driver supports must be at least that) and a minimum compute capability
(``JobResources.min_compute_capability``, e.g. ``"8.0"``); a node reports both for its GPUs
(``GpuGroup.cuda_version``, ``GpuGroup.compute_capability``). Both are compared as
``(major, minor)`` integers (``"12.10"`` is above ``"12.9"``), never as text.

The bounds keep nonsense out (``"12.x"``, ``"999.0"``): a CUDA major version is 1 to
:data:`CUDA_MAJOR_MAX`, a compute capability's 1 to :data:`CC_MAJOR_MAX`, minors 0 to 99 (NVML's
integer encoding, ``12040`` -> ``"12.4"``, has room for two digits).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

__all__ = [
    "CC_MAJOR_MAX",
    "CUDA_MAJOR_MAX",
    "ComputeCapability",
    "CudaVersion",
    "Version",
    "as_version",
    "cuda_from_nvml",
    "parse_version",
    "version_text",
]

Version = tuple[int, int]
"""``(major, minor)``."""

CUDA_MAJOR_MAX = 29
"""Highest CUDA major version accepted (CUDA 13 is current in 2026; room for years)."""
CC_MAJOR_MAX = 19
"""Highest compute capability major accepted (Blackwell is 10.x and 12.x)."""

_VERSION = re.compile(r"^(\d{1,4})\.(\d{1,2})$")


def parse_version(
    text: str, *, what: str = "CUDA version", major_max: int = CUDA_MAJOR_MAX
) -> Version:
    """``"12.2"`` -> ``(12, 2)``; ValueError naming ``what`` and the value otherwise."""
    found = _VERSION.match(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"{what} must be major.minor like '12.2', not {text!r}")
    major, minor = int(found.group(1)), int(found.group(2))
    if not 1 <= major <= major_max:
        raise ValueError(f"{what} {text!r} is out of range (major 1 to {major_max})")
    return major, minor


def as_version(text: str | None) -> Version | None:
    """A value the wire has validated (:data:`CudaVersion`, :data:`ComputeCapability`) as
    ``(major, minor)``; None stays None (unknown)."""
    return None if text is None else parse_version(text, major_max=99)


def version_text(version: Version) -> str:
    """``(12, 2)`` -> ``"12.2"``."""
    return f"{version[0]}.{version[1]}"


def cuda_from_nvml(value: int) -> str:
    """NVML's ``nvmlSystemGetCudaDriverVersion_v2`` integer, ``12040`` -> ``"12.4"``."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _cuda(value: str) -> str:
    parse_version(value)
    return value


def _capability(value: str) -> str:
    parse_version(value, what="compute capability", major_max=CC_MAJOR_MAX)
    return value


CudaVersion = Annotated[str, AfterValidator(_cuda)]
"""A CUDA version, ``"12.2"``: major 1 to :data:`CUDA_MAJOR_MAX`, minor 0 to 99."""
ComputeCapability = Annotated[str, AfterValidator(_capability)]
"""A compute capability, ``"8.6"``: major 1 to :data:`CC_MAJOR_MAX`, minor 0 to 99."""
