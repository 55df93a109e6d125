"""Run a WASI module in-process with wasmtime: a sandbox that needs no daemon.

The module sees only what is handed to it: ``/input`` (preopened read-only) and ``/output``
(preopened writable, size-capped by :mod:`agent.executors._output`), its argv and environment.
No other host path, no sockets, no clock beyond WASI's. Limits:

- memory: the store refuses to grow any linear memory past ``Limits.memory_bytes``
  (``memory.grow`` returns -1; a module that then traps is reported ``OUT_OF_MEMORY``);
- time: an epoch deadline interrupts the module at ``Limits.timeout_s`` (a timer thread bumps the
  engine's epoch), and ``Limits.fuel``, when set, bounds the instructions executed;
- logs: stdout and stderr go to bounded in-memory tails, never to disk.

Each run has its own engine, so one run's deadline cannot interrupt another's. Preopened file
descriptors: 3 is ``/input`` (when there is an input), then ``/output``.

Runs are deterministic, so that two nodes give the same output and a mediator's re-run can judge
a result (docs/mediator.md): NaNs are canonicalised (``cranelift_nan_canonicalization``), relaxed
SIMD takes its deterministic form, threads and shared memory are off, and the WASI clocks and
randomness are replaced (:class:`_FixedWorld`): every clock reads a fixed start
(``SOURCE_DATE_EPOCH`` of the Docker executor, 1980-01-01 UTC, for the wall clock; zero for the
others) plus one microsecond per read, and ``random_get`` gives a fixed SHA-256 stream. What a
module can still tell apart between nodes: file timestamps under ``/input`` (``*_filestat_get``)
and how long ``poll_oneoff`` sleeps.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import wasmtime

from agent.errors import InvalidSpecError, WorkloadError
from agent.executors._output import OutputArea, OutputCheck, OutputMode
from agent.executors.base import ExecutionResult, ExecutionSpec, Limits, Reason, TailBuffer

log = logging.getLogger(__name__)

_PAGE = 65536
_WASI = "wasi_snapshot_preview1"
FIXED_EPOCH_NS = 315_532_800 * 10**9
"""What the WASI wall clock reads at a run's start (1980-01-01T00:00:00Z, the Docker executor's
``SOURCE_DATE_EPOCH``)."""
_TICK_NS = 1000  # each clock read moves every clock on by one microsecond
_RANDOM_SEED = b"gridmarket.wasm.random.v1"
# WASI errno values
_ESUCCESS, _EFAULT, _EINVAL = 0, 21, 28


class WasmExecutor:
    """Runs :class:`ExecutionSpec` with a ``module`` (a ``.wasm`` file, WASI preview 1)."""

    name = "wasm"

    def __init__(self, *, output_mode: OutputMode = OutputMode.AUTO) -> None:
        self.output_mode = output_mode

    def run(
        self,
        spec: ExecutionSpec,
        input_dir: Path | None,
        output_dir: Path,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecutionResult:
        if spec.module is None:
            raise InvalidSpecError("the WASM executor runs modules; this spec has a Docker image")
        if not spec.module.is_file():
            raise InvalidSpecError(f"WASM module {spec.module} does not exist")
        if input_dir is not None and not input_dir.is_dir():
            raise InvalidSpecError(f"input dir {input_dir} does not exist")
        limits = spec.limits
        if limits.gpus:
            raise InvalidSpecError("WASM jobs cannot use GPUs: use a Docker image")
        config = wasmtime.Config()
        config.epoch_interruption = True
        # deterministic: the same module and input give the same bytes on every node
        config.cranelift_nan_canonicalization = True
        config.wasm_relaxed_simd_deterministic = True
        config.wasm_threads = False
        config.shared_memory = False
        config.consume_fuel = limits.fuel is not None
        engine = wasmtime.Engine(config)
        try:
            module = wasmtime.Module.from_file(engine, str(spec.module))
        except wasmtime.WasmtimeError as exc:
            raise WorkloadError(f"{spec.module.name} is not a valid WASM module: {exc}") from exc
        with OutputArea(
            output_dir, limits.output_bytes, limits.output_files, mode=self.output_mode
        ) as area:
            return _Run(spec, engine, module, area, input_dir, cancel).execute()


class _Run:
    """One execution: store, WASI context, interrupts; separate so ``run`` reads top-down."""

    def __init__(
        self,
        spec: ExecutionSpec,
        engine: wasmtime.Engine,
        module: wasmtime.Module,
        area: OutputArea,
        input_dir: Path | None,
        cancel: threading.Event | None,
    ) -> None:
        self.spec, self.limits = spec, spec.limits
        self.engine, self.module, self.area = engine, module, area
        self.input_dir, self.cancel = input_dir, cancel
        self.stdout = TailBuffer(self.limits.log_bytes)
        self.stderr = TailBuffer(self.limits.log_bytes)
        self.interrupted: str | None = None  # "timeout" | "cancel" | "output"
        self._lock = threading.Lock()
        self._done = threading.Event()

    def _interrupt(self, why: str) -> None:
        with self._lock:
            if self.interrupted is None and not self._done.is_set():
                self.interrupted = why
                self.engine.increment_epoch()  # traps the store at its next epoch check

    def _store(self) -> wasmtime.Store:
        store = wasmtime.Store(self.engine)
        store.set_limits(memory_size=self.limits.memory_bytes, instances=1, tables=8, memories=4)
        store.set_epoch_deadline(1)
        if self.limits.fuel is not None:
            store.set_fuel(self.limits.fuel)
        wasi = wasmtime.WasiConfig()
        wasi.argv = [self.spec.module.name if self.spec.module else "main", *self.spec.command]
        wasi.env = [[k, v] for k, v in self.spec.env.items()]
        if self.input_dir is not None:
            wasi.preopen_dir(str(self.input_dir.resolve()), "/input", False)  # read-only
        wasi.preopen_dir(str(self.area.mount_source), "/output", True)
        wasi.stdout_custom = self._writer("stdout", self.stdout)
        wasi.stderr_custom = self._writer("stderr", self.stderr)
        store.set_wasi(wasi)
        return store

    def _writer(self, stream: str, tail: TailBuffer) -> Callable[[bytes], None]:
        """``tail.write``, and the spec's live-log sink (agent.logship) when it has one."""
        sink = self.spec.on_output
        if sink is None:
            return tail.write

        def write(data: bytes) -> None:
            tail.write(data)
            try:
                sink(stream, bytes(data))
            except Exception as exc:  # live logs are best effort: the tails are kept
                log.debug("live log sink failed: %s", exc)

        return write

    def _watch_cancel(self) -> None:
        cancel = self.cancel
        if cancel is None:
            return

        def loop() -> None:
            while not self._done.wait(0.1):
                if cancel.is_set():
                    self._interrupt("cancel")
                    return

        threading.Thread(target=loop, name="wasm-cancel", daemon=True).start()

    def execute(self) -> ExecutionResult:
        store = self._store()
        linker = wasmtime.Linker(self.engine)
        linker.define_wasi()
        _FixedWorld().define(linker)
        exit_code: int | None = None
        trap: wasmtime.WasmtimeError | wasmtime.Trap | None = None
        instance: wasmtime.Instance | None = None
        started = time.monotonic()
        timer = threading.Timer(self.limits.timeout_s, self._interrupt, ("timeout",))
        timer.daemon = True
        try:
            try:
                instance = linker.instantiate(store, self.module)
            except wasmtime.WasmtimeError as exc:
                if "memory" in str(exc) and "limit" in str(exc):
                    trap = exc  # its declared memory alone is over the limit
                else:
                    raise WorkloadError(f"cannot instantiate the module: {exc}") from exc
            if instance is not None:
                entry = instance.exports(store).get(self.spec.entrypoint)
                if not isinstance(entry, wasmtime.Func):
                    raise WorkloadError(f"the module exports no function {self.spec.entrypoint!r}")
                timer.start()
                self._watch_cancel()
                self.area.watch(lambda: self._interrupt("output"))
                try:
                    entry(store)
                    exit_code = 0
                except wasmtime.ExitTrap as exc:  # proc_exit(code)
                    exit_code = exc.code
                except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:  # or a WASI host error
                    trap = exc
        finally:
            with self._lock:
                self._done.set()
            timer.cancel()
            duration = time.monotonic() - started
            memory_full = instance is not None and _memory_full(instance, store, self.limits)
            del instance
            store.close()  # drops the WASI context: its preopened directory handles close
        check = self.area.finish()
        reason, message = self._verdict(exit_code, trap, memory_full, check)
        log.info("wasm %s: %s (%s) in %.2f s", self.spec.module, reason, message, duration)
        return ExecutionResult(
            reason=reason,
            message=message,
            exit_code=exit_code,
            duration_s=duration,
            output_dir=self.area.output_dir,
            output_bytes=check.bytes if check.problem is None else 0,
            output_files=check.files if check.problem is None else 0,
            stdout=self.stdout.value(),
            stderr=self.stderr.value(),
            logs_truncated=self.stdout.truncated or self.stderr.truncated,
            timed_out=reason is Reason.TIMEOUT,
            oom_killed=reason is Reason.OUT_OF_MEMORY,
        )

    def _verdict(
        self,
        exit_code: int | None,
        trap: wasmtime.WasmtimeError | wasmtime.Trap | None,
        memory_full: bool,
        check: OutputCheck,
    ) -> tuple[Reason, str]:
        limits = self.limits
        code = trap.trap_code if isinstance(trap, wasmtime.Trap) else None
        if self.interrupted == "cancel":
            return Reason.CANCELLED, "cancelled by the agent"
        if self.interrupted == "timeout":
            return Reason.TIMEOUT, f"interrupted at the time limit of {limits.timeout_s:g} s"
        if code is wasmtime.TrapCode.OUT_OF_FUEL:
            return Reason.TIMEOUT, f"ran out of fuel ({limits.fuel} units)"
        if check.problem is Reason.OUTPUT_TOO_LARGE:
            return Reason.OUTPUT_TOO_LARGE, check.message
        if trap is not None and (memory_full or (code is None and "memory" in str(trap))):
            return (
                Reason.OUT_OF_MEMORY,
                f"trapped at the memory limit of {limits.memory_bytes} bytes: {_first_line(trap)}",
            )
        if trap is not None:
            return Reason.TRAPPED, f"trapped: {_first_line(trap)}"
        if exit_code:
            return Reason.EXIT_CODE, f"exited with code {exit_code}"
        if check.problem is not None:
            return check.problem, check.message
        return Reason.SUCCEEDED, f"exited with code 0; {check.bytes} bytes of output"


