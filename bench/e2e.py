"""End-to-end latency of the whole grid in its own-node topology: job funded -> running on an
idle agent -> paid; the dataset transfer rate between two IPFS nodes; the image pull time.

    .venv/bin/python bench/e2e.py            # --jobs 24 --agents 3 --work .run/bench-e2e

Starts the grid of ``make demo`` (:func:`devstack.grid.run_grid`): anvil + escrow, one js-ipfs
node per party (submitter, scheduler, mediator, each agent) swarmed on loopback, dockerd with
the devnet's OCI registry holding the job images, a scheduler process, 3 agent processes, each
with its own wallet and IPFS node. Nothing is shared but the network, except that the agents
share one dockerd (so one image cache).

**Path of a measured job.** The submitter adds the spec and a one-file dataset (6 bytes) on the
*submitter's* IPFS node and funds ``createJob`` (anvil mines at once, payment on the scheduler's
check). The scheduler's chain watcher sees ``JobCreated``, fetches the spec through the
*scheduler's* node (bitswap from the submitter's), queues it; the dispatch round offers it to an
idle long-polling agent, which signs its acceptance (the scheduler assigns on-chain), fetches the
dataset through *its own* node, runs the job, adds the output on its node and reports; the
scheduler fetches the output from the agent's node, checks its CID and settles on-chain. Docker
jobs name the busybox image by digest in the registry (``host:port/gridmarket/busybox@sha256:``);
the warm-up (one Docker and one WASM job per agent) makes the engine pull it once, so every
measured Docker job runs a **cached image** (the agent finds it present: no registry call).
Jobs are funded one at a time, alternating Docker and WASM, each when every agent is idle. They
do almost nothing: read the clock at their first and last instruction and write both stamps to
``/output``.

Measured per job, all on this machine's wall clock:

* **funded**: ``createJob``'s receipt is back;
* **leased**: the attempt's ``started_at`` (GET /v1/jobs/{id}: the scheduler's dispatch);
* **started**: the job's own first clock reading: busybox ``adjtimex`` (microseconds) in the
  container. A WASM module runs under the executor's fixed clock (deterministic execution,
  escrow version 3), so its start and run time are not measurable from inside: WASM rows give
  funded -> leased and funded -> paid only (its run time, a few ms, counts as overhead);
* **run time**: the job's last clock reading minus its first;
* **paid**: when ``JobReleased`` is first seen on-chain (logs polled every 20 ms).

Reported: funded -> started, and funded -> paid minus the run time (the platform's overhead),
p50 / p99 / max, for all jobs and per kind. Goals (issues 6 and 11): funded -> started <= 250 ms
at p50 (issue 11: for a cached image with a small dataset, the Docker rows) and overhead <= 2 s.
Percentiles are nearest-rank: with fewer than 100 jobs p99 is the worst job.

**Dataset transfer** (after the jobs): ``--transfer-mib`` MiB of random bytes (new each round,
so no node has a block of it) added on the submitter's node, then fetched through an agent's
node with the agent's own fetch code (``AgentIpfsStore.fetch``: bitswap between the two
daemons over the loopback swarm, then streamed out of the agent's node and checked against the
CID), ``--transfer-rounds`` times; MB/s = bytes / fetch wall time (MB = 10^6 bytes).

**Image pull** (before the grid's agents pull anything): a second dockerd with an empty image
store, driven by the agent's puller (``agent.executors._pull.ImagePuller.acquire``: manifest
fetched and its size checked, ``POST /images/create`` by digest, digest verified). First pull
(cold: every layer downloaded from the registry over loopback) against a second acquire of the
same image (cached: found present), for the busybox and the Python + numpy images.

The machine's load average is printed before and after: figures taken under load are not
comparable with an idle machine's.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import wasmtime

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devstack.dockerd import Dockerd  # noqa: E402
from devstack.grid import LocalGrid, run_grid  # noqa: E402
from gridmarket.chain import EscrowClient  # noqa: E402
from gridmarket.wire import API, JobSpec  # noqa: E402

BOUNTY = 10**16
GOAL_START_S = 0.250
GOAL_PAID_S = 2.0
RESOURCES = {"cpu_cores": 1, "ram_mib": 128, "disk_mib": 16}
LIMITS = {"timeout_s": 30, "output_max_bytes": 4096}

# Docker: busybox's adjtimex prints the kernel clock as tv_sec / tv_usec (date has no %N).
STAMP = "adjtimex | grep -E 'tv_(sec|usec)'"
DOCKER_COMMAND = f"{STAMP} > /output/start && echo ok > /output/result && {STAMP} > /output/end"

# WASM: clock_time_get(realtime) in nanoseconds, written as decimal to /output/start and /end.
# Preopens: fd 3 = /input, fd 4 = /output (the job has a dataset).
CLOCK_WAT = """
(module
  (import "wasi_snapshot_preview1" "clock_time_get"
    (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "start")
  (data (i32.const 32) "end")
  ;; 64: fd out-param; 72: iovec (ptr, len); 80: count; 96: the i64 time; 128..160: digits
  (func $now (result i64)
    (if (call $clock (i32.const 0) (i64.const 1) (i32.const 96))
      (then (call $proc_exit (i32.const 20))))
    (i64.load (i32.const 96)))
  (func $write (param $name i32) (param $len i32) (param $t i64) (local $p i32) (local $fd i32)
    (local.set $p (i32.const 160))
    (i32.store8 (local.get $p) (i32.const 10))
    (loop $digit
      (local.set $p (i32.sub (local.get $p) (i32.const 1)))
      (i32.store8 (local.get $p)
        (i32.add (i32.const 48) (i32.wrap_i64 (i64.rem_u (local.get $t) (i64.const 10)))))
      (local.set $t (i64.div_u (local.get $t) (i64.const 10)))
      (br_if $digit (i64.ne (local.get $t) (i64.const 0))))
    (if (call $path_open (i32.const 4) (i32.const 0) (local.get $name) (local.get $len)
                         (i32.const 9) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 64))
      (then (call $proc_exit (i32.const 21))))
    (local.set $fd (i32.load (i32.const 64)))
    (i32.store (i32.const 72) (local.get $p))
    (i32.store (i32.const 76) (i32.sub (i32.const 161) (local.get $p)))
    (if (call $fd_write (local.get $fd) (i32.const 72) (i32.const 1) (i32.const 80))
      (then (call $proc_exit (i32.const 22))))
    (drop (call $fd_close (local.get $fd))))
  (func (export "_start") (local $t0 i64)
    (local.set $t0 (call $now))
    (call $write (i32.const 16) (i32.const 5) (local.get $t0))
    (call $write (i32.const 32) (i32.const 3) (call $now))))
