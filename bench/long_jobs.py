"""Long jobs on nodes that drop: the compute lost to killed nodes with checkpoints, against the
same jobs without them (the baseline) under the same kill schedule, in the same run (issue 29,
item 7).

    .venv/bin/python bench/long_jobs.py     # --jobs 6 --agents 5 --steps 200 --kill-fraction 0.3

Starts the grid of the end-to-end tests (:func:`devstack.grid.run_grid` with their short
liveness timings and escrow windows, tests/e2e/support.py ``FAST``/``FAST_ESCROW``): anvil +
escrow, one js-ipfs node per party, dockerd, the scheduler, ``--agents`` real agent processes
(one slot each, their own wallets). All real: nothing is mocked.

**The jobs.** ``--jobs`` busybox jobs, each ``--steps`` steps of ``--step-s`` seconds (``sleep``),
funded with ``createJob`` on the default terms (paid after the challenge window, 12 s here). The
job keeps its step count in ``$GRIDMARKET_CHECKPOINT_DIR`` (``/checkpoint``) when it has one,
prints ``step N`` per step and ``resuming from step N`` when it finds a count there. Phase 1 runs
them with ``checkpoint: {interval_s: --interval}`` (the agent copies ``/checkpoint`` every
interval, the scheduler keeps the newest copy on its own IPFS node and hands it to the next
attempt); phase 2 runs the same jobs without a checkpoint policy: every attempt starts at step 1.

**The kills.** ``--kill-fraction`` of the agents (rounded, at least one), drawn with ``--seed``,
each at a random time of the phase (the same nodes at the same offsets in both phases): the agent
is SIGKILLed (:meth:`LocalGrid.kill_agent`) and its container killed in dockerd at once (a rig
that loses power: nothing is handed back, no last checkpoint), then restarted ``--reboot-s``
later with the same wallet (:meth:`LocalGrid.restart_agent`). A killed node's job moves on once
its on-chain hold is over (the job's timeout plus the devnet's 5 s margin).

**Measured**, per job and in total, per phase: steps executed over all attempts, read from the
job's live logs (``GET /v1/jobs/{id}/logs``: each attempt's ``step N`` lines), plus the steps a
killed attempt ran after its last shipped line (the agent ships every 2 s: estimated from the
kill time and the measured step cost); steps needed; compute lost = executed - needed, in steps
and in seconds of work; attempts; funded -> paid (``JobReleased`` seen on chain); what each
provider wallet was paid (escrow ``balanceOf`` before and after the phase). Goal (issue 29):
compute lost with checkpoints <= one checkpoint interval per lost attempt (a kill that hit a
running job). The machine's ``uptime`` load before and after; figures are PROVISIONAL above 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import httpx
from web3 import Web3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.executors.docker import OWNER_LABEL  # noqa: E402
from devstack.grid import AgentProcess, LocalGrid, run_grid, wait_nodes  # noqa: E402
from gridmarket.chain import EscrowClient  # noqa: E402
from gridmarket.checkpoints import CheckpointPolicy  # noqa: E402
from gridmarket.wire import API, JobSpec  # noqa: E402
from tests.e2e.support import (  # noqa: E402 - the e2e grid's timings and helpers
    FAST,
    FAST_ESCROW,
    FINAL,
    Funded,
    docker_spec,
    fund,
    money,
)

# The job: a step count kept in the checkpoint directory when there is one (else in /tmp, lost
# with the container). Written to a temporary name and renamed, progress.json last.
SCRIPT = r"""
set -e
dir="${GRIDMARKET_CHECKPOINT_DIR:-/tmp/state}"
mkdir -p "$dir" && cd "$dir"
step=0
[ -f step ] && step=$(cat step) && echo "resuming from step $step"
while [ "$step" -lt "$STEPS" ]; do
  step=$((step + 1))
  sleep "$STEP_S"
  echo $step > step.tmp && mv step.tmp step
  printf '{"step": %d, "total": %d}' $step $STEPS > p.tmp && mv p.tmp progress.json
  echo "step $step"