class _FixedWorld:
    """WASI's clocks and randomness, the same on every node: replaces ``clock_time_get``,
    ``clock_res_get`` and ``random_get`` in a linker that already has WASI defined."""

    def __init__(self) -> None:
        self.reads = 0
        self._block = 0
        self._pool = b""

    def define(self, linker: wasmtime.Linker) -> None:
        i32, i64 = wasmtime.ValType.i32(), wasmtime.ValType.i64()
        linker.allow_shadowing = True
        linker.define_func(
            _WASI,
            "clock_time_get",
            wasmtime.FuncType([i32, i64, i32], [i32]),
            self.clock_time_get,
            access_caller=True,
        )
        linker.define_func(
            _WASI,
            "clock_res_get",
            wasmtime.FuncType([i32, i32], [i32]),
            self.clock_res_get,
            access_caller=True,
        )
        linker.define_func(
            _WASI,
            "random_get",
            wasmtime.FuncType([i32, i32], [i32]),
            self.random_get,
            access_caller=True,
        )
        linker.allow_shadowing = False

    def clock_time_get(self, caller: wasmtime.Caller, clock: int, _precision: int, at: int) -> int:
        if clock not in (0, 1, 2, 3):  # realtime, monotonic, process and thread CPU time
            return _EINVAL
        self.reads += 1
        now = self.reads * _TICK_NS + (FIXED_EPOCH_NS if clock == 0 else 0)
        return _write(caller, at, now.to_bytes(8, "little"))

    def clock_res_get(self, caller: wasmtime.Caller, clock: int, at: int) -> int:
        if clock not in (0, 1, 2, 3):
            return _EINVAL
        return _write(caller, at, _TICK_NS.to_bytes(8, "little"))

    def random_get(self, caller: wasmtime.Caller, at: int, length: int) -> int:
        length &= 0xFFFFFFFF
        if length > 1 << 20:
            return _EINVAL
        while len(self._pool) < length:
            self._pool += hashlib.sha256(_RANDOM_SEED + self._block.to_bytes(8, "big")).digest()
            self._block += 1
        data, self._pool = self._pool[:length], self._pool[length:]
        return _write(caller, at, data)


def _write(caller: wasmtime.Caller, at: int, data: bytes) -> int:
    """Write into the calling module's exported ``memory``; a WASI errno."""
    memory: Any = caller.get("memory")
    if not isinstance(memory, wasmtime.Memory):
        return _EFAULT
    at &= 0xFFFFFFFF  # an i32 pointer arrives signed
    if at + len(data) > memory.data_len(caller):
        return _EFAULT
    memory.write(caller, data, at)
    return _ESUCCESS


def _memory_full(instance: wasmtime.Instance, store: wasmtime.Store, limits: Limits) -> bool:
    """True when an exported memory is close to the limit: a trap then is most likely an
    allocator giving up after ``memory.grow`` was refused (wasmtime returns -1, it cannot tell
    us). "Close" is within an eighth of the limit: allocators grow in chunks."""
    margin = max(_PAGE, limits.memory_bytes // 8)
    for export in instance.exports(store).values():
        if isinstance(export, wasmtime.Memory) and (
            export.data_len(store) + margin > limits.memory_bytes
        ):
            return True
    return False


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
