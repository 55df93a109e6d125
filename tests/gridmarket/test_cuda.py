"""``min_cuda`` / ``min_compute_capability`` in a job spec and the driver facts in a node's
capacity (gridmarket.cuda, gridmarket.wire): validated, bounded, and invisible while unset (a
spec's bytes and a registration's digest are those they had before the fields existed)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from pydantic import ValidationError

from gridmarket.cuda import as_version, cuda_from_nvml, parse_version
from gridmarket.wire import GpuGroup, JobSpec, NodeCapacityIn, capacity_digest


def spec(**resources: Any) -> JobSpec:
    doc = {"executor": "docker", "image": "busybox", "resources": {"gpu_count": 1, **resources}}
    return JobSpec.model_validate(doc)


def test_a_spec_may_require_cuda_and_compute_capability() -> None:
    s = spec(min_cuda="12.2", min_compute_capability="8.0")
    assert (s.resources.min_cuda, s.resources.min_compute_capability) == ("12.2", "8.0")
    body = json.loads(s.to_bytes())
    assert body["resources"]["min_cuda"] == "12.2"
    assert JobSpec.from_bytes(s.to_bytes()) == s


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        (
            "min_cuda",
            "12.x",
            "min_cuda\n  Value error, CUDA version must be major.minor like '12.2', not '12.x'",
        ),
        ("min_cuda", "999.0", "CUDA version '999.0' is out of range (major 1 to 29)"),
        ("min_cuda", "30.0", "CUDA version '30.0' is out of range (major 1 to 29)"),
        ("min_cuda", "0.9", "out of range"),
        ("min_cuda", "12", "major.minor"),
        ("min_cuda", "12.2.1", "major.minor"),
        ("min_compute_capability", "20.0", "compute capability '20.0' is out of range"),
        ("min_compute_capability", "sm_80", "compute capability must be major.minor"),
    ],
)
def test_bad_versions_are_refused_with_a_clear_error(field: str, value: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(**{field: value})
    assert words in str(caught.value)


def test_a_cpu_job_cannot_require_them() -> None:
    with pytest.raises(ValidationError, match="min_cuda and min_compute_capability need gpu_count"):
        JobSpec.model_validate(
            {"executor": "docker", "image": "busybox", "resources": {"min_cuda": "12.0"}}
        )


def test_an_unset_requirement_leaves_the_spec_bytes_as_they_were() -> None:
    body = json.loads(spec().to_bytes())
    assert "min_cuda" not in body["resources"]
    assert "min_compute_capability" not in body["resources"]


def test_versions() -> None:
    assert parse_version("12.10") > parse_version("12.9")
    assert cuda_from_nvml(12040) == "12.4" and cuda_from_nvml(11080) == "11.8"
    assert as_version(None) is None and as_version("8.6") == (8, 6)


def test_a_capacity_without_driver_facts_keeps_its_digest() -> None:
    gpu = GpuGroup(model="rtx-4090", name="NVIDIA GeForce RTX 4090", vram_mib=24564, count=1)
    cap = NodeCapacityIn(
        gpu=gpu, cpu_cores=8, ram_mib=8192, disk_mib=1000, region="us", executors=["docker"]
    )
    old = {  # the document an agent before these fields signed
        "cpu_cores": 8, "disk_mib": 1000, "executors": ["docker"], "price_floor_wei_per_hour": "0",
        "ram_mib": 8192, "region": "us", "slots": 1,
        "gpu": {
            "count": 1, "model": "rtx-4090", "name": "NVIDIA GeForce RTX 4090", "vram_mib": 24564
        },
    }  # fmt: skip
    old["price_floor_wei_per_hour"] = cap.model_dump(mode="json")["price_floor_wei_per_hour"]
    data = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    assert capacity_digest(cap) == hashlib.sha256(data).digest()
    told = cap.model_copy(update={"gpu": gpu.model_copy(update={"cuda_version": "12.4"})})
    assert capacity_digest(told) != capacity_digest(cap)


def test_a_node_cannot_report_nonsense() -> None:
    with pytest.raises(ValidationError, match="CUDA version"):
        GpuGroup(model="rtx-4090", vram_mib=1, count=1, cuda_version="twelve")
