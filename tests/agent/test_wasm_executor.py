"""WasmExecutor: a real WASI module reads /input and writes /output; hostile modules are stopped."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agent.errors import InvalidSpecError, WorkloadError
from agent.executors import ExecutionResult, ExecutionSpec, Limits, OutputMode, Reason
from agent.executors.wasm import WasmExecutor
from agent.storage.ipfs import AgentIpfsStore
from gridmarket.cid import path_cid
from tests.agent import wat

MiB = 1024 * 1024


def run(
    executor: WasmExecutor, source: str, job: tuple[Path, Path], **limits: object
) -> ExecutionResult:
    module = wat.build(source, job[0].parent / "module.wasm")
    return executor.run(ExecutionSpec(module=module, limits=Limits(**limits)), *job)  # type: ignore[arg-type]


def test_happy_path(
    wasm_executor: WasmExecutor, job: tuple[Path, Path], storage: AgentIpfsStore
) -> None:
    result = run(wasm_executor, wat.UPPERCASE, job)
    assert result.ok, result
    assert result.exit_code == 0 and result.stdout == b"ok\n"
    assert (result.output_dir / "upper.txt").read_text() == "HELLO GRIDMARKET\n"
    assert result.output_bytes == len("HELLO GRIDMARKET\n") and result.output_files == 1
    assert storage.add_dir(result.output_dir) == path_cid(result.output_dir)


def test_watch_mode_happy_path(job: tuple[Path, Path]) -> None:
    result = run(WasmExecutor(output_mode=OutputMode.WATCH), wat.UPPERCASE, job)
    assert result.ok, result
    assert (result.output_dir / "upper.txt").read_text() == "HELLO GRIDMARKET\n"


def test_missing_input_file_is_an_exit_code(
    wasm_executor: WasmExecutor, job: tuple[Path, Path]
) -> None:
    (job[0] / "data.txt").unlink()
    result = run(wasm_executor, wat.UPPERCASE, job)
    assert result.reason is Reason.EXIT_CODE and result.exit_code == 10


def test_infinite_loop_hits_the_deadline(
    wasm_executor: WasmExecutor, job: tuple[Path, Path]
) -> None:
    result = run(wasm_executor, wat.INFINITE_LOOP, job, timeout_s=0.5)
    assert result.reason is Reason.TIMEOUT and result.timed_out
    assert 0.4 < result.duration_s < 5


def test_infinite_loop_runs_out_of_fuel(
    wasm_executor: WasmExecutor, job: tuple[Path, Path]
) -> None:
    result = run(wasm_executor, wat.INFINITE_LOOP, job, fuel=5_000_000, timeout_s=30)
    assert result.reason is Reason.TIMEOUT and "fuel" in result.message
    assert result.duration_s < 5


def test_memory_growth_stops_at_the_limit(
    wasm_executor: WasmExecutor, job: tuple[Path, Path]
) -> None:
    result = run(wasm_executor, wat.MEMORY_BOMB, job, memory_bytes=64 * MiB)
    assert result.reason is Reason.OUT_OF_MEMORY, result
    assert result.oom_killed


def test_declared_memory_over_the_limit(
    wasm_executor: WasmExecutor, job: tuple[Path, Path]
) -> None:
    result = run(wasm_executor, wat.HUGE_MEMORY, job, memory_bytes=64 * MiB)
    assert result.reason is Reason.OUT_OF_MEMORY, result


def test_path_escapes_are_refused(
    wasm_executor: WasmExecutor, job: tuple[Path, Path], tmp_path: Path
) -> None:
    inp, _ = job
    (inp / "leak").symlink_to("/etc/hostname")  # a symlink planted in the input
    before = (inp / "data.txt").read_bytes()
    result = run(wasm_executor, wat.ESCAPE, job)
    assert result.ok, result
    assert result.stdout == b"......", "X marks a path_open that escaped"
    assert not (tmp_path / "escaped.txt").exists()
    assert (inp / "data.txt").read_bytes() == before
    assert sorted(p.name for p in inp.iterdir()) == ["data.txt", "leak"]


@pytest.mark.parametrize("mode", [OutputMode.LOOP, OutputMode.WATCH])
def test_disk_fill(job: tuple[Path, Path], mode: OutputMode) -> None:
    result = run(WasmExecutor(output_mode=mode), wat.DISK_FILL, job, output_bytes=4 * MiB)
    assert result.reason is Reason.OUTPUT_TOO_LARGE, result
    assert list(result.output_dir.iterdir()) == []


def test_cancel(wasm_executor: WasmExecutor, job: tuple[Path, Path]) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    module = wat.build(wat.INFINITE_LOOP, job[0].parent / "loop.wasm")
    started = time.monotonic()
    result = wasm_executor.run(ExecutionSpec(module=module), *job, cancel=cancel)
    assert result.reason is Reason.CANCELLED
    assert time.monotonic() - started < 5


def test_bad_modules_are_clear_errors(wasm_executor: WasmExecutor, job: tuple[Path, Path]) -> None:
    garbage = job[0].parent / "garbage.wasm"
    garbage.write_bytes(b"\0asm not really")
    with pytest.raises(WorkloadError, match="not a valid WASM module"):
        wasm_executor.run(ExecutionSpec(module=garbage), *job)
    no_start = wat.build("(module)", job[0].parent / "empty.wasm")
    with pytest.raises(WorkloadError, match="_start"):
        wasm_executor.run(ExecutionSpec(module=no_start), *job)
    foreign = wat.build('(module (import "env" "f" (func)))', job[0].parent / "foreign.wasm")
    with pytest.raises(WorkloadError, match="instantiate"):
        wasm_executor.run(ExecutionSpec(module=foreign), *job)
    with pytest.raises(InvalidSpecError, match="GPU"):
        wasm_executor.run(ExecutionSpec(module=no_start, limits=Limits(gpus=1)), *job)
    with pytest.raises(InvalidSpecError, match="Docker image"):
        wasm_executor.run(ExecutionSpec(image="x"), *job)