"""


@dataclass
class Sample:
    """One job's timeline (Unix seconds)."""

    kind: str
    job_id: str
    funded: float
    leased: float = 0.0
    started: float = 0.0
    ended: float = 0.0
    paid: float = 0.0
    node: str = ""

    @property
    def clocked(self) -> bool:
        """Whether the job could read the wall clock: a container can; a WASM module runs
        under the executor's fixed clock (1980-01-01 plus a microsecond a read: deterministic),
        so its start and run time cannot be seen from inside it."""
        return self.started > self.funded - 3600

    @property
    def to_start(self) -> float:
        return self.started - self.funded

    @property
    def run(self) -> float:
        return self.ended - self.started

    @property
    def overhead(self) -> float:
        return self.paid - self.funded - (self.run if self.clocked else 0.0)


@dataclass
class PaidWatcher:
    """Records when each JobReleased is first seen: polls the chain head every 20 ms, and
    reads the escrow's logs of each new block."""

    escrow: EscrowClient
    seen: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="paid-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        w3 = self.escrow.w3
        last = int(w3.eth.block_number)
        while not self._stop.wait(0.02):
            head = int(w3.eth.block_number)
            if head <= last:
                continue
            events = self.escrow.events(last + 1, head)
            now = time.time()
            for e in events:
                if e.name == "JobReleased":
                    self.seen.setdefault("0x" + bytes(e.args["jobId"]).hex(), now)
            last = head


