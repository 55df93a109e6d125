"""Small builders for matching tests: a node or a job that passes every gate unless told."""

from __future__ import annotations

from typing import Any

from gridmarket.tiers import TIERS
from scheduler.matching import ExecutorKind, GpuSpec, JobRequirements, NodeCapacity

GIB = 1024
REPORTED_VRAM = {"rtx-4090": 24564, "rtx-3090": 24576, "rtx-4070": 12282, "rtx-3060": 12288}


def gpus(model: str, count: int = 1, vram_mib: int | None = None) -> GpuSpec:
    vram = vram_mib if vram_mib is not None else REPORTED_VRAM.get(model, TIERS[model].vram_mib)
    return GpuSpec.from_tier(TIERS[model], vram_mib=vram, count=count)


def node(node_id: str, model: str | None = "rtx-4090", count: int = 1, **kw: Any) -> NodeCapacity:
    fields: dict[str, Any] = {
        "node_id": node_id,
        "region": "us",
        "price_floor_wei_per_hour": 100,
        "cpu_cores": 8,
        "ram_mib": 32 * GIB,
        "disk_mib": 500 * GIB,
        "gpu": None if model is None else gpus(model, count),
        "executors": frozenset({ExecutorKind.DOCKER, ExecutorKind.WASM}),
        "slots": 1,
        "reputation": 0.9,
    }
    fields.update(kw)
    return NodeCapacity(**fields)


def job(job_id: str = "job", gpu_count: int = 1, **kw: Any) -> JobRequirements:
    fields: dict[str, Any] = {
        "job_id": job_id,
        "gpu_count": gpu_count,
        "min_vram_mib": 8 * GIB if gpu_count else 0,
        "cpu_cores": 4,
        "ram_mib": 8 * GIB,
        "disk_mib": 10 * GIB,
        "max_price_wei_per_hour": 1000,
    }
    fields.update(kw)
    return JobRequirements(**fields)
