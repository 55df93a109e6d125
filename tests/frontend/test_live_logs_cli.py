"""Live logs through the front end, against the real stack (scheduler, front end, anvil, IPFS, a
Docker agent on dockerd): a job printing a line a second is submitted from the terminal;
``gridmarket logs -f JOB`` prints its lines (time, attempt, node, stream) while it runs and
exits once the run is over; the job page's log stream (SSE) carries the same lines, then
``end``; ``gridmarket logs JOB`` afterwards prints what was kept."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import docker
import httpx

from devstack.dockerd import Dockerd
from tests.frontend.conftest import FrontendStack
from tests.frontend.test_cli import _cli_env, _Run, _start_docker_agent, gm, home

__all__ = ["home"]  # the submitter's keystore fixture, shared with test_cli

JOB = """\
name: live-logs
executor: docker
image: gridmarket/busybox:test
command:
  - /bin/sh
  - -c
  - for i in 1 2 3 4 5 6; do echo tick $i; echo warn $i >&2; sleep 1; done; echo ok > /output/o
resources:
  cpu_cores: 1
  ram_mib: 256
  disk_mib: 64
  region: eu-west
limits:
  timeout_s: 120
  output_max_bytes: 1048576
max_attempts: 2
bounty: 0.001
deadline: 2h
"""


def _sse(url: str, into: list[dict[str, Any]], ended: threading.Event) -> None:
    with httpx.stream("GET", url, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
                if event == "end":
                    ended.set()
                    return
            elif line.startswith("data: ") and event == "log":
                into.extend(json.loads(line[6:])["lines"])


def test_logs_follow_and_the_job_page_stream_show_lines_live(
    stack: FrontendStack,
    home: Path,
    dockerd: Dockerd,
    docker_client: docker.DockerClient,
    tmp_path: Path,
) -> None:
    agent, provider = _start_docker_agent(stack, dockerd, tmp_path / "docker-agent")
    try:
        job_file = tmp_path / "live.yaml"
        job_file.write_text(JOB)
        submitted = gm(stack, home, "submit", str(job_file))
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job_id = submitted.stdout.splitlines()[0].strip()
        assert job_id.startswith("0x") and len(job_id) == 66

        follow = _Run(["logs", "-f", job_id, "--timeout", "180"], _cli_env(stack, home))
        streamed: list[dict[str, Any]] = []
        ended = threading.Event()
        reader = threading.Thread(
            target=_sse,
            args=(f"{stack.frontend_url}/api/jobs/{job_id}/logs/stream", streamed, ended),
            daemon=True,
        )
        reader.start()

        deadline = time.monotonic() + 120
        while not any("tick 1" in line for line in follow.out):
            assert time.monotonic() < deadline, "".join(follow.out + follow.err)
            assert follow.proc.poll() is None, "".join(follow.out + follow.err)
            time.sleep(0.2)
        # a line printed while the job still runs (it prints for 6 s)
        assert (stack.job(job_id).get("scheduler") or {}).get("state") == "leased"
        assert not any("tick 6" in line for line in follow.out)

        done = follow.result(timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert ended.wait(60), streamed
        reader.join(10)
    finally:
        agent.stop()
    out = done.stdout.splitlines()
    ticks = [line for line in out if "tick" in line]
    assert [t.rsplit("  ", 1)[1] for t in ticks] == [f"tick {i}" for i in range(1, 7)], out
    node_id = (stack.job(job_id)["scheduler"]["attempts"][0])["node_id"]
    assert all(f"attempt 1  {node_id}  stdout" in t for t in ticks), ticks
    assert any(f"attempt 1  {node_id}  stderr  warn 6" in line for line in out), out
    assert any(line.startswith(f"attempt 1 on {node_id}") for line in out), out

    assert [line["text"] for line in streamed if line["stream"] == "stdout"] == [
        f"tick {i}\n" for i in range(1, 7)
    ]
    assert all(line["seat"] is None and line["node_id"] == node_id for line in streamed)

    again = gm(stack, home, "logs", job_id)  # after the run: what arrived is kept
    assert again.returncode == 0 and again.stdout.count("tick") == 6, again.stdout
    page = stack.get(f"/jobs/{job_id}", headers={"accept": "text/html"})
    assert page.status_code == 200 and 'id="job-logs"' in page.text
    assert provider.address  # the Docker agent ran it
