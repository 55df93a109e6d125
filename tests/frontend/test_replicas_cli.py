"""``gridmarket submit --verification replicate:k`` from a terminal against the real stack
(tests/frontend/conftest.py) plus a second agent on a wallet of its own, so that two distinct
providers can hold the seats: the CLI funds ``createReplicated``, ``--wait`` follows every seat
until all are released (both agents run the same WASM module on the same input: they agree)
and prints each seat's state, provider and output CID and the verdict; ``status`` shows the
group. A ``verification:`` key in the job file is read; bad choices are refused naming the
field before anything is uploaded or funded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack._process import ROOT, ManagedProcess
from gridmarket.escrow import cid_digest
from gridmarket.keystore import create_keystore
from tests.frontend.conftest import AGENT_PASSWORD, FrontendStack, _tail
from tests.frontend.test_cli import PASSWORD

SECOND_STAKE = 5 * 10**16


def gm(stack: FrontendStack, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gridmarket ARGS`` run from ``home`` with this checkout's code (PYTHONPATH: a virtual
    environment shared between checkouts may hold another checkout's ``frontend_api``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_")}
    env.update(
        {
            "GRIDMARKET_URL": stack.frontend_url,
            "GRIDMARKET_KEYSTORE": str(home / "submitter.json"),
            "GRIDMARKET_PASSWORD": PASSWORD,
            "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(":"),
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "frontend_api.submitter_cli", *args],
        capture_output=True,
        text=True,
        cwd=home,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def home(frontend_stack: FrontendStack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A submitter's folder whose keystore holds the stack's submitter key."""
    home = tmp_path_factory.mktemp("replicas-submitter")
    key = bytes(frontend_stack.submitter.key)
    create_keystore(home / "submitter.json", PASSWORD, private_key=key, iterations=2**10)
    return home


@pytest.fixture(scope="module")
def second_agent(
    frontend_stack: FrontendStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedProcess]:
    """``python -m agent.cli run`` for a second wallet (dev provider 2), registered and staked,
    serving WASM like the stack's own agent; stopped after this module."""
    stack = frontend_stack
    tmp = tmp_path_factory.mktemp("second-agent")
    wallet = stack.devnet.providers[2]
    escrow = stack.client()
    if not escrow.call("providerOf", wallet.address)[3]:
        escrow.send(wallet, "registerProvider", "bafkreisecondagent", value=SECOND_STAKE)
    keystore = tmp / "agent-keystore.json"
    create_keystore(keystore, AGENT_PASSWORD, private_key=bytes(wallet.key), iterations=2**10)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_")}
    env.update(
        {
            "GRIDMARKET_AGENT_SCHEDULER_URL": stack.scheduler.url,
            "GRIDMARKET_AGENT_IPFS_API": stack.ipfs_api,
            "GRIDMARKET_AGENT_KEYSTORE": str(keystore),
            "GRIDMARKET_AGENT_PASSWORD": AGENT_PASSWORD,
            "GRIDMARKET_AGENT_REGION": "eu-west",
            "GRIDMARKET_AGENT_NAME": "frontend-second-node",
            "GRIDMARKET_AGENT_EXECUTORS": '["wasm"]',
            "GRIDMARKET_AGENT_WORK_DIR": str(tmp / "work"),
            "GRIDMARKET_AGENT_POLL_WAIT_S": "2",
            "GRIDMARKET_AGENT_BACKOFF_CAP_S": "2",
            "GRIDMARKET_AGENT_SLOTS": "2",
        }
    )
    agent = ManagedProcess(
        "agent-2", [sys.executable, "-m", "agent.cli", "run"], tmp / "agent.log", env=env, cwd=ROOT
    )
    agent.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and agent.running():
            nodes = httpx.get(stack.scheduler.url + "/v1/nodes", timeout=5).json()["nodes"]
            if any(n["wallet"] == wallet.address and n["status"] == "online" for n in nodes):
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"the second agent did not come online:\n{_tail(agent.log_path)}")
        yield agent
    finally:
        agent.stop()


def job_file(
    stack: FrontendStack, folder: Path, extra: str = "", bounty: str = "0.004", name: str = "upper"
) -> Path:
    """The stack's uppercase WASM job with a small dataset, as a job file."""
    data = folder / "data"
    data.mkdir(exist_ok=True)
    (data / "data.txt").write_text("replicated gridmarket\n")
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: upper-replicated\nexecutor: wasm\nmodule: {stack.wasm_module}\ndataset: data\n"
        "resources: {cpu_cores: 1, ram_mib: 128, disk_mib: 16}\nlimits: {timeout_s: 60}\n"
        f"bounty: {bounty}\ndeadline: 1h\n{extra}"
    )
    return path


