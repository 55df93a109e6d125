"""Soak and chaos on loopback: a grid under steady submissions and hostile clients, with its
parts killed and paused, for a bounded time. Nothing leaves 127.0.0.1.

    .venv/bin/python bench/soak.py            # --duration 120 --agents 2 --work .run/soak

Starts the grid of ``make demo`` (:func:`devstack.grid.run_grid`: anvil + escrow,
js-ipfs, a scheduler process, agent processes with their own wallets, the front end). Then, for
``--duration`` seconds:

* **honest load**: one WASM job funded every ``--interval`` seconds (the demo's csvstats module);
* **slow clients at the front end** (``--loris N --sse M``, off by default): bench/slow_clients.py's
  attacker, from ``--attack-addresses`` loopback sources, while the probes below run;
* **hostile clients**: 4 MB JSON arrays to ``POST /v1/quote`` and ``/api/quote``, ``NaN`` and
  lone surrogates to ``/v1/nodes/register``, slow clients that trickle request headers a byte a
  second, job streams opened and never read, jobs funded with specs nobody has, and poison
  events (``createJob`` whose ``specCid`` is not UTF-8, ``registerProvider`` likewise);
* **chaos**, at fixed points of the run: an agent SIGKILLed and restarted, the scheduler
  SIGKILLed and restarted, IPFS stopped for a few seconds, the chain (anvil) stopped and
  restarted from its state file.

Then submissions stop and every honest job gets ``--drain`` seconds to settle. Reported: jobs
funded, paid, refunded, lost (neither, after the drain: goal 0), paid twice (more than one
``JobReleased``: goal 0), hostile requests and their answers, and the p50/p99/max of
``GET /v1/info`` (scheduler) and ``GET /api/info`` (front end) measured every 50 ms throughout,
outside the windows where that process was deliberately down (goal p99 < 250 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devstack.grid import LocalGrid, run_grid, wait_nodes  # noqa: E402
from gridmarket.cid import bytes_cid  # noqa: E402
from gridmarket.escrow import Status  # noqa: E402
from tests.e2e.support import Funded, add_inputs, chain_now, fund, wasm_spec  # noqa: E402
from tests.hostile import INVALID_UTF8, create_job_raw, escrow_call  # noqa: E402


@dataclass
class Probe:
    """Latencies of one honest endpoint, and the windows when its process was down on purpose."""

    url: str
    samples: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds)
    errors: list[float] = field(default_factory=list)
    down: list[tuple[float, float]] = field(default_factory=list)

    def run(self, stop: threading.Event) -> None:
        with httpx.Client(timeout=5) as client:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    ok = client.get(self.url).status_code == 200
                except httpx.HTTPError:
                    ok = False
                took = time.monotonic() - t0
                if ok:
                    self.samples.append((t0, took))
                else:
                    self.errors.append(t0)
                stop.wait(max(0.0, 0.05 - took))

    def counted(self) -> list[float]:
        """Latencies outside the deliberate down windows (plus 10 s of recovery each)."""
        return sorted(
            took for at, took in self.samples if not any(a <= at <= b + 10 for a, b in self.down)
        )


@dataclass
class Soak:
    grid: LocalGrid
    interval: float
    unfetchable: bool = True
    funded: list[Funded] = field(default_factory=list)
    hostile: Counter[str] = field(default_factory=Counter)
    fund_failures: int = 0
    chaos_log: list[str] = field(default_factory=list)

    def honest(self, stop: threading.Event) -> None:
        inputs = add_inputs(self.grid)
        n = 0
        while not stop.is_set():
            n += 1
            try:
                spec = wasm_spec(f"soak-{n}", inputs.module_cid, inputs.dataset_cid)
                self.funded.append(fund(self.grid, spec))
            except Exception:  # the chain or IPFS is paused: try again next tick
                self.fund_failures += 1
            stop.wait(self.interval)

    def _count(self, name: str, fn: Callable[[], Any]) -> None:
        try:
            result = fn()
            code = getattr(result, "status_code", "ok")
            self.hostile[f"{name} -> {code}"] += 1
        except Exception as exc:
            self.hostile[f"{name} -> {type(exc).__name__}"] += 1

    def attackers(self, stop: threading.Event) -> None:
        grid = self.grid
        sched = grid.scheduler.url
        front = grid.frontend_url or sched
        big = b"[" + b"1," * (2 * 1024**2) + b"1]"
        json_headers = {"content-type": "application/json"}
        attacker = grid.submitters[1]
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                self._count(
                    "4 MB to /v1/quote",
                    lambda: client.post(sched + "/v1/quote", content=big, headers=json_headers),
                )
                self._count(
                    "4 MB to /api/quote",
                    lambda: client.post(front + "/api/quote", content=big, headers=json_headers),
                )
                self._count(
                    "NaN to /v1/nodes/register",
                    lambda: client.post(
                        sched + "/v1/nodes/register", content=b'{"x": NaN}', headers=json_headers
                    ),
                )
                self._count(
                    "lone surrogate to /v1/nodes/register",
                    lambda: client.post(
                        sched + "/v1/nodes/register",
                        content=b'{"x": "\\ud800"}',
                        headers=json_headers,
                    ),
                )
                try:
                    deadline = chain_now(grid) + 1800
                except Exception:  # the chain is paused
                    stop.wait(1.0)
                    continue
                self._count(
                    "poison createJob (specCid not UTF-8)",
                    partial(create_job_raw, grid.escrow, attacker, INVALID_UTF8, deadline, 10**16),
                )
                if not self.unfetchable:
                    stop.wait(1.0)
                    continue
                self._count(
                    "createJob with a spec nobody has",
                    partial(
                        grid.escrow.create_job,
                        attacker,
                        os.urandom(32),
                        bytes_cid(os.urandom(32)),
                        deadline,
                        10**16,
                    ),
                )
                stop.wait(1.0)

    def poison_registration(self) -> None:
        self._count(
            "poison registerProvider (metadataCid not UTF-8)",
            lambda: escrow_call(
                self.grid.escrow, self.grid.providers[4], "registerProvider", INVALID_UTF8
            ),
        )

    def slow_clients(self, stop: threading.Event, count: int = 8) -> None:
        """Clients that trickle request headers (one byte a second) or open a job stream and
        never read it."""
        sched = self.grid.scheduler.url.removeprefix("http://")
        host, port = sched.split(":")
        socks: list[socket.socket] = []
        try:
            for _ in range(count):
                s = socket.create_connection((host, int(port)), timeout=5)
                s.sendall(b"POST /v1/quote HTTP/1.1\r\nHost: x\r\n")
                socks.append(s)
            if self.grid.frontend_url and self.funded:
                fhost, fport = self.grid.frontend_url.removeprefix("http://").split(":")
                for _ in range(4):
                    s = socket.create_connection((fhost, int(fport)), timeout=5)
                    path = f"/api/jobs/{self.funded[0].job_id}/stream"
                    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                    socks.append(s)  # never read
            self.hostile["slow or unread connections"] += len(socks)
            while not stop.is_set():
                for s in list(socks):
                    try:
                        s.sendall(b"X")
                    except OSError:
                        socks.remove(s)
                stop.wait(1.0)
        finally:
            for s in socks:
                s.close()


def front_attack(soak: Soak, args: argparse.Namespace, stop: threading.Event) -> threading.Thread:
    """``--loris`` slow-loris connections and ``--sse`` unread streams of the first honest job
    at the front end (bench/slow_clients.py's attacker), their answers counted as hostile."""
    from slow_clients import Attack  # the script's folder is on sys.path

    def run() -> None:
        while not soak.funded and not stop.wait(0.5):
            pass
        if stop.is_set():
            return
        port = int(str(soak.grid.frontend_url).rsplit(":", 1)[1])
        path = f"/api/jobs/{soak.funded[0].job_id}/stream"
        attack = Attack(port, args.loris, args.sse, args.attack_addresses, path)
        try:
            attack.run(stop)
        finally:
            for answer, n in attack.answers.items():
                soak.hostile[f"front end {answer}"] += n

    return threading.Thread(target=run, name="front-attack")


def chaos(soak: Soak, probes: dict[str, Probe], duration: float, stop: threading.Event) -> None:
    grid = soak.grid
    start = time.monotonic()

    def at(fraction: float) -> bool:
        return not stop.wait(max(0.0, start + duration * fraction - time.monotonic()))

    def note(text: str) -> None:
        soak.chaos_log.append(f"{time.monotonic() - start:6.1f}s {text}")
        print(soak.chaos_log[-1], flush=True)

    if at(0.15):
        soak.poison_registration()
        note("poison registerProvider sent")
    if at(0.2) and grid.agents:
        agent = grid.agents[0]
        grid.kill_agent(agent)
        note(f"agent {agent.name} SIGKILLed")
        if not stop.wait(5):
            grid.restart_agent(agent)
            note(f"agent {agent.name} restarted")
    if at(0.35):
        t0 = time.monotonic()
        grid.scheduler.kill()
        note("scheduler SIGKILLed")
        grid.restart_scheduler()
        probes["scheduler"].down.append((t0, time.monotonic()))
        note("scheduler restarted")
    if at(0.5):
        grid.stop_ipfs()
        note("IPFS stopped")
        stop.wait(5)
        grid.start_ipfs()
        note("IPFS started")
    if at(0.65):
        t0 = time.monotonic()
        grid.stop_chain()
        note("chain stopped")
        stop.wait(3)
        grid.start_chain()
        for p in probes.values():  # both read the chain for /info
            p.down.append((t0, time.monotonic()))
        note("chain started")


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, round(p / 100 * len(values)) - 1))]


