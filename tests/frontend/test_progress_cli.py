"""A checkpointing job's progress through the front end, against real services: anvil with a
fresh escrow, the session's IPFS daemon, the scheduler (tests/scheduler/harness.py: uvicorn,
its checkpoint keeper included) and ``python -m frontend_api`` pointed at it. A node (speaking
the wire protocol as the agent does) takes a docker job whose spec asks for checkpoints and
posts signed checkpoint reports of real directories added to IPFS; then:

* ``gridmarket progress JOB`` prints the bar, the metrics, the newest checkpoint (kept by the
  scheduler's keeper) and what a new attempt resumes from; ``gridmarket status`` a one-line
  progress; a job without a checkpoint policy says so;
* the job page shows the progress card (bar, one SVG chart per metric, the checkpoint line)
  and the live SSE fragment carries it;
* ``gridmarket progress -f`` in a pipe prints one line per new point and exits when the run is
  over; on a terminal (``show_progress(tty=True)``) it redraws one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack._process import ROOT, ManagedProcess
from devstack.anvil import free_port
from frontend_api.submitter_client import Frontend
from frontend_api.submitter_progress import show_progress
from gridmarket.chain import EscrowClient
from gridmarket.checkpoints import NODE_CHECKPOINTS, sign_checkpoint
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, JobSpec
from tests.conftest import Devnet
from tests.frontend.conftest import _wait_http
from tests.scheduler.harness import (
    CPU_CAP,
    Provider,
    Server,
    fresh_escrow,
    register_on_chain,
    scheduler,
    submit_job,
)

SPEC = JobSpec.model_validate(
    {
        "name": "train",
        "executor": "docker",
        "image": "busybox:1",
        "command": ["true"],
        "max_attempts": 1,
        "checkpoint": {"interval_s": 10, "max_bytes": 1048576},
    }
)
PLAIN = JobSpec.model_validate(
    {"name": "plain", "executor": "docker", "image": "busybox:1", "command": ["true"]}
)


class Grid:
    """The scheduler, the front end in front of it, a node and the session's IPFS."""

    def __init__(
        self,
        server: Server,
        client: EscrowClient,
        url: str,
        node: Provider,
        ipfs: IpfsStore,
        tmp: Path,
    ) -> None:
        self.server, self.client, self.url, self.node = server, client, url, node
        self.ipfs, self.tmp = ipfs, tmp
        info = server.get(API.INFO).json()
        self.chain_id, self.escrow = int(info["chain_id"]), str(info["escrow"])

    def checkpoint(self, job_id: str, seq: int, step: int, loss: float) -> dict[str, Any]:
        """A real checkpoint directory added to IPFS, reported signed by the node."""
        folder = self.tmp / f"ckpt-{seq}"
        folder.mkdir()
        (folder / "state.bin").write_bytes(os.urandom(2048 + seq))
        body = {"step": step, "total": 1000, "metrics": {"loss": loss, "acc": step / 1000}}
        (folder / "progress.json").write_text(json.dumps(body))
        cid = self.ipfs.add_dir(folder)
        size = sum(p.stat().st_size for p in folder.iterdir())
        sig = sign_checkpoint(
            self.node.account, self.chain_id, self.escrow, bytes.fromhex(job_id[2:]), 1, seq,
            cid, size,
        )  # fmt: skip
        report = {
            "attempt": 1,
            "seq": seq,
            "cid": cid,
            "size": size,
            "files": 2,
            "progress": body,
            "final": False,
            "taken_at": time.time(),
            "signature": "0x" + sig.hex(),
        }
        r = self.server.http.post(
            NODE_CHECKPOINTS.format(node_id=self.node.node_id, job_id=job_id),
            json=report,
            headers=self.node.auth,
        )
        assert r.status_code in (200, 202) and r.json()["stored"] is True, r.text
        return report

    def gm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "frontend_api.submitter_cli", *args],
            capture_output=True, text=True, cwd=self.tmp, env=self.env(), timeout=120,
            check=False,
        )  # fmt: skip

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_")}
        env["GRIDMARKET_URL"] = self.url
        return env

    def kept(self, job_id: str, seq: int, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        doc: dict[str, Any] = {}
        while time.monotonic() < deadline:
            doc = httpx.get(f"{self.url}/api/jobs/{job_id}/checkpoints", timeout=10).json()
            if (doc.get("resume") or {}).get("seq") == seq:
                return doc
            time.sleep(0.3)
        raise AssertionError(f"checkpoint {seq} of {job_id} not kept in {timeout} s: {doc}")


@pytest.fixture
def grid(tmp_path: Path, devnet: Devnet, ipfs_daemon: Any) -> Iterator[Grid]:
    deployment, client = fresh_escrow(devnet)
    provider = devnet.providers[2]
    register_on_chain(client, provider)
    with scheduler(
        tmp_path, deployment, devnet, ipfs_daemon.api_addr,
        lease_ttl_s=120.0, node_timeout_s=120.0,
    ) as server:  # fmt: skip
        node = Provider(provider, server, name="trainer", capacity=CPU_CAP)
        assert node.register().status_code == 200
        dep_file = tmp_path / "frontend-deployment.json"
        deployment.save(dep_file)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_")}
        env.update(
            {
                "GRIDMARKET_FRONTEND_SCHEDULER_URL": server.url,
                "GRIDMARKET_FRONTEND_RPC_URL": devnet.url,
                "GRIDMARKET_FRONTEND_DEPLOYMENT_FILE": str(dep_file),
                "GRIDMARKET_FRONTEND_IPFS_API": ipfs_daemon.api_addr,
                "GRIDMARKET_FRONTEND_STREAM_POLL_S": "0.3",
                "GRIDMARKET_FRONTEND_INDEX_MIN_INTERVAL_S": "0.2",
            }
        )
        frontend = ManagedProcess(
            "frontend",
            [sys.executable, "-m", "frontend_api", "--port", str(port), "--log-level", "warning"],
            tmp_path / "frontend.log",
            env=env,
            cwd=ROOT,
        )
        frontend.start()
        ipfs = IpfsStore(ipfs_daemon.api_addr)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_http(url + "/healthz", frontend)
            yield Grid(server, client, url, node, ipfs, tmp_path)
        finally:
            ipfs.close()
            frontend.stop()


BROWSER = r"""
const { chromium } = require("playwright-core");
(async () => {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium", headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
  });
  const errors = [];
  const page = await browser.newPage({ viewport: { width: 1280, height: 1400 } });
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(process.env.GM_PAGE);
  const bar = page.locator("#job-progress-bar");
  await bar.waitFor({ timeout: 20000 });
  const first = await bar.getAttribute("value");
  const charts = await page.locator("#job-progress-charts svg.metric-chart").count();
  const width = await page.locator("#job-progress-charts svg").first()
    .evaluate((el) => el.getBoundingClientRect().width);
  console.log(JSON.stringify({ ready: true }));
  // the SSE feed re-renders the card when the next checkpoint arrives
  await page.waitForFunction(
    () => Number(document.querySelector("#job-progress-bar").getAttribute("value")) >= 400,
    null, { timeout: 60000 });
  const text = await page.locator("#job-progress-text").innerText();
  await page.locator("#job-progress").screenshot({ path: process.env.GM_SHOT });
  console.log(JSON.stringify({ first, charts, width, text, errors }));
  await browser.close();
})().catch((e) => { console.error(e); process.exit(1); });
"""
"""Chromium (npm playwright-core) on the job page: the card without waiting for JS, then the
bar moved by the live feed."""


def _first_job_event(url: str) -> dict[str, Any]:
    with httpx.stream("GET", url, timeout=30) as r:
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "job":
                payload: dict[str, Any] = json.loads(line[6:])
                return payload
    raise AssertionError("no job event")


def test_progress_cli_page_and_follow_against_the_real_scheduler(
    grid: Grid, devnet: Devnet
) -> None:
    job_id = submit_job(grid.client, grid.ipfs, devnet.submitters[0], SPEC)
    grid.server.wait_job(job_id, {"queued"})

    # queued, nothing reported: the policy, no progress, resumes from the start
    before = grid.gm("progress", job_id)
    assert before.returncode == 0, before.stderr
    assert "no progress reported yet" in before.stdout, before.stdout
    assert "a checkpoint every 10 s, at most 1.0 MiB" in before.stdout
    assert "from the start (no checkpoint kept yet)" in before.stdout

    assignment = grid.node.take()
    assert assignment["job_id"] == job_id and assignment.get("resume") is None
    grid.server.wait_job(job_id, {"leased"})
    for seq, step, loss in ((1, 100, 0.9), (2, 200, 0.6), (3, 300, 0.45)):
        grid.checkpoint(job_id, seq, step, loss)
    grid.kept(job_id, 3)

    out = grid.gm("progress", job_id)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["job", job_id]
    assert f"[{'#' * 9}{'-' * 21}]  300/1000  30.0%" in out.stdout, out.stdout
    assert "acc 0.3000  loss 0.4500" in out.stdout
    assert "attempt 1, checkpoint 3: 2.1 KiB, 2 files," in out.stdout
    assert next(line for line in lines if line.startswith("checkpoint")).endswith(" ago, kept")
    assert "from attempt 1, checkpoint 3 (step 300)" in out.stdout
    assert "3 progress points so far" in out.stdout

    status = grid.gm("status", job_id)
    assert status.returncode == 0, status.stderr
    assert any(
        line.startswith("progress") and "300/1000 (30.0%)  acc 0.3000  loss 0.4500" in line
        for line in status.stdout.splitlines()
    ), status.stdout

    page = httpx.get(f"{grid.url}/jobs/{job_id}", headers={"accept": "text/html"}, timeout=30)
    assert page.status_code == 200
    assert '<progress id="job-progress-bar" max="1000" value="300">30.0%</progress>' in page.text
    assert page.text.count('class="chart metric-chart"') == 2
    assert 'data-metric="loss" data-points="3"' in page.text
    assert "attempt 1, checkpoint 3:" in page.text and "resumes from attempt 1" in page.text
    event = _first_job_event(f"{grid.url}/api/jobs/{job_id}/stream")
    assert 'id="job-progress"' in event["html"] and 'value="300"' in event["html"]
    assert event["view"]["checkpoints"]["resume"]["seq"] == 3

    # the page in Chromium: the card as served, then the bar moved live by checkpoint 4
    assert Path("/usr/bin/chromium").exists(), "run scripts/setup_services.sh (apt chromium)"
    shot = ROOT / ".run" / "screenshots" / "job-progress.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    browser = subprocess.Popen(
        ["node", "-e", BROWSER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT, env={**os.environ, "NODE_PATH": str(ROOT / "node_modules"),
                       "GM_PAGE": f"{grid.url}/jobs/{job_id}", "GM_SHOT": str(shot)},
    )  # fmt: skip
    assert browser.stdout is not None
    ready = browser.stdout.readline()
    assert ready.strip() == '{"ready":true}', ready

    # follow: in a pipe one line per new point; on a terminal one redrawn line
    follow = subprocess.Popen(
        [sys.executable, "-m", "frontend_api.submitter_cli", "progress", "-f", job_id],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=grid.tmp,
        env=grid.env(),
    )  # fmt: skip
    drawn: list[str] = []
    printed: list[str] = []
    fe = Frontend(grid.url)
    tty = threading.Thread(
        target=show_progress,
        args=(fe, job_id),
        kwargs={
            "follow": True,
            "tty": True,
            "poll_s": 0.3,
            "write": drawn.append,
            "echo": printed.append,
            "timeout": 120,
        },
        daemon=True,
    )
    tty.start()
    time.sleep(3)  # both have printed the report and poll
    grid.checkpoint(job_id, 4, 400, 0.3)
    time.sleep(3)
    grid.checkpoint(job_id, 5, 500, 0.2)
    time.sleep(3)
    r = grid.node.report(
        job_id, {"attempt": 1, "reason": "exit_code", "exit_code": 1, "duration_s": 9.0}
    )
    assert r.status_code == 202 and r.json()["status"] == "failed", r.text
    seen_out, seen_err = browser.communicate(timeout=90)
    assert browser.returncode == 0, seen_err
    seen = json.loads(seen_out.strip().splitlines()[-1])
    assert seen["first"] == "300" and seen["charts"] == 2 and seen["width"] > 200, seen
    assert seen["text"][:16] in ("400 / 1000 steps", "500 / 1000 steps"), seen
    assert not seen["errors"], seen
    stdout, stderr = follow.communicate(timeout=90)
    tty.join(90)
    fe.close()
    assert follow.returncode == 0, stderr
    new = [line for line in stdout.splitlines() if "  attempt 1  step " in line]
    assert [line.split("  ")[2] for line in new] == ["step 400/1000", "step 500/1000"], stdout
    assert new[-1].endswith("50.0%  acc 0.5000  loss 0.2000"), new
    assert "\r" not in stdout and "\x1b" not in stdout
    assert stdout.splitlines()[-1].startswith(f"job {job_id} is failed: 500/1000 (50.0%)")
    assert not tty.is_alive()
    assert any("400/1000" in d for d in drawn) and any("500/1000" in d for d in drawn), drawn
    assert all(d.startswith("\r") and d.endswith("\x1b[K") for d in drawn[:-1]), drawn
    assert drawn[-1] == "\n" and printed[-1].startswith(f"job {job_id} is failed"), printed

    # a job without a checkpoint policy says so
    plain = submit_job(grid.client, grid.ipfs, devnet.submitters[0], PLAIN)
    grid.server.wait_job(plain, {"queued"})
    none = grid.gm("progress", plain)
    assert none.returncode == 0 and "has no checkpoint policy" in none.stdout, none.stdout
    page = httpx.get(f"{grid.url}/jobs/{plain}", headers={"accept": "text/html"}, timeout=30)
    assert page.status_code == 200 and 'id="job-progress"' not in page.text