def test_submit_replicate_2_waits_for_every_seat_and_prints_the_verdict(
    stack: FrontendStack, home: Path, second_agent: ManagedProcess, tmp_path: Path
) -> None:
    done = gm(
        stack,
        home,
        "submit",
        str(job_file(stack, tmp_path)),
        "--verification",
        "replicate:2",
        "--wait",
        "--timeout",
        "180",
    )
    assert done.returncode == 0, (
        done.stdout + done.stderr + "\nagent 2 log:\n" + _tail(second_agent.log_path)
    )
    assert "Traceback" not in done.stderr
    out = done.stdout.splitlines()
    job_id = out[0]
    assert (
        "  verify   replicate:2: you pay 0.004 ETH for 2 runs by distinct providers "
        "(0.002 ETH per seat), each provider locks 0.002 ETH of collateral" in out
    )
    group_id = next(line.split()[1] for line in out if line.startswith("  group "))
    seats = [line.split()[2] for line in out if line.startswith("  seat ")]
    assert len(seats) == 2 and seats[0] == job_id
    # --wait printed each seat's final state, provider and output CID on one line each
    view = stack.job(job_id)
    group = view["group"]
    assert group["group_id"] == group_id and group["final"] is True
    output = group["verdict"]["output_cid"]
    providers = {s["provider"] for s in group["seats"]}
    assert providers == {stack.provider.address, stack.devnet.providers[2].address}
    for seat in group["seats"]:
        assert seat["status"] == "released" and seat["output_cid"] == output
        line = f"seat {seat['seat']}  released   {seat['provider']}  {output}  agrees"
        assert any(x.endswith(line) for x in out), (line, out)
    assert f"verdict  2 of 2 agree  output {output}  digest 0x{cid_digest(output).hex()}" in out
    assert "paid     2 seat(s)" in out and "slashed  none" in out
    assert all(len(line) < 200 for line in out)  # nothing wrapped, one record a line

    status = gm(stack, home, "status", seats[1])
    assert status.returncode == 0, status.stderr
    assert re.search(rf"^verify +replicate:2  group {group_id}$", status.stdout, re.M)
    assert re.search(r"^verdict +2 of 2 agree  output ", status.stdout, re.M)
    for n, seat in enumerate(seats):
        assert re.search(rf"^seat {n} +{seat}  released  ", status.stdout, re.M)
    as_json = json.loads(gm(stack, home, "status", seats[1], "--json").stdout)
    assert as_json["group"]["verdict"]["agreeing"] == 2
    # both seats were paid (the explorer's payouts)
    for seat in seats:
        (payout,) = stack.get("/api/payouts", params={"job": seat}).json()["payouts"]
        assert payout["provider"] in providers
    # logs per seat: each seat's attempts, and its WASM run's live stdout ("ok")
    logs = gm(stack, home, "logs", seats[1])
    assert logs.returncode == 0, logs.stderr
    for n in range(2):
        assert re.search(rf"^seat {n}: attempt 1 on n-\S+ .*: success", logs.stdout, re.M), (
            logs.stdout
        )
        assert re.search(
            rf"^[0-9:.]+  seat {n}  attempt 1  n-\S+  stdout  ok$", logs.stdout, re.M
        ), logs.stdout


def test_the_job_file_verification_key_and_bad_choices(
    stack: FrontendStack, home: Path, tmp_path: Path
) -> None:
    path = job_file(stack, tmp_path, "verification: replicate:3\n", bounty="0.006")
    dry = gm(stack, home, "submit", str(path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "replicate:3: you pay 0.006 ETH for 3 runs" in dry.stdout
    assert "(0.002 ETH per seat), each provider locks 0.002 ETH of collateral" in dry.stdout
    # the option overrides the file
    single = gm(stack, home, "submit", str(path), "--dry-run", "--verification", "integrity")
    assert single.returncode == 0 and "integrity: one provider" in single.stdout, single.stderr

    bad_file = job_file(stack, tmp_path, "verification: replicate:7\n", name="bad")
    refused = gm(stack, home, "submit", str(bad_file), "--dry-run")
    assert refused.returncode == 1 and "verification: replicate:7" in refused.stderr
    assert "k must be 2..5" in refused.stderr
    bad_flag = gm(stack, home, "submit", str(path), "--verification", "vote", "--dry-run")
    assert bad_flag.returncode == 1 and "--verification" in bad_flag.stderr
    on_verify = gm(stack, home, "submit", str(path), "--payment", "on-verify", "--dry-run")
    assert on_verify.returncode == 1 and "payment:" in on_verify.stderr, on_verify.stderr
    odd = gm(stack, home, "submit", str(path), "--bounty", "0.007", "--dry-run")
    assert odd.returncode == 1 and "bounty_eth: " in odd.stderr
    assert "must divide by 3" in odd.stderr