def _stamp(text: str) -> float:
    """A clock reading written by a job: WASM nanoseconds, or adjtimex's two lines."""
    text = text.strip()
    if text.isdigit():
        return int(text) / 1e9
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    sec = int(fields["time.tv_sec"])
    usec = int(fields["time.tv_usec"])
    return sec + (usec / 1e9 if usec >= 1_000_000 else usec / 1e6)


class Bench:
    def __init__(self, grid: LocalGrid, work: Path) -> None:
        self.grid = grid
        self.work = work
        self.http = httpx.Client(base_url=grid.scheduler.url, timeout=10)
        data = work / "bench-dataset"
        data.mkdir(parents=True, exist_ok=True)
        (data / "hello.txt").write_text("hello\n")
        self.image = grid.busybox_image  # pinned by digest in the devnet's registry
        self.dataset = grid.ipfs.add_dir(data)
        self.module = grid.ipfs.add_bytes(bytes(wasmtime.wat2wasm(CLOCK_WAT)))
        self.spec_cids = {kind: grid.ipfs.add_bytes(self.spec(kind).to_bytes()) for kind in KINDS}
        self.watcher = PaidWatcher(grid.escrow)

    def spec(self, kind: str) -> JobSpec:
        base: dict[str, Any] = {
            "name": f"bench {kind}",
            "executor": kind,
            "dataset_cid": self.dataset,
            "resources": RESOURCES,
            "limits": LIMITS,
        }
        if kind == "docker":
            base.update(image=self.image, command=["sh", "-c", DOCKER_COMMAND])
        else:
            base.update(module_cid=self.module)
        return JobSpec.model_validate(base)

    def fund(self, kind: str) -> Sample:
        """createJob with the kind's spec (already on IPFS), paid on the scheduler's check (the
        default after-window terms would add the challenge window); a new salt makes a new job."""
        grid = self.grid
        submitter = grid.submitters[0]
        now = max(int(time.time()), int(grid.w3.eth.get_block("latest")["timestamp"]))
        salt = time.time_ns().to_bytes(32, "big")
        terms = grid.escrow.default_terms(BOUNTY, submitter.address, on_verify=True)
        state, _ = grid.escrow.create_job(
            submitter, salt, self.spec_cids[kind], now + 1800, BOUNTY, terms
        )
        return Sample(kind, "0x" + state.job_id.hex(), funded=time.time())

    def job(self, job_id: str) -> dict[str, Any] | None:
        r = self.http.get(API.JOB.format(job_id=job_id))
        if r.status_code != 200:
            return None
        data: dict[str, Any] = r.json()
        return data

    def finish(self, sample: Sample, timeout: float = 60) -> None:
        """Wait until the job is paid and released, then read its timeline."""
        deadline = time.monotonic() + timeout
        view: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            view = self.job(sample.job_id)
            if (
                view is not None
                and view["state"] == "released"
                and sample.job_id in self.watcher.seen
            ):
                break
            if view is not None and view["state"] in ("failed", "invalid", "expired"):
                raise RuntimeError(f"bench job {sample.job_id} ended {view['state']}: {view}")
            time.sleep(0.05)
        else:
            raise RuntimeError(f"bench job {sample.job_id} not paid after {timeout} s: {view}")
        assert view is not None
        (attempt,) = view["attempts"]
        sample.leased = float(attempt["started_at"])
        sample.node = str(attempt["node_id"])
        sample.paid = self.watcher.seen[sample.job_id]
        out = self.work / "bench-out" / sample.job_id
        shutil.rmtree(out, ignore_errors=True)
        path = self.grid.ipfs.fetch(view["output_cid"], out, 1 << 16)
        sample.started = _stamp((path / "start").read_text())
        sample.ended = _stamp((path / "end").read_text())

    def idle(self) -> None:
        """Until no job holds a slot, then a moment for every agent to be long-polling again."""
        while any(n["running"] for n in self.grid.api("/v1/nodes")["nodes"]):
            time.sleep(0.05)
        time.sleep(0.3)

    def warm_up(self) -> list[Sample]:
        samples: list[Sample] = []
        for kind in KINDS:  # one of each kind per agent: 1 slot each, all idle
            batch = [self.fund(kind) for _ in self.grid.agents]
            for s in batch:
                self.finish(s)
            samples += batch
            self.idle()
        return samples

    def measure(self, jobs: int) -> list[Sample]:
        samples = []
        for i in range(jobs):
            self.idle()
            s = self.fund(KINDS[i % len(KINDS)])
            self.finish(s)
            samples.append(s)
        return samples


