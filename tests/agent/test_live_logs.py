"""Live logs against the real grid of ``test_daemon`` (scheduler process, anvil, IPFS, dockerd):

* a Docker job printing a line a second: its lines reach the scheduler while it still runs,
  with their attempt, node, stream and timestamps, and stay after the run;
* a node that is not the attempt's assignee is refused (403);
* a chatty job (megabytes a second) is capped (rate and per-attempt cap, one truncation note)
  while the node's heartbeats keep their pace;
* :class:`agent.logship.LogShipper` on its own: lines, control characters, caps.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from agent.client import NodeSession, SchedulerAuthError, SchedulerRejectedError
from agent.logship import LogShipper, LogShipperSettings
from gridmarket.joblogs import JOB_LOGS, LogBatch, LogChunk
from gridmarket.wire import NodeCapacityIn
from scheduler.lifecycle import State
from tests.agent.test_daemon import Stack, docker_job, stack, start_agent

__all__ = ["stack"]  # the fixture, shared with test_daemon


def read_logs(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    after = 0
    while True:
        r = httpx.get(
            stack.url + JOB_LOGS.format(job_id=job_id), params={"after": after}, timeout=10
        )
        r.raise_for_status()
        body = r.json()
        lines += body["lines"]
        if not body["more"]:
            return lines
        after = body["next"]


def test_lines_arrive_while_the_job_runs_and_stay_after(stack: Stack, test_image: str) -> None:
    stack.escrow.send(stack.provider, "registerProvider", "bafkreiagenttest", value=10**17)
    agent, thread = start_agent(stack.config(), stack.provider)
    try:
        script = (
            "for i in 1 2 3 4 5 6 7 8; do echo line $i; echo err $i >&2; sleep 1; done; "
            "printf 'bell\\a esc\\033[31m\\n'; echo done > /output/o.txt"
        )
        job_id = stack.submit(docker_job(test_image, script))
        # the scheduler answers 404 until its watcher has indexed the job: wait for that first
        stack.wait_job(job_id, {s.value for s in State}, timeout=30)
        deadline = time.monotonic() + 60
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            seen = read_logs(stack, job_id)
            if any(line["text"] == "line 2\n" for line in seen):
                break
            time.sleep(0.3)
        assert any(line["text"] == "line 2\n" for line in seen), seen
        assert job_id in agent.running
        assert stack.job(job_id)["state"] == "leased"  # before the run ended
        assert not any("line 8" in line["text"] for line in seen)

        # a node that is not the assignee is refused
        other = stack.devnet.providers[1]
        stack.escrow.send(other, "registerProvider", "bafkreiother", value=10**17)
        capacity = NodeCapacityIn(
            cpu_cores=1, ram_mib=512, disk_mib=1024, region="us", executors=["docker"]
        )
        with NodeSession(stack.url, other, name="intruder", capacity=capacity) as session:
            batch = LogBatch(
                attempt=1, seq=99, chunks=[LogChunk(stream="stdout", ts=1.0, text="forged\n")]
            )
            with pytest.raises(SchedulerAuthError) as refused:
                session.post_logs(job_id, batch)
            assert refused.value.status == 403
        job = stack.wait_job(job_id, {"released"}, timeout=90)
    finally:
        agent.stop()
        thread.join(60)
    lines = read_logs(stack, job_id)
    out = [line["text"] for line in lines if line["stream"] == "stdout"]
    err = [line["text"] for line in lines if line["stream"] == "stderr"]
    assert out[:8] == [f"line {i}\n" for i in range(1, 9)]
    assert err == [f"err {i}\n" for i in range(1, 9)]
    assert out[8] == "bell\\x07 esc\\x1b[31m\n"  # control characters escaped
    assert "forged\n" not in out
    node_id = job["attempts"][0]["node_id"]
    assert {(line["attempt"], line["node_id"]) for line in lines} == {(1, node_id)}
    stamps = [line["ts"] for line in lines if line["stream"] == "stdout"]
    assert stamps == sorted(stamps) and stamps[7] - stamps[0] >= 5  # read as they came


def test_a_chatty_job_is_capped_and_heartbeats_keep_their_pace(
    stack: Stack, test_image: str
) -> None:
    stack.escrow.send(stack.provider, "registerProvider", "bafkreiagenttest", value=10**17)
    agent, thread = start_agent(stack.config(), stack.provider)
    agent.live_logs = LogShipperSettings(rate=32 * 1024, cap=96 * 1024)
    beats: list[float] = []
    heartbeat = agent.client.heartbeat

    def timed(*args: Any, **kwargs: Any) -> Any:
        beats.append(time.monotonic())
        return heartbeat(*args, **kwargs)

    agent.client.heartbeat = timed  # type: ignore[method-assign]
    try:
        # about 6 s of output as fast as the container can write it (many MB)
        script = (
            "end=$(( $(date +%s) + 6 )); while [ $(date +%s) -lt $end ]; do "
            "yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c 1000000; done; "
            "echo ok > /output/o.txt"
        )
        job_id = stack.submit(docker_job(test_image, script))
        stack.wait_job(job_id, {"leased"}, timeout=60)
        while job_id not in agent.running:
            time.sleep(0.05)
        started = time.monotonic()
        stack.wait_job(job_id, {"released"}, timeout=120)
        ended = time.monotonic()
    finally:
        agent.stop()
        thread.join(60)
    during = [b for b in beats if started <= b <= ended]
    assert ended - started >= 5
    gaps = [b - a for a, b in zip([started, *during], [*during, ended], strict=True)]
    assert max(gaps) < 3.0, gaps  # heartbeat interval 1 s: never held up by the logs
    lines = read_logs(stack, job_id)
    job_chars = sum(len(line["text"]) for line in lines if line["stream"] == "stdout")
    assert 32 * 1024 <= job_chars <= 96 * 1024  # the cap, not the megabytes
    notes = [line["text"] for line in lines if line["stream"] == "system"]
    assert any("past the cap of 98304 bytes" in n for n in notes), notes
    assert sum("past the cap" in n for n in notes) == 1


def test_shipper_cuts_lines_cleans_and_caps() -> None:
    batches: list[LogBatch] = []
    lock = threading.Lock()

    def post(job_id: str, batch: LogBatch) -> None:
        with lock:
            batches.append(batch)

    settings = LogShipperSettings(rate=10**9, cap=10_000, flush_s=0.1, max_line=100)
    with LogShipper(post, "0x" + "ab" * 32, 2, settings) as ship:
        ship.feed("stdout", b"hel")
        ship.feed("stdout", b"lo\nwor")
        ship.feed("stderr", b"\xff\x1b[2Jboom\n")
        ship.feed("stdout", b"x" * 250 + b"\n")
        time.sleep(0.3)
        ship.feed("stdout", b"y" * 20_000)
    chunks = [c for b in batches for c in b.chunks]
    assert [b.seq for b in batches] == list(range(len(batches)))
    assert all(b.attempt == 2 for b in batches)
    texts = [(c.stream, c.text) for c in chunks]
    assert texts[0] == ("stdout", "hello\n")
    assert ("stderr", "\ufffd\\x1b[2Jboom\n") in texts
    assert ("stdout", "x" * 100) in texts  # a long line is cut
    kept = sum(len(t) for s, t in texts if s == "stdout")
    assert kept <= 10_000
    assert texts[-1][0] == "system" and "bytes dropped past the cap" in texts[-1][1]
    assert ship.dropped_cap == 3 + 6 + 10 + 251 + 20_000 - 10_000


def test_shipper_drops_refused_batches_at_once_and_stops_on_a_scheduler_without_logs() -> None:
    calls: list[int] = []

    def post(job_id: str, batch: LogBatch) -> None:
        calls.append(batch.seq)
        status = 404 if batch.seq else 403
        raise SchedulerRejectedError(f"refused ({status})", status, "no")

    settings = LogShipperSettings(flush_s=0.05, retry_s=5.0)  # a retry would take seconds
    started = time.monotonic()
    with LogShipper(post, "0x" + "cd" * 32, 1, settings) as ship:
        ship.feed("stdout", b"one\n")
        time.sleep(0.3)
        ship.feed("stdout", b"two\n")
        time.sleep(0.3)
        ship.feed("stdout", b"three\n")  # after the 404: not even buffered
    assert time.monotonic() - started < 3
    assert calls == [0, 1]  # 403: dropped, not retried; 404: nothing more sent
    assert ship.disabled and ship.failed_batches == 2 and ship.posted_batches == 0
