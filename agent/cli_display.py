"""What ``gridmarket-agent`` shows: log lines (rich on a terminal, plain otherwise), the
``detect`` report (as JSON-ready data, ``key: value`` lines or a table), and live spinners for the
long steps of running jobs (:class:`RichSteps`)."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agent.config import AgentConfig, ConfigError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from agent.hardware import HardwareReport

log = logging.getLogger("agent")


def setup_logging(verbose: bool, *, default: int, console: Console | None = None) -> None:
    level = logging.DEBUG if verbose else default
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler: logging.Handler
    if console is not None:
        from rich.logging import RichHandler

        handler = RichHandler(
            console=console, show_path=False, rich_tracebacks=False, log_time_format="[%X]"
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "urllib3", "docker", "web3", "asyncio"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def detect_payload(config: AgentConfig) -> dict[str, Any]:
    from agent.capacity import gpu_offer, usable_executors
    from agent.hardware import detect_hardware

    report = detect_hardware(config.work_dir)
    payload: dict[str, Any] = report.to_dict()
    groups = report.gpu_groups
    payload["node_tier"] = groups[0].tier_key if groups else "cpu"
    payload["tier_guessed"] = any(g.tier.guessed for g in report.gpus)
    try:
        kinds, notes = usable_executors(config)
    except ConfigError as exc:
        kinds, notes = [], [str(exc)]
    payload["executors"] = sorted(str(k) for k in kinds)
    payload["executor_notes"] = notes
    offer, problem = gpu_offer(config, report, kinds)
    payload["gpu_offer"] = None if offer is None else offer.model_dump(mode="json")
    payload["gpu_jobs"] = problem or ("yes" if offer is not None else "no GPU detected")
    return payload


def gpu_jobs_note(config: AgentConfig, report: HardwareReport) -> str | None:
    """Why this machine's GPUs are not offered (``status``), or None: no GPUs, or offered.
    Asks the Docker engine (a ping, its runtimes) only when there are GPUs."""
    from agent.capacity import gpu_offer, usable_executors

    if not report.gpus:
        return None
    try:
        kinds, _ = usable_executors(config)
    except ConfigError:
        kinds = []
    return gpu_offer(config, report, kinds)[1]


def detect_lines(payload: dict[str, Any]) -> list[tuple[str, str]]:
    lines = []
    for gpu in payload["gpus"]:
        tier = gpu["tier"]
        flag = " (guessed from VRAM)" if tier.get("guessed") else ""
        lines.append(
            (
                f"gpu {gpu['index']}",
                f"{gpu['name']}, {gpu['vram_mib']} MiB, tier {tier['key']}{flag}, "
                f"driver {gpu['driver_version'] or '?'}, CUDA {gpu['cuda_version'] or '?'}, "
                f"compute {gpu['compute_capability'] or '?'}",
            )
        )
    if not payload["gpus"]:
        lines.append(("gpus", "none (CPU-only)"))
    lines += [
        ("gpu detection", payload["gpu_detection"]),
        ("gpu jobs", payload["gpu_jobs"]),
        ("node tier", payload["node_tier"]),
        (
            "cpu",
            f"{payload['cpu_model']} ({payload['cpu_physical_cores']} cores, "
            f"{payload['cpu_logical_cores']} threads)",
        ),
        ("ram", f"{payload['ram_mib']} MiB"),
        ("disk free", f"{payload['disk_free_mib']} MiB under {payload['work_dir']}"),
        ("executors", ", ".join(payload["executors"]) or "none"),
    ]
    lines += [("note", note) for note in payload["executor_notes"]]
    lines.append(("os", f"{payload['os']} {payload['arch']}"))
    return lines


def print_detect_table(payload: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="GridMarket node", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in detect_lines(payload):
        table.add_row(key, value)
    Console().print(table)


class RichSteps:
    """Live spinners for the long steps of running jobs; the display runs only while a step
    does (an idle agent refreshes nothing)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self._lock = threading.Lock()
        self._active = 0

    @contextlib.contextmanager
    def step(self, job_id: str, what: str) -> Iterator[None]:
        with self._lock:
            if self._active == 0:
                self.progress.start()
            self._active += 1
            task = self.progress.add_task(f"job {job_id[:10]}: {what}", total=None)
        started = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self.progress.remove_task(task)
                self._active -= 1
                if self._active == 0:
                    self.progress.stop()
            log.info("job %s: %s (%.1f s)", job_id[:10], what, time.monotonic() - started)