def transfer_rates(grid: LocalGrid, work: Path, mib: int, rounds: int) -> list[tuple[int, float]]:
    """(bytes, seconds) per round: ``mib`` MiB of fresh random bytes added on the submitter's
    node, fetched through an agent's node by the agent's fetch code."""
    from agent.storage.ipfs import AgentIpfsStore

    agent = grid.agents[0].name
    store = AgentIpfsStore(grid.ipfs_swarm[agent].api_addr)
    got: list[tuple[int, float]] = []
    try:
        for i in range(rounds):
            data = os.urandom(mib * 1024 * 1024)
            cid = grid.ipfs.add_bytes(data)
            dest = work / "bench-transfer" / str(i)
            shutil.rmtree(dest, ignore_errors=True)
            started = time.monotonic()
            path = store.fetch(cid, dest, len(data) + 1, timeout_s=300)
            took = time.monotonic() - started
            assert path.stat().st_size == len(data)
            got.append((len(data), took))
            shutil.rmtree(dest, ignore_errors=True)
    finally:
        store.close()
    return got


def pull_times(
    work: Path, images: list[str], registries: list[str]
) -> list[tuple[str, int, float, float]]:
    """(image, unpacked bytes, first pull s, cached acquire s) on a fresh, empty dockerd, by
    the agent's puller (allowed ``registries``, as the grid's agents' ``pull_registries``)."""
    import docker

    from agent.executors._pull import ImagePuller, PullPolicy
    from gridmarket.registry_policy import RegistryPolicy

    root = work / "bench-dockerd-cold"
    shutil.rmtree(root, ignore_errors=True)
    out: list[tuple[str, int, float, float]] = []
    with Dockerd(root) as engine:
        client = docker.DockerClient(base_url=engine.host)
        try:
            allowed = RegistryPolicy.of(registries, "pull_registries")
            puller = ImagePuller(client, PullPolicy(timeout_s=300, registries=allowed))
            for image in images:
                started = time.monotonic()
                puller.acquire(image)
                first = time.monotonic() - started
                puller.release(image)
                started = time.monotonic()
                puller.acquire(image)
                cached = time.monotonic() - started
                puller.release(image)
                size = puller.pulled_images().get(image, 0)
                out.append((image, size, first, cached))
        finally:
            client.close()
    shutil.rmtree(root, ignore_errors=True)
    return out


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min, {os.cpu_count()} cores)"