done
echo $step > /output/steps
"""
STEP_LINE = re.compile(r"^step (\d+)$")
RESUME_LINE = re.compile(r"^resuming from step (\d+)$")
COLUMNS = (
    "job|state|attempts|lost|steps run (+unshipped)|resumed at|needed|lost steps|lost s"
    "|funded->paid s|paid to"
)


@dataclass
class Kill:
    agent: int  # index in grid.agents
    at_s: float  # offset from the phase's start
    killed_at: float = 0.0  # wall clock
    hit: str = ""  # the job whose attempt it ended ("" when the node was idle)


@dataclass
class JobResult:
    funded: Funded
    funded_at: float
    paid_at: float | None = None
    state: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    logged: dict[int, int] = field(default_factory=dict)  # attempt -> step lines
    tail: dict[int, int] = field(default_factory=dict)  # attempt -> steps run after shipping
    last_ts: dict[int, float] = field(default_factory=dict)  # attempt -> last step line's ts
    resumed: dict[int, int] = field(default_factory=dict)  # attempt -> "resuming from step N"
    paid_to: str = ""

    @property
    def executed(self) -> int:
        return sum(self.logged.values()) + sum(self.tail.values())


@dataclass
class Phase:
    name: str
    jobs: list[JobResult]
    kills: list[Kill]
    paid: dict[str, int]  # provider address -> balanceOf change
    staked: dict[str, int]  # provider address -> stake change
    wall_s: float
    step_cost: float
    started: float  # wall clock of the phase's t=0


class PaidWatcher:
    """When each ``JobReleased`` is first seen on chain, and to whom: the escrow's logs of every
    new block, polled every 0.2 s through a client of its own."""

    def __init__(self, grid: LocalGrid) -> None:
        self.escrow = EscrowClient(Web3(Web3.HTTPProvider(grid.anvil.url)), grid.deployment)
        self.seen: dict[str, tuple[float, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paid-watcher", daemon=True)
        self._last = int(self.escrow.w3.eth.block_number)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                head = int(self.escrow.w3.eth.block_number)
                if head <= self._last:
                    continue
                events = self.escrow.events(self._last + 1, head)
            except Exception as exc:  # a transient RPC error: the next poll reads the range again
                print(f"  (paid watcher: {exc!r}; retrying)", file=sys.stderr)
                continue
            now = time.time()
            for e in events:
                if e.name == "JobReleased":
                    job_id = "0x" + bytes(e.args["jobId"]).hex()
                    self.seen.setdefault(job_id, (now, str(e.args["provider"])))
            self._last = head


def job_spec(i: int, args: argparse.Namespace, checkpoint: bool) -> JobSpec:
    work_s = args.steps * args.step_s
    spec = docker_spec(f"long-{i}", SCRIPT, timeout_s=int(work_s * 1.5) + 20)
    update: dict[str, Any] = {"env": {"STEPS": str(args.steps), "STEP_S": str(args.step_s)}}
    if checkpoint:
        update["checkpoint"] = CheckpointPolicy(interval_s=args.interval, max_bytes=1 << 20)
    return spec.model_copy(update=update)


def kill_host(grid: LocalGrid, agent: AgentProcess) -> None:
    """SIGKILL the agent and kill its containers in dockerd: a host that loses power."""
    grid.kill_agent(agent)
    assert grid.dockerd is not None
    client = docker.DockerClient(base_url=grid.dockerd.host)
    try:
        owner = f"{agent.account.address.lower()}/{agent.name}"
        for c in client.containers.list(filters={"label": f"{OWNER_LABEL}={owner}"}):
            with contextlib.suppress(docker.errors.APIError):  # it ended meanwhile
                c.kill()
    finally:
        client.close()


def chaos(grid: LocalGrid, kills: list[Kill], start: float, reboot_s: float) -> None:
    """Run the kill schedule from ``start`` (monotonic): each kill, then its restart."""
    events: list[tuple[float, str, Kill]] = []
    for k in kills:
        events += [(k.at_s, "kill", k), (k.at_s + reboot_s, "restart", k)]
    for at, what, k in sorted(events, key=lambda e: e[0]):
        time.sleep(max(0.0, start + at - time.monotonic()))
        agent = grid.agents[k.agent]
        if what == "kill":
            k.killed_at = time.time()
            kill_host(grid, agent)
            print(f"  t={at:5.1f} s  killed {agent.name} (SIGKILL + its container)", flush=True)
        else:
            grid.restart_agent(agent)
            print(f"  t={at:5.1f} s  restarted {agent.name}", flush=True)


def read_logs(http: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    after = 0
    while True:
        r = http.get(f"/v1/jobs/{job_id}/logs", params={"after": after, "limit": 1000})
        r.raise_for_status()
        page = r.json()
        lines += page["lines"]
        if not page["more"]:
            return lines
        after = page["next"]


def run_phase(
    grid: LocalGrid, args: argparse.Namespace, name: str, checkpoint: bool, kills: list[Kill]
) -> Phase:
    http = httpx.Client(base_url=grid.scheduler.url, timeout=10)
    watcher = PaidWatcher(grid)
    watcher.start()
    providers = [str(a.account.address) for a in grid.agents]
    before = money(grid)
    print(f"\n{name}: {args.jobs} jobs x {args.steps} steps", flush=True)
    t0, t0_wall = time.monotonic(), time.time()
    jobs = []
    for i in range(args.jobs):
        funded = fund(grid, job_spec(i, args, checkpoint))
        jobs.append(JobResult(funded, time.time()))
    thread = threading.Thread(target=chaos, args=(grid, kills, t0, args.reboot_s), daemon=True)
    thread.start()
    deadline = time.monotonic() + args.phase_timeout
    pending = {j.funded.job_id: j for j in jobs}
    while pending and time.monotonic() < deadline:
        for job_id, job in list(pending.items()):
            r = http.get(API.JOB.format(job_id=job_id))
            if r.status_code != 200:
                continue
            state = r.json()["state"]
            if state in FINAL and (state != "released" or job_id in watcher.seen):
                job.state = state
                del pending[job_id]
                print(f"  t={time.monotonic() - t0:5.1f} s  {job_id[:10]} {state}", flush=True)
        time.sleep(0.5)
    wall = time.monotonic() - t0
    thread.join()  # every killed agent is restarted before the next phase
    wait_nodes(grid, len(grid.agents), timeout=60)
    watcher.stop()
    after = money(grid)
    gaps: list[float] = []
    for job in jobs:
        job_id = job.funded.job_id
        view = http.get(API.JOB.format(job_id=job_id)).json()
        job.state = job.state or f"{view['state']} (timed out)"
        job.attempts = view["attempts"]
        if job_id in watcher.seen:
            job.paid_at, job.paid_to = watcher.seen[job_id]
        last_ts = job.last_ts
        for line in read_logs(http, job_id):
            if m := RESUME_LINE.match(line["text"].strip()):
                job.resumed[int(line["attempt"])] = int(m.group(1))
            if STEP_LINE.match(line["text"].strip()):
                a = int(line["attempt"])
                job.logged[a] = job.logged.get(a, 0) + 1
                if a in last_ts:
                    gaps.append(float(line["ts"]) - last_ts[a])
                last_ts[a] = float(line["ts"])
        job.tail = {a: 0 for a in job.logged}  # filled in below for the killed attempts
    step_cost = statistics.median(gaps) if gaps else args.step_s
    for k in kills:
        node = grid.agents[k.agent].node_id
        for job in jobs:
            for att in job.attempts:
                ended = att["ended_at"]
                if (
                    att["node_id"] == node
                    and att["outcome"] != "success"
                    and float(att["started_at"]) <= k.killed_at
                    and (ended is None or float(ended) >= k.killed_at)
                ):
                    k.hit = job.funded.job_id
                    a = int(att["attempt"])
                    last = job.last_ts.get(a)
                    if last is not None:
                        job.tail[a] = max(0, int((k.killed_at - last) / step_cost))
    http.close()
    return Phase(
        name,
        jobs,
        kills,
        {p: after.balances[p] - before.balances[p] for p in providers},
        {p: after.stakes[p] - before.stakes[p] for p in providers},
        wall,
        step_cost,
        t0_wall,
    )


def table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print(
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    )
    for row in rows:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def eth(wei: int) -> str:
    return f"{wei / 1e18:.4f}"


def report(grid: LocalGrid, phase: Phase, args: argparse.Namespace) -> tuple[int, int]:
    """Print the phase's figures; returns (steps lost, lost attempts)."""
    names: dict[str, str] = {str(a.account.address): a.name for a in grid.agents}
    print(
        f"\n== {phase.name}: wall {phase.wall_s:.0f} s, step cost measured "
        f"{phase.step_cost:.3f} s (nominal {args.step_s})"
    )
    rows = []
    total_exec = total_need = lost_attempts = 0
    for job in phase.jobs:
        need = args.steps
        lost = job.executed - need
        failed = sum(1 for a in job.attempts if a["outcome"] not in (None, "success"))
        total_exec += job.executed
        total_need += need
        lost_attempts += failed
        per = "+".join(str(job.logged.get(a, 0)) for a in sorted(job.logged)) or "0"
        tail = sum(job.tail.values())
        paid = f"{job.paid_at - job.funded_at:.1f}" if job.paid_at else "-"
        resumed = ",".join(str(job.resumed[a]) for a in sorted(job.resumed)) or "-"
        who = names.get(job.paid_to, job.paid_to[:10] or "-")
        cells = [job.funded.job_id[:10], job.state, len(job.attempts), failed]
        cells += [per + (f" (+{tail})" if tail else ""), resumed, need, lost]
        rows.append([str(c) for c in [*cells, f"{lost * args.step_s:.1f}", paid, who]])
    lost_total = total_exec - total_need
    cells = ["total", "", sum(len(j.attempts) for j in phase.jobs), lost_attempts, total_exec]
    cells += ["", total_need, lost_total, f"{lost_total * args.step_s:.1f}", "", ""]
    rows.append([str(c) for c in cells])
    table(COLUMNS.split("|"), rows)
    paid_times = [j.paid_at - j.funded_at for j in phase.jobs if j.paid_at]
    if paid_times:
        print(
            f"funded -> paid: median {statistics.median(paid_times):.1f} s, "
            f"max {max(paid_times):.1f} s over {len(paid_times)} paid jobs; "
            f"compute lost {100 * lost_total / max(1, total_need):.1f} % of the work needed"
        )
    print("\nkills:")
    by_node = {a.node_id: a.name for a in grid.agents}
    for k in phase.kills:
        hit = k.hit[:10] if k.hit else "no job running (nothing lost)"
        hit_job = next((j for j in phase.jobs if j.funded.job_id == k.hit), None)
        attempts = hit_job.attempts if hit_job else []
        later = [a for a in attempts if float(a["started_at"]) > k.killed_at]
        if later:
            nxt = min(later, key=lambda a: float(a["started_at"]))
            at = float(nxt["started_at"]) - phase.started
            hit += f", next attempt at t={at:.1f} s on {by_node.get(nxt['node_id'], '?')}"
        print(f"  t={k.at_s:5.1f} s  {grid.agents[k.agent].name}: {hit}")
    print("\nprovider payments (escrow balanceOf change in the phase; ETH):")
    jobs_by = {a: sum(1 for j in phase.jobs if j.paid_to == a) for a in phase.paid}
    table(
        ["provider", "wallet", "jobs paid", "paid", "stake change"],
        [
            [names[a], a[:10], str(jobs_by[a]), eth(phase.paid[a]), eth(phase.staked[a])]
            for a in phase.paid
        ],
    )
    return lost_total, lost_attempts


