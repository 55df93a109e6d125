"""DockerExecutor on a real dockerd: the happy path end to end, and clear errors before a start."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import docker
import pytest

from agent.errors import GpuUnavailableError, ImageNotFoundError, InvalidSpecError
from agent.executors import ExecutionSpec, Limits, OutputMode, Reason
from agent.executors.docker import LABEL, DockerExecutor
from agent.storage.ipfs import AgentIpfsStore
from gridmarket.cid import path_cid

SH = "/bin/sh"


def spec(image: str, script: str, **limits: object) -> ExecutionSpec:
    return ExecutionSpec(image=image, command=(SH, "-c", script), limits=Limits(**limits))  # type: ignore[arg-type]


def test_happy_path_input_to_output_to_ipfs(
    docker_executor: DockerExecutor,
    test_image: str,
    storage: AgentIpfsStore,
    tmp_path: Path,
) -> None:
    """Dataset from IPFS -> /input -> job -> /output -> IPFS, and the CID recomputes."""
    dataset = tmp_path / "dataset"
    (dataset / "parts").mkdir(parents=True)
    (dataset / "parts" / "a.txt").write_text("alpha\n")
    (dataset / "parts" / "b.txt").write_text("beta\n")
    dataset_cid = storage.add_dir(dataset)

    inp = tmp_path / "job" / "input"
    storage.fetch(dataset_cid, inp, max_bytes=1_000_000)
    script = (
        "set -e; cat /input/parts/*.txt | tr a-z A-Z > /output/upper.txt; "
        'mkdir /output/meta; id -u > /output/meta/uid; echo "$GREETING"; echo warn >&2'
    )
    job = ExecutionSpec(image=test_image, command=(SH, "-c", script), env={"GREETING": "hi there"})
    result = docker_executor.run(job, inp, tmp_path / "job" / "output")

    assert result.ok, result
    assert result.exit_code == 0 and result.reason is Reason.SUCCEEDED
    assert result.stdout == b"hi there\n" and result.stderr == b"warn\n"
    out = result.output_dir
    assert (out / "upper.txt").read_text() == "ALPHA\nBETA\n"
    assert (out / "meta" / "uid").read_text() == "65534\n"  # never root
    assert result.output_bytes == len("ALPHA\nBETA\n") + len("65534\n")
    assert result.output_files == 3

    output_cid = storage.add_dir(out)
    assert output_cid == path_cid(out)
    check = tmp_path / "verify"
    storage.fetch(output_cid, check, max_bytes=1000)  # what the scheduler will do
    assert (check / "upper.txt").read_text() == "ALPHA\nBETA\n"


def test_nonzero_exit(
    docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path]
) -> None:
    result = docker_executor.run(spec(test_image, "echo partial > /output/p; exit 3"), *job)
    assert result.reason is Reason.EXIT_CODE and result.exit_code == 3
    assert "exited with code 3" in result.message
    assert (result.output_dir / "p").read_text() == "partial\n"  # kept for debugging


def test_watch_mode_happy_path(
    docker_client: docker.DockerClient, test_image: str, job: tuple[Path, Path]
) -> None:
    executor = DockerExecutor(docker_client, output_mode=OutputMode.WATCH)
    result = executor.run(spec(test_image, "cp /input/data.txt /output/copy"), *job)
    assert result.ok, result
    assert (result.output_dir / "copy").read_text() == "hello gridmarket\n"


def test_missing_image_is_a_clear_error_not_a_pull(
    docker_executor: DockerExecutor, job: tuple[Path, Path]
) -> None:
    started = time.monotonic()
    with pytest.raises(ImageNotFoundError, match="never pulled"):
        docker_executor.run(ExecutionSpec(image="registry.example/none:1"), *job)
    assert time.monotonic() - started < 5


def test_gpu_request_without_gpu_is_a_clear_error(
    docker_executor: DockerExecutor,
    docker_client: docker.DockerClient,
    test_image: str,
    job: tuple[Path, Path],
) -> None:
    with pytest.raises(GpuUnavailableError, match="asks for 1 GPU"):
        docker_executor.run(spec(test_image, "true", gpus=1), *job)
    assert docker_client.containers.list(all=True, filters={"label": LABEL}) == []


def test_spec_validation(docker_executor: DockerExecutor, job: tuple[Path, Path]) -> None:
    with pytest.raises(InvalidSpecError):
        ExecutionSpec()
    with pytest.raises(InvalidSpecError):
        ExecutionSpec(image="x", module=Path("m.wasm"))
    with pytest.raises(InvalidSpecError):
        Limits(memory_bytes=0)
    with pytest.raises(InvalidSpecError, match="WASM module"):
        docker_executor.run(ExecutionSpec(module=Path("m.wasm")), *job)
    with pytest.raises(InvalidSpecError, match="root"):
        DockerExecutor(docker_executor.client, user="0:0")


def test_output_dir_must_be_empty(
    docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path]
) -> None:
    inp, out = job
    out.mkdir()
    (out / "stale").write_text("x")
    with pytest.raises(Exception, match="not empty"):
        docker_executor.run(spec(test_image, "true"), inp, out)


def test_cancel(docker_executor: DockerExecutor, test_image: str, job: tuple[Path, Path]) -> None:
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    result = docker_executor.run(spec(test_image, "sleep 30"), *job, cancel=cancel)
    assert result.reason is Reason.CANCELLED
    assert result.duration_s < 5


def test_no_input(docker_executor: DockerExecutor, test_image: str, tmp_path: Path) -> None:
    result = docker_executor.run(
        spec(test_image, '[ -z "$(ls -A /input)" ] && echo none > /output/x'), None, tmp_path / "o"
    )
    assert result.ok, result
