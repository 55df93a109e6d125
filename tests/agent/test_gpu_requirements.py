"""What the agent reports for CUDA jobs (issue 29, 6): the driver version, the highest CUDA
version the driver supports and each GPU's compute capability (NVML), the GPUs it offers, and
the NVIDIA runtime check of its Docker engine.

No GPU here. NVML is faked at the pynvml boundary only: :class:`FakeNvml` answers pynvml's
calls as a driver 550.54 with CUDA 12.4 (``12040``) and two GPUs of compute capability 8.6 and
7.5 would, and raises pynvml's own errors where a driver does. The runtime check asks the real
test dockerd (no NVIDIA runtime there), and a fake engine answering ``GET /info`` as one with
the NVIDIA Container Toolkit would.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from agent.capacity import gpu_offer, node_capacity, nvidia_runtime_problem
from agent.cli_display import detect_lines, detect_payload, gpu_jobs_note
from agent.config import AgentConfig, load_config
from agent.hardware import GpuProbeError, HardwareReport, NvmlProbe, detect_hardware
from devstack.dockerd import Dockerd
from gridmarket.wire import ExecutorKind

MIB = 1024 * 1024
DOCKER, WASM = ExecutorKind.DOCKER, ExecutorKind.WASM


class FakeNvml:
    """pynvml's calls, answered as a driver would; errors are pynvml's own classes."""

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        gpus: list[tuple[str, int, tuple[int, int] | None]],
        *,
        driver: str | bytes = "550.54",
        cuda: int | None = 12040,
        fail: dict[str, int] | None = None,
    ) -> None:
        self.gpus, self.driver, self.cuda = gpus, driver, cuda
        self.fail = fail or {}  # pynvml function name -> NVML_ERROR_* it raises
        self.shutdowns = 0

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail:
            raise pynvml.NVMLError(self.fail[name])

    def nvmlInit(self) -> None:
        self._maybe_fail("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._maybe_fail("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._maybe_fail("nvmlSystemGetCudaDriverVersion_v2")
        assert self.cuda is not None
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._maybe_fail("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.gpus[handle][0]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=self.gpus[handle][1] * MIB, free=0, used=0)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle:08x}-0000-0000-0000-000000000000"

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        capability = self.gpus[handle][2]
        if capability is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return capability


WORKSTATION = [("NVIDIA GeForce RTX 3090", 24576, (8, 6)), ("Tesla T4", 15360, (7, 5))]


def report_of(nvml: FakeNvml, work_dir: Path) -> HardwareReport:
    return detect_hardware(work_dir, probes=[NvmlProbe(nvml)])


class _Engine(BaseHTTPRequestHandler):
    info: dict[str, Any] = {}

    def do_GET(self) -> None:
        body = json.dumps(self.info if self.path.endswith("/info") else {}).encode()
        self.send_response(200 if self.path.endswith("/info") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def nvidia_engine() -> Iterator[str]:
    """A Docker engine API answering ``GET /info`` as one with the NVIDIA toolkit does."""
    handler = type("NvidiaEngine", (_Engine,), {})
    handler.info = {
        "Runtimes": {
            "io.containerd.runc.v2": {"path": "runc"},
            "nvidia": {"path": "nvidia-container-runtime"},
            "runc": {"path": "runc"},
        },
        "DefaultRuntime": "runc",
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def config(tmp_path: Path, docker_host: str) -> AgentConfig:
    return load_config(region="us", docker_host=docker_host, work_dir=tmp_path)


# --------------------------------------------------------------------------- NVML
def test_nvml_reports_driver_cuda_and_compute_capabilities(tmp_path: Path) -> None:
    nvml = FakeNvml(WORKSTATION, driver=b"550.54")  # old bindings answer bytes
    report = report_of(nvml, tmp_path)
    assert report.gpu_source == "nvml" and report.gpu_detection == "nvml: 2 GPUs"
    assert [g.driver_version for g in report.gpus] == ["550.54", "550.54"]
    assert [g.cuda_version for g in report.gpus] == ["12.4", "12.4"]
    assert [g.compute_capability for g in report.gpus] == ["8.6", "7.5"]
    assert nvml.shutdowns == 1
    shown = json.loads(report.to_json())["gpus"][1]
    assert (shown["cuda_version"], shown["compute_capability"]) == ("12.4", "7.5")


def test_what_nvml_will_not_say_is_unknown(tmp_path: Path) -> None:
    nvml = FakeNvml(
        [("NVIDIA A100-SXM4-40GB", 40960, None)],
        fail={"nvmlSystemGetCudaDriverVersion_v2": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND},
    )
    (gpu,) = report_of(nvml, tmp_path).gpus
    assert gpu.driver_version == "550.54"
    assert gpu.cuda_version is None and gpu.compute_capability is None


def test_nvml_failure_means_no_gpu_info_and_says_why(tmp_path: Path) -> None:
    nvml = FakeNvml(WORKSTATION, fail={"nvmlInit": pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
    with pytest.raises(GpuProbeError, match=r"^Driver Not Loaded \(NVMLError_DriverNotLoaded\)$"):
        NvmlProbe(nvml).probe()
    report = report_of(nvml, tmp_path)
    assert report.gpus == () and report.gpu_source == "none"
    assert report.gpu_detection == (
        "nvml: Driver Not Loaded (NVMLError_DriverNotLoaded); reporting CPU-only"
    )


def test_a_failed_nvml_query_says_so_and_shuts_nvml_down(tmp_path: Path) -> None:
    nvml = FakeNvml(WORKSTATION, fail={"nvmlDeviceGetCount": pynvml.NVML_ERROR_GPU_IS_LOST})
    report = report_of(nvml, tmp_path)
    assert report.gpus == ()
    assert report.gpu_detection.startswith("nvml: NVML query failed: GPU is lost")
    assert nvml.shutdowns == 1


# --------------------------------------------------------------------------- the offer
def test_the_offer_carries_the_driver_facts(tmp_path: Path, nvidia_engine: str) -> None:
    report = report_of(FakeNvml(WORKSTATION), tmp_path)
    offer, problem = gpu_offer(config(tmp_path, nvidia_engine), report, [DOCKER, WASM])
    assert problem is None and offer is not None
    # the largest group: one RTX 3090 (more VRAM than the T4); mixed models offer one
    assert (offer.model, offer.count, offer.vram_mib) == ("rtx-3090", 1, 24576)
    assert (offer.driver_version, offer.cuda_version, offer.compute_capability) == (
        "550.54",
        "12.4",
        "8.6",
    )


def test_a_group_offers_its_lowest_capability_and_unknown_stays_unknown(
    tmp_path: Path, nvidia_engine: str
) -> None:
    cards = [("Tesla T4", 15360, (7, 5)), ("Tesla T4", 15360, (7, 0))]
    offer, _ = gpu_offer(
        config(tmp_path, nvidia_engine), report_of(FakeNvml(cards), tmp_path), [DOCKER]
    )
    assert offer is not None and offer.count == 2 and offer.compute_capability == "7.0"
    cards = [("Tesla T4", 15360, (7, 5)), ("Tesla T4", 15360, None)]
    nvml = FakeNvml(
        cards, fail={"nvmlSystemGetCudaDriverVersion_v2": pynvml.NVML_ERROR_NOT_SUPPORTED}
    )
    offer, _ = gpu_offer(config(tmp_path, nvidia_engine), report_of(nvml, tmp_path), [DOCKER])
    assert offer is not None and offer.compute_capability is None and offer.cuda_version is None


def test_a_node_without_docker_offers_no_gpus(tmp_path: Path, nvidia_engine: str) -> None:
    report = report_of(FakeNvml(WORKSTATION), tmp_path)
    offer, problem = gpu_offer(config(tmp_path, nvidia_engine), report, [WASM])
    assert offer is None and problem is not None and "Docker" in problem


# --------------------------------------------------------------------------- runtime check
def test_the_test_engine_has_no_nvidia_runtime_and_says_so(dockerd: Dockerd) -> None:
    problem = nvidia_runtime_problem(dockerd.host)
    assert problem is not None
    assert problem.startswith(f"the Docker engine at {dockerd.host} has no NVIDIA runtime")
    assert "runc" in problem and "GPU jobs cannot run here" in problem
    assert "nvidia-ctk runtime configure --runtime=docker" in problem


def test_gpus_without_the_nvidia_runtime_are_not_offered(
    tmp_path: Path, dockerd: Dockerd, caplog: pytest.LogCaptureFixture
) -> None:
    report = report_of(FakeNvml(WORKSTATION), tmp_path)
    cfg = config(tmp_path, dockerd.host)
    offer, problem = gpu_offer(cfg, report, [DOCKER, WASM])
    assert offer is None and problem is not None and "no NVIDIA runtime" in problem
    with caplog.at_level(logging.WARNING, logger="agent.capacity"):
        capacity = node_capacity(cfg, report, [DOCKER, WASM], images=None)()
    assert capacity.gpu is None  # the scheduler is not offered GPU jobs it would fail
    assert any("offering no GPUs: the Docker engine" in r.getMessage() for r in caplog.records)


def test_the_nvidia_runtime_is_found(nvidia_engine: str) -> None:
    assert nvidia_runtime_problem(nvidia_engine) is None


def test_an_engine_that_does_not_answer(tmp_path: Path) -> None:
    problem = nvidia_runtime_problem(f"unix://{tmp_path}/no.sock")
    assert problem is not None and "did not say its runtimes" in problem


def test_a_cpu_only_node_has_nothing_to_check(tmp_path: Path) -> None:
    report = detect_hardware(tmp_path, probes=[])
    assert gpu_offer(config(tmp_path, f"unix://{tmp_path}/no.sock"), report, [DOCKER]) == (
        None,
        None,
    )


def test_detect_says_whether_gpu_jobs_can_run(tmp_path: Path) -> None:
    payload = detect_payload(config(tmp_path, f"unix://{tmp_path}/no.sock"))
    lines = dict(detect_lines(payload))
    if payload["gpus"]:  # a GPU host: no engine answers here, so no GPU jobs, and why
        assert payload["gpu_offer"] is None and "Docker" in lines["gpu jobs"]
    else:
        assert lines["gpu jobs"] == "no GPU detected" and payload["gpu_offer"] is None


def test_status_says_why_gpus_are_not_offered(tmp_path: Path, dockerd: Dockerd) -> None:
    report = report_of(FakeNvml(WORKSTATION), tmp_path)
    note = gpu_jobs_note(config(tmp_path, dockerd.host), report)
    assert note is not None and "has no NVIDIA runtime" in note
    cpu_only = detect_hardware(tmp_path, probes=[])
    assert gpu_jobs_note(config(tmp_path, dockerd.host), cpu_only) is None
