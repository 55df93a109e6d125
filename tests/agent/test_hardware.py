"""Hardware detection (agent.hardware): the real path of this machine, and nvidia-smi parsing.

The NVML path runs for real wherever these tests run: on a GPU host it must list the GPUs, on a
host without the NVIDIA driver it must fail with NVML's own reason and let detection fall back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.errors import AgentError
from agent.hardware import (
    QUERY_FIELDS,
    GpuInfo,
    GpuProbeError,
    HardwareReport,
    NvidiaSmiProbe,
    NvmlProbe,
    RawGpu,
    detect_hardware,
    parse_cuda_version,
    parse_nvidia_smi_csv,
)

ROOT = Path(__file__).resolve().parents[2]

# Real `nvidia-smi --query-gpu=index,name,memory.total,uuid,driver_version,compute_cap
# --format=csv,noheader,nounits` outputs.
SMI_WORKSTATION = """\
0, NVIDIA GeForce RTX 4090, 24564, GPU-5b3e2d6c-8f0a-4b7e-9c51-2a6f8d4e1b3a, 550.54.14, 8.9
1, NVIDIA GeForce RTX 3090, 24576, GPU-0c9d7e42-3b1f-4a8e-b6d2-7e5f1a9c0d84, 550.54.14, 8.6
"""
SMI_DGX_H100 = "".join(
    f"{i}, NVIDIA H100 80GB HBM3, 81559, GPU-{i:08x}-1111-2222-3333-444455556666, 535.129.03, 9.0\n"
    for i in range(8)
)
# Drivers before 510 have no compute_cap field: the probe asks again without it.
SMI_OLD_DRIVER = "0, Tesla T4, 15109, GPU-7f5d1e0b-0a6a-0b6e-2d0b-6a37e6f2f3a5, 470.199.02\n"
SMI_OLD_DRIVER_ERROR = 'Field "compute_cap" is not a valid field to query.'
SMI_VGPU = "0, GRID A100D-40C, 40960, [N/A], 525.105.17, [Not Supported]\n"
SMI_BANNER = """\
Tue Mar 12 10:21:33 2024
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.14              Driver Version: 550.54.14      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
"""


# --------------------------------------------------------------------------- this machine
def test_detect_hardware_on_this_machine(tmp_path: Path) -> None:
    report = detect_hardware(tmp_path)
    assert report.cpu_logical_cores >= report.cpu_physical_cores >= 1
    assert report.ram_mib > 0
    assert report.disk_free_mib > 0
    assert report.work_dir == str(tmp_path)
    assert report.gpu_detection.startswith("nvml: ")
    if report.gpus:
        assert report.gpu_source in ("nvml", "nvidia-smi")
        assert all(g.vram_mib > 0 and g.tier.key for g in report.gpus)
    else:  # no NVIDIA driver here: CPU-only, and the note says why, probe by probe
        assert report.gpu_source == "none"
        assert "nvidia-smi: " in report.gpu_detection
        assert report.gpu_detection.endswith("reporting CPU-only")
        assert report.gpu_groups == ()


def test_nvml_probe_on_this_machine() -> None:
    try:
        gpus = NvmlProbe().probe()
    except GpuProbeError as exc:  # e.g. "NVML Shared Library Not Found (NVMLError_LibraryNotFound)"
        assert "NVMLError" in str(exc)
        assert isinstance(exc, AgentError)
    else:
        assert all(g.name and g.vram_mib > 0 for g in gpus)
        assert all(g.driver_version for g in gpus)


def test_nvidia_smi_probe_without_the_binary() -> None:
    with pytest.raises(GpuProbeError, match="not found on PATH"):
        NvidiaSmiProbe(binary="nvidia-smi-not-installed-here").probe()


def test_no_probe_means_cpu_only() -> None:
    report = detect_hardware(".", probes=[])
    assert report.gpus == () and report.gpu_source == "none"
    assert report.gpu_detection == "no GPU probe configured; reporting CPU-only"


def test_missing_work_dir_reports_the_disk_it_will_be_created_on(tmp_path: Path) -> None:
    report = detect_hardware(tmp_path / "not" / "yet")
    assert report.work_dir == str(tmp_path / "not" / "yet")
    assert report.disk_free_mib > 0


def test_module_entry_point_prints_the_report() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.hardware", "--work-dir", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    data = json.loads(done.stdout)
    assert data["cpu_logical_cores"] >= 1
    assert data["gpu_source"] in ("nvml", "nvidia-smi", "none")
    assert isinstance(data["gpus"], list)


# --------------------------------------------------------------------------- parsing
def test_parse_workstation() -> None:
    gpus = parse_nvidia_smi_csv(SMI_WORKSTATION, cuda_version="12.4")
    assert gpus == [
        RawGpu(
            0,
            "NVIDIA GeForce RTX 4090",
            24564,
            "GPU-5b3e2d6c-8f0a-4b7e-9c51-2a6f8d4e1b3a",
            "550.54.14",
            "12.4",
            "8.9",
        ),
        RawGpu(
            1,
            "NVIDIA GeForce RTX 3090",
            24576,
            "GPU-0c9d7e42-3b1f-4a8e-b6d2-7e5f1a9c0d84",
            "550.54.14",
            "12.4",
            "8.6",
        ),
    ]
    assert [GpuInfo.from_raw(g).tier.key for g in gpus] == ["rtx-4090", "rtx-3090"]


def test_parse_eight_h100() -> None:
    gpus = parse_nvidia_smi_csv(SMI_DGX_H100)
    assert [g.index for g in gpus] == list(range(8))
    assert {(g.name, g.vram_mib, g.compute_capability) for g in gpus} == {
        ("NVIDIA H100 80GB HBM3", 81559, "9.0")
    }
    assert len({g.uuid for g in gpus}) == 8


def test_parse_old_driver_without_compute_cap() -> None:
    fields = tuple(f for f in QUERY_FIELDS if f != "compute_cap")
    (gpu,) = parse_nvidia_smi_csv(SMI_OLD_DRIVER, fields)
    assert (gpu.name, gpu.vram_mib, gpu.compute_capability) == ("Tesla T4", 15109, None)
    assert GpuInfo.from_raw(gpu).tier.key == "t4"


def test_parse_not_available_fields_become_none() -> None:
    (gpu,) = parse_nvidia_smi_csv(SMI_VGPU)
    assert gpu.uuid is None and gpu.compute_capability is None
    tier = GpuInfo.from_raw(gpu).tier
    assert tier.guessed and tier.key == "unknown-40gb"  # a vGPU profile is no known card


def test_parse_accepts_units_and_blank_lines() -> None:
    text = "\n0, NVIDIA L4, 23034 MiB, GPU-1, 535.1, 8.9\n\n"
    assert parse_nvidia_smi_csv(text)[0].vram_mib == 23034


@pytest.mark.parametrize(
    "text",
    [
        "0, NVIDIA L4, 23034\n",  # too few columns
        "0, NVIDIA L4, lots, GPU-1, 535.1, 8.9\n",  # memory not a number
        "0, [N/A], 23034, GPU-1, 535.1, 8.9\n",  # no name
    ],
)
def test_parse_rejects_malformed_lines(text: str) -> None:
    with pytest.raises(ValueError, match="line 1"):
        parse_nvidia_smi_csv(text)


def test_parse_cuda_version() -> None:
    assert parse_cuda_version(SMI_BANNER) == "12.4"
    assert parse_cuda_version("no banner") is None


def test_nvidia_smi_probe_retries_without_compute_cap_on_old_drivers() -> None:
    calls: list[list[str]] = []

    def old_driver(argv: Sequence[str]) -> str:  # answers like a 470 driver's nvidia-smi
        calls.append(list(argv))
        if len(argv) == 1:
            return SMI_BANNER.replace("12.4", "11.4")
        if "compute_cap" in argv[1]:
            raise GpuProbeError(f"nvidia-smi exited with 2: {SMI_OLD_DRIVER_ERROR}")
        return SMI_OLD_DRIVER

    (gpu,) = NvidiaSmiProbe(runner=old_driver).probe()
    assert (gpu.name, gpu.cuda_version, gpu.compute_capability) == ("Tesla T4", "11.4", None)
    assert calls[0][1].endswith(",compute_cap") and "compute_cap" not in calls[1][1]


def test_report_groups_and_json() -> None:
    gpus = tuple(
        GpuInfo.from_raw(g) for g in parse_nvidia_smi_csv(SMI_WORKSTATION + SMI_WORKSTATION)
    )
    report = HardwareReport(
        gpus=gpus,
        gpu_source="nvidia-smi",
        gpu_detection="nvml: ...; nvidia-smi: 4 GPUs",
        cpu_physical_cores=16,
        cpu_logical_cores=32,
        cpu_model="AMD Ryzen 9 7950X",
        ram_mib=64_000,
        work_dir="/var/lib/gridmarket",
        disk_free_mib=900_000,
        os="linux",
        arch="x86_64",
    )
    assert [(g.tier_key, g.count) for g in report.gpu_groups] == [("rtx-3090", 2), ("rtx-4090", 2)]
    data = json.loads(report.to_json())
    assert data["gpus"][0]["tier"]["key"] == "rtx-4090"
    assert data["gpus"][0]["tier"]["price_multiplier"] == 3.0