def load() -> tuple[float, str]:
    one, five, fifteen = os.getloadavg()
    return one, f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min, {os.cpu_count()} cores)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--agents", type=int, default=5, help="1..5 (the devnet's provider wallets)")
    ap.add_argument("--steps", type=int, default=200, help="steps a job needs")
    ap.add_argument("--step-s", type=float, default=0.25, help="seconds of work a step")
    ap.add_argument("--interval", type=int, default=10, help="checkpoint interval_s (>= 10)")
    ap.add_argument("--kill-fraction", type=float, default=0.3, help="share of agents killed")
    ap.add_argument("--reboot-s", type=float, default=20.0, help="a killed agent restarts after")
    ap.add_argument("--seed", type=int, default=1, help="draws the killed nodes and the times")
    ap.add_argument("--phase-timeout", type=float, default=420.0, help="seconds a phase may run")
    ap.add_argument("--work", type=Path, default=ROOT / ".run" / "bench-long-jobs")
    args = ap.parse_args()
    if not 1 <= args.agents <= 5:
        ap.error("--agents must be 1..5")
    if args.interval < 10 or not 0 <= args.kill_fraction <= 1 or args.jobs < 1 or args.steps < 1:
        ap.error("--interval >= 10, --kill-fraction 0..1, --jobs and --steps >= 1")
    rng = random.Random(args.seed)
    work_s = args.steps * args.step_s
    n_kill = max(1, round(args.agents * args.kill_fraction)) if args.kill_fraction > 0 else 0
    picked = rng.sample(range(args.agents), n_kill)
    offsets = sorted(rng.uniform(args.interval / 2, work_s * 0.9) for _ in picked)
    schedule = list(zip(picked, offsets, strict=True))
    load_before, text = load()
    print(f"load before: {text}", flush=True)
    t0 = time.monotonic()
    with run_grid(
        args.work,
        agents=args.agents,
        with_frontend=False,
        scheduler_overrides=FAST,
        escrow_overrides=FAST_ESCROW,
        on_step=lambda s: print(f"starting {s}", flush=True),
    ) as grid:
        print(f"grid up in {time.monotonic() - t0:.1f} s: {grid.docker_note}", flush=True)
        if grid.dockerd is None:
            print("this bench needs Docker jobs: no dockerd here", file=sys.stderr)
            return 1
        names = ", ".join(f"{grid.agents[a].name} at {t:.1f} s" for a, t in schedule)
        print(f"kill schedule (seed {args.seed}, reboot after {args.reboot_s:.0f} s): {names}")
        phases = [
            run_phase(
                grid,
                args,
                f"with checkpoints every {args.interval} s",
                True,
                [Kill(a, t) for a, t in schedule],
            ),
            run_phase(
                grid,
                args,
                "baseline: no checkpoint policy",
                False,
                [Kill(a, t) for a, t in schedule],
            ),
        ]
        results = [report(grid, p, args) for p in phases]
    (lost_c, lost_n), (lost_b, lost_bn) = results
    budget = lost_n * args.interval / args.step_s
    print(
        f"\ncompute lost: with checkpoints {lost_c} steps ({lost_c * args.step_s:.1f} s) over "
        f"{lost_n} lost attempts; baseline {lost_b} steps ({lost_b * args.step_s:.1f} s) over "
        f"{lost_bn} lost attempts"
    )
    verdict = "met" if lost_c <= budget else "MISSED"
    if lost_n == 0:
        verdict += " (trivially: no kill hit a running job; try another --seed)"
    print(
        f"goal: lost with checkpoints <= one interval ({args.interval} s = "
        f"{args.interval / args.step_s:.0f} steps) per lost attempt = {budget:.0f} steps: {verdict}"
    )
    load_after, text = load()
    print(f"load after: {text}")
    if max(load_before, load_after) > 1:
        print("PROVISIONAL: load average above 1 (2 shared cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