def settle(soak: Soak, drain_s: float) -> dict[str, Any]:
    grid = soak.grid
    deadline = time.monotonic() + drain_s
    pending = list(soak.funded)
    final: dict[str, Status] = {}
    while pending and time.monotonic() < deadline:
        for job in list(pending):
            try:
                status = grid.escrow.job_state(job.id_bytes).status
            except Exception as exc:  # the chain is still coming back
                print(f"job {job.job_id[:10]}: {exc}", file=sys.stderr)
                continue
            if status.terminal:
                final[job.job_id] = status
                pending.remove(job)
        time.sleep(1)
    releases = Counter(
        "0x" + bytes(e.args["jobId"]).hex()
        for e in grid.escrow.events(grid.deployment.block)
        if e.name == "JobReleased"
    )
    honest = {j.job_id for j in soak.funded}
    why: Counter[str] = Counter()
    for job in pending:  # what the scheduler says about each unsettled job
        try:
            view = httpx.get(f"{grid.scheduler.url}/v1/jobs/{job.job_id}", timeout=5).json()
            why[f"{view.get('state')}: {str(view.get('reason'))[:60]}"] += 1
        except Exception as exc:
            why[f"unknown ({type(exc).__name__})"] += 1
    return {
        "funded": len(soak.funded),
        "paid": sum(1 for s in final.values() if s is Status.RELEASED),
        "refunded": sum(1 for s in final.values() if s is Status.REFUNDED),
        "lost": len(pending),
        "paid_twice": sum(1 for j, n in releases.items() if n > 1 and j in honest),
        "fund_attempts_failed_during_pauses": soak.fund_failures,
        "lost_by_scheduler_state": dict(why),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--drain", type=float, default=180.0)
    parser.add_argument("--work", type=Path, default=ROOT / ".run" / "soak")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument(
        "--loris",
        type=int,
        default=0,
        help="also hold this many slow-loris connections to the front end (bench/slow_clients.py)",
    )
    parser.add_argument(
        "--sse", type=int, default=0, help="and this many unread live streams of a job"
    )
    parser.add_argument(
        "--attack-addresses", type=int, default=1, help="loopback sources they come from"
    )
    parser.add_argument(
        "--no-unfetchable",
        action="store_true",
        help="leave out the jobs funded with specs nobody has (to measure the rest alone)",
    )
    args = parser.parse_args()
    if not 10 <= args.duration <= 1800:
        parser.error("--duration must be 10..1800 seconds (the soak is bounded)")
    with run_grid(args.work, agents=args.agents, on_step=lambda s: print("starting", s)) as grid:
        wait_nodes(grid, args.agents)
        soak = Soak(grid, args.interval, unfetchable=not args.no_unfetchable)
        probes = {"scheduler": Probe(grid.scheduler.url + "/v1/info")}
        if grid.frontend_url:
            probes["frontend"] = Probe(grid.frontend_url + "/api/info")
        stop = threading.Event()
        threads = [
            threading.Thread(target=soak.honest, args=(stop,), name="honest"),
            threading.Thread(target=soak.attackers, args=(stop,), name="attackers"),
            threading.Thread(target=soak.slow_clients, args=(stop,), name="slow"),
            threading.Thread(target=chaos, args=(soak, probes, args.duration, stop)),
            *(threading.Thread(target=p.run, args=(stop,), name=n) for n, p in probes.items()),
        ]
        if (args.loris or args.sse) and grid.frontend_url:
            threads.append(front_attack(soak, args, stop))
        started = time.monotonic()
        for t in threads:
            t.start()
        try:
            stop.wait(args.duration)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        elapsed = time.monotonic() - started
        print(f"soak over after {elapsed:.0f} s; draining honest jobs for up to {args.drain} s")
        money = settle(soak, args.drain)
        latency = {}
        for name, probe in probes.items():
            values = probe.counted()
            latency[name] = {
                "requests": len(values),
                "p50_ms": round(pct(values, 50) * 1000, 1),
                "p99_ms": round(pct(values, 99) * 1000, 1),
                "max_ms": round(values[-1] * 1000, 1) if values else None,
                "failed_outside_down_windows": sum(
                    1 for at in probe.errors if not any(a <= at <= b + 10 for a, b in probe.down)
                ),
            }
        report = {
            "duration_s": round(elapsed),
            "unfetchable_specs": soak.unfetchable,
            "agents": args.agents,
            "jobs": money,
            "honest_latency": latency,
            "hostile": dict(sorted(soak.hostile.items())),
            "chaos": soak.chaos_log,
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = money["lost"] == 0 and money["paid_twice"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