KINDS = ("docker", "wasm")


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (with fewer than 100 values, p99 is the largest)."""
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def ms(x: float) -> str:
    return f"{x * 1000:,.0f}"


def report(
    samples: list[Sample],
    warm: list[Sample],
    transfers: list[tuple[int, float]],
    pulls: list[tuple[str, int, float, float]],
) -> None:
    rows: list[tuple[str, str, list[float]]] = []
    for kind in ("all", *KINDS):
        subset = [s for s in samples if kind in ("all", s.kind)]
        clocked = [s for s in subset if s.clocked]  # WASM: a fixed clock inside (deterministic)
        rows += [
            (kind, "funded -> leased (scheduler)", [s.leased - s.funded for s in subset]),
            (kind, "leased -> started (agent)", [s.started - s.leased for s in clocked]),
            (kind, "funded -> started", [s.to_start for s in clocked]),
            (kind, "job run time", [s.run for s in clocked]),
            (kind, "started -> paid", [s.paid - s.started for s in clocked]),
            (kind, "funded -> paid", [s.paid - s.funded for s in subset]),
            (kind, "funded -> paid minus run time", [s.overhead for s in subset]),
        ]
    mix = ", ".join(f"{k}: {sum(s.kind == k for s in samples)}" for k in KINDS)
    nodes = len({s.node for s in samples})
    print(f"\n{len(samples)} jobs ({mix}) on {nodes} agents; milliseconds\n")
    print("| jobs | interval | p50 | p99 | max | mean |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for kind, name, values in rows:
        if not values:
            print(f"| {kind} | {name} | not measurable: the job's clock is fixed | | | |")
            continue
        print(
            f"| {kind} | {name} | {ms(pct(values, 50))} | {ms(pct(values, 99))} | "
            f"{ms(max(values))} | {ms(statistics.fmean(values))} |"
        )
    start50 = pct([s.to_start for s in samples if s.clocked], 50)
    cached50 = pct([s.to_start for s in samples if s.kind == "docker"], 50)
    paid50 = pct([s.overhead for s in samples], 50)
    print()
    for what, got, goal in (
        ("funded -> started, p50", start50, GOAL_START_S),
        ("funded -> started, cached image + small dataset (docker), p50", cached50, GOAL_START_S),
        ("funded -> paid overhead, p50", paid50, GOAL_PAID_S),
    ):
        verdict = "meets" if got <= goal else "MISSES"
        print(f"{what}: {ms(got)} ms, goal <= {ms(goal)} ms: {verdict} the goal")
    cold = [s.to_start for s in warm if s.clocked]
    print(
        f"(warm-up, first job of each kind per agent: funded -> started "
        f"{ms(min(cold))}-{ms(max(cold))} ms; not counted)"
    )
    if transfers:
        rates = [n / t / 1e6 for n, t in transfers]
        size = transfers[0][0] / 2**20
        print(
            f"\ndataset transfer, submitter's IPFS node -> agent's node (loopback swarm), "
            f"{size:.0f} MiB x {len(transfers)}: "
            + ", ".join(f"{r:.1f}" for r in rates)
            + f" MB/s (median {statistics.median(rates):.1f} MB/s; "
            + ", ".join(f"{t:.2f} s" for _, t in transfers)
            + ")"
        )
    for image, size, first, cached in pulls:
        print(
            f"image pull {image.split('/', 1)[1].split('@')[0]} ({size / 2**20:.1f} MiB unpacked): "
            f"first pull {first * 1000:,.0f} ms, cached {cached * 1000:,.1f} ms"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=24, help="measured jobs (at least 20)")
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--work", type=Path, default=ROOT / ".run" / "bench-e2e")
    ap.add_argument("--transfer-mib", type=int, default=48, help="dataset size for the rate")
    ap.add_argument("--transfer-rounds", type=int, default=3)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a scheduler setting over run_grid's (e.g. chain_poll_s=0.05); repeatable",
    )
    args = ap.parse_args()
    if args.jobs < 20:
        ap.error("--jobs must be at least 20")
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            ap.error(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value.strip()
    print(f"load before: {load()}", flush=True)
    t0 = time.monotonic()
    with run_grid(
        args.work, agents=args.agents, with_frontend=False, scheduler_overrides=overrides
    ) as grid:
        print(f"grid up in {time.monotonic() - t0:.1f} s: {grid.docker_note}", flush=True)
        if grid.dockerd is None:
            print("dockerd is not running here: this bench needs Docker jobs", file=sys.stderr)
            return 1
        images = [i for i in (grid.busybox_image, grid.python_image) if i is not None]
        # before the grid's engine has pulled anything
        pulls = pull_times(args.work, images, grid.registries)
        bench = Bench(grid, args.work)
        bench.watcher.start()
        try:
            warm = bench.warm_up()
            samples = bench.measure(args.jobs)
        finally:
            bench.watcher.stop()
        transfers = transfer_rates(grid, args.work, args.transfer_mib, args.transfer_rounds)
        s = grid.scheduler_settings
        print(
            f"scheduler: chain_poll_s={s['chain_poll_s']} dispatch_tick_s={s['dispatch_tick_s']} "
            f"({'overrides: ' + str(overrides) if overrides else 'run_grid defaults'}); "
            "anvil mines each transaction at once"
        )
    report(samples, warm, transfers, pulls)
    print(f"\nload after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
