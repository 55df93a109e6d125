"""The executors run a job the same way on every node, so that a mediator's re-run of a
deterministic job gives the same output CID (docs/mediator.md): a real WASI module reading the
clocks, randomness and a NaN in wasmtime, and a real container reading its environment in
dockerd, each run twice."""

from __future__ import annotations

import struct
from pathlib import Path

from agent.executors import ExecutionSpec, Limits
from agent.executors.docker import DockerExecutor
from agent.executors.wasm import FIXED_EPOCH_NS, WasmExecutor
from gridmarket.cid import path_cid
from tests.agent import wat

# Writes to /output/world.bin: the wall clock, the monotonic clock (8 bytes each, read through
# clock_time_get), 16 bytes of random_get, the bits of 0/0 computed from memory (a NaN), the
# clock_res_get of the wall clock, and the errno clock_time_get gives an unknown clock.
WORLD = f"""
(module
  {wat._WASI}
  (import "wasi_snapshot_preview1" "clock_time_get"
    (func $clock_time_get (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_res_get"
    (func $clock_res_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random_get (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "world.bin")
  ;; /output is fd 4 (an input is given)
  ;; 64: fd; 72: iovec; 80: written; 256..304: the record; 512: 0.0f
  (func (export "_start") (local $zero f32)
    (if (call $clock_time_get (i32.const 0) (i64.const 1) (i32.const 256))
      (then (call $proc_exit (i32.const 1))))
    (if (call $clock_time_get (i32.const 1) (i64.const 1) (i32.const 264))
      (then (call $proc_exit (i32.const 2))))
    (if (call $random_get (i32.const 272) (i32.const 16))
      (then (call $proc_exit (i32.const 3))))
    (local.set $zero (f32.load (i32.const 512)))
    (i32.store (i32.const 288)
      (i32.reinterpret_f32 (f32.div (local.get $zero) (local.get $zero))))
    (if (call $clock_res_get (i32.const 0) (i32.const 292))
      (then (call $proc_exit (i32.const 4))))
    (i32.store (i32.const 300) (call $clock_time_get (i32.const 99) (i64.const 1) (i32.const 0)))
    (if (call $path_open (i32.const 4) (i32.const 0) (i32.const 16) (i32.const 9)
                         (i32.const 9) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 64))
      (then (call $proc_exit (i32.const 5))))
    (i32.store (i32.const 72) (i32.const 256))
    (i32.store (i32.const 76) (i32.const 48))
    (if (call $fd_write (i32.load (i32.const 64)) (i32.const 72) (i32.const 1) (i32.const 80))
      (then (call $proc_exit (i32.const 6))))
    (drop (call $fd_close (i32.load (i32.const 64))))))
"""


def test_wasm_runs_are_identical_clock_random_and_nan_fixed(
    wasm_executor: WasmExecutor, job: tuple[Path, Path], tmp_path: Path
) -> None:
    module = wat.build(WORLD, tmp_path / "world.wasm")
    outputs = []
    for n in range(2):
        result = wasm_executor.run(ExecutionSpec(module=module), job[0], tmp_path / f"out{n}")
        assert result.ok, result
        outputs.append(result.output_dir)
    first, second = ((o / "world.bin").read_bytes() for o in outputs)
    assert first == second and len(first) == 48
    assert path_cid(outputs[0]) == path_cid(outputs[1])
    wall, mono = struct.unpack_from("<QQ", first, 0)
    random = first[16:32]
    (nan,) = struct.unpack_from("<I", first, 32)
    res, errno = struct.unpack_from("<QI", first, 36)
    assert wall == FIXED_EPOCH_NS + 1000 and mono == 2000  # a fixed start, 1 us per read
    assert random != bytes(16)
    assert nan == 0x7FC00000  # the canonical NaN, whatever the CPU gives for 0/0
    assert res == 1000 and errno == 28  # EINVAL for a clock that does not exist


def test_docker_runs_with_a_fixed_environment(
    docker_executor: DockerExecutor, test_image: str, tmp_path: Path
) -> None:
    script = (
        'echo "$SOURCE_DATE_EPOCH $TZ $LANG $LC_ALL $PYTHONHASHSEED $OVERRIDE" > /output/env; '
        "hostname >> /output/env; ls /sys/class/net >> /output/env; date -u -d @0 >> /output/env"
    )
    outputs = []
    for n in range(2):
        spec = ExecutionSpec(
            image=test_image,
            command=("/bin/sh", "-c", script),
            env={"OVERRIDE": "mine", "TZ": "UTC"},
            limits=Limits(timeout_s=60),
        )
        result = docker_executor.run(spec, None, tmp_path / f"out{n}")
        assert result.ok, result
        outputs.append(result.output_dir)
    first = (outputs[0] / "env").read_text()
    assert first == (outputs[1] / "env").read_text()
    lines = first.splitlines()
    assert lines[0] == "315532800 UTC C.UTF-8 C.UTF-8 0 mine"
    assert lines[1] == "job"
    assert lines[2] == "lo"  # no network but loopback
    assert path_cid(outputs[0]) == path_cid(outputs[1])
