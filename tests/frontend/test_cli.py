"""The submitter CLI (``python -m frontend_api.submitter_cli``, the ``gridmarket`` console
script) from a terminal against the real stack: init a keystore; submit every example of
examples/jobs (WASM, Docker, Python + numpy) as docs/submitter.md shows, until Released, then
status, logs, get (integrity-checked, the outputs compared with what they should be), jobs;
cancel and withdraw; the terms (default and explicit; a bad mediator, collateral or payment
mode refused naming it); a result submitted by hand (signed acceptance, the operator's
``assign``) disputed, accepted, or finalized by anyone after its window; and bad job files
refused with the field named before anything is uploaded or funded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from eth_account.signers.local import LocalAccount

from devstack._process import ManagedProcess
from devstack.dockerd import Dockerd
from devstack.images import publish_python_image
from devstack.torch_image import publish_torch_image
from gridmarket.cid import bytes_cid, path_cid
from gridmarket.escrow import Status
from gridmarket.keystore import create_keystore, keystore_address
from tests.frontend.conftest import CHALLENGE_WINDOW_S, FrontendStack

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "jobs"
PASSWORD = "cli-test-password"


def _cli_env(stack: FrontendStack, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_")}
    env.update(
        {
            "GRIDMARKET_URL": stack.frontend_url,
            "GRIDMARKET_KEYSTORE": str(home / "submitter.json"),
            "GRIDMARKET_PASSWORD": PASSWORD,
        }
    )
    return env


def gm(stack: FrontendStack, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "frontend_api.submitter_cli", *args],
        capture_output=True,
        text=True,
        cwd=home,
        env=_cli_env(stack, home),
        timeout=240,
        check=False,
    )


@pytest.fixture(scope="module")
def home(frontend_stack: FrontendStack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A submitter's folder whose keystore holds the stack's submitter key (a cheap KDF, so
    each command below does not spend a second unlocking it)."""
    home = tmp_path_factory.mktemp("submitter")
    key = bytes(frontend_stack.submitter.key)
    create_keystore(home / "submitter.json", PASSWORD, private_key=key, iterations=2**10)
    return home


def test_init_creates_or_imports_a_keystore_and_never_overwrites_one(
    stack: FrontendStack, tmp_path: Path
) -> None:
    made = gm(stack, tmp_path, "init")
    assert made.returncode == 0, made.stderr
    address = made.stdout.strip().splitlines()[-1]
    assert keystore_address(tmp_path / "submitter.json") == address
    assert (tmp_path / "submitter.json").stat().st_mode & 0o777 == 0o600
    again = gm(stack, tmp_path, "init")
    assert again.returncode == 1 and "refusing to overwrite" in again.stderr
    key = tmp_path / "key.txt"
    key.write_text("0x" + bytes(stack.submitter.key).hex())
    imported = gm(stack, tmp_path, "init", "--private-key-file", str(key), "--force")
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().splitlines()[-1] == stack.submitter.address
    wrong = subprocess.run(
        [sys.executable, "-m", "frontend_api.submitter_cli", "--url", stack.frontend_url,
         "--keystore", str(tmp_path / "submitter.json"), "withdraw"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "GRIDMARKET_PASSWORD": "not-it"},
    )  # fmt: skip
    assert wrong.returncode == 1 and "wrong password" in wrong.stderr


EXAMPLE_FILES = [
    "wasm-csvstats.yaml",
    "docker-hours-by-tier.yaml",
    "python-hours-regression.yaml",
    "train-mlp.yaml",
]
DATA = ROOT / "examples" / "datasets" / "gpu-hours" / "data.csv"
NEWLINE = b"\n"
DOCKER_AGENT_PASSWORD = "cli-docker-agent"


def _start_docker_agent(
    stack: FrontendStack, dockerd: Dockerd, work: Path
) -> tuple[ManagedProcess, LocalAccount]:
    """A provider's agent serving Docker jobs only (the stack's agent serves WASM), on the
    session's dockerd, in eu-west (the Docker example's region)."""
    provider = stack.devnet.providers[2]
    if not stack.escrow.call("providerOf", provider.address)[3]:
        stack.escrow.send(provider, "registerProvider", "bafkreiclidocker", value=5 * 10**16)
    keystore = work / "keystore.json"
    create_keystore(keystore, DOCKER_AGENT_PASSWORD, private_key=bytes(provider.key),
                    iterations=2**10)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_")}
    env.update(
        {
            "GRIDMARKET_AGENT_SCHEDULER_URL": stack.scheduler.url,
            "GRIDMARKET_AGENT_IPFS_API": stack.ipfs_api,
            "GRIDMARKET_AGENT_KEYSTORE": str(keystore),
            "GRIDMARKET_AGENT_PASSWORD": DOCKER_AGENT_PASSWORD,
            "GRIDMARKET_AGENT_REGION": "eu-west",
            "GRIDMARKET_AGENT_NAME": "cli-docker-node",
            "GRIDMARKET_AGENT_EXECUTORS": '["docker"]',
            "GRIDMARKET_AGENT_DOCKER_HOST": dockerd.host,
            "GRIDMARKET_AGENT_WORK_DIR": str(work / "work"),
            "GRIDMARKET_AGENT_POLL_WAIT_S": "2",
            "GRIDMARKET_AGENT_BACKOFF_CAP_S": "2",
            "GRIDMARKET_AGENT_SLOTS": "2",
            # the stack's registry, on loopback, explicitly
            "GRIDMARKET_AGENT_PULL_REGISTRIES": json.dumps(
                ["public", stack.get("/api/info").json()["registry"]]
            ),
        }
    )
    agent = ManagedProcess(
        "docker agent",
        [sys.executable, "-m", "agent.cli", "run"],
        work / "agent.log",
        env=env,
        cwd=ROOT,
    )
    agent.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = _scheduler_nodes(stack)
        if any(n["name"] == "cli-docker-node" and n["status"] == "online" for n in nodes):
            return agent, provider
        assert agent.running(), agent.log_path.read_text()[-3000:]
        time.sleep(0.3)
    agent.stop()
    pytest.fail(f"the Docker agent did not come online: {agent.log_path}", pytrace=False)


def _scheduler_nodes(stack: FrontendStack) -> list[dict[str, Any]]:
    response = httpx.get(stack.scheduler.url + "/v1/nodes", timeout=5)
    return list(response.json()["nodes"])


@pytest.fixture(scope="module")
def example_runs(
    frontend_stack: FrontendStack,
    home: Path,
    dockerd: Dockerd,
    docker_client: docker.DockerClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[subprocess.CompletedProcess[str], str]]:
    """Every example of examples/jobs submitted exactly as docs/submitter.md shows, from the
    checkout: ``gridmarket submit examples/jobs/<file> --wait`` (the file's own terms: paid
    after the challenge window, which the scheduler then finalizes), the three following each
    other as soon as the previous one is funded, while a Docker agent runs beside the stack's
    WASM one and the chain gets an empty block every second, as on `make up`'s devnet. The
    Docker agent stops before the other tests of this module run (their Docker jobs must stay
    queued). Each run, with its provider."""
    stack = frontend_stack
    registry = stack.get("/api/info").json()["registry"]
    publish_python_image(docker_client, registry)  # the stack's registry holds busybox only
    publish_torch_image(docker_client, registry)
    agent, docker_provider = _start_docker_agent(
        stack, dockerd, tmp_path_factory.mktemp("docker-agent")
    )
    env = _cli_env(stack, home)
    idle = threading.Event()
    miner = threading.Thread(target=_idle_blocks, args=(stack, idle), daemon=True)
    miner.start()
    try:
        runs: dict[str, _Run] = {}
        for name in EXAMPLE_FILES:
            command = ["submit", f"examples/jobs/{name}", "--wait"]  # as the docs show
            runs[name] = run = _Run(command, env)
            # the next submit once this one is funded (its first line, the job id): one key
            # signs all three, and two createJob signed at once would share a nonce
            run.first_line.wait(120)
        done: dict[str, tuple[subprocess.CompletedProcess[str], str]] = {}
        for name, run in runs.items():
            provider = (stack.provider if name.startswith("wasm") else docker_provider).address
            done[name] = (run.result(timeout=240), provider)
    finally:
        idle.set()
        miner.join()
        agent.stop()
    return done


class _Run:
    """``gridmarket ARGS`` from the checkout, its output read as it comes (``first_line`` set
    on the first line of stdout, or when the command ends)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "frontend_api.submitter_cli", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.first_line = threading.Event()
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)
            if into is self.out:
                self.first_line.set()
        self.first_line.set()

    def result(self, timeout: float) -> subprocess.CompletedProcess[str]:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for reader in self.readers:
            reader.join(10)
        return subprocess.CompletedProcess(
            self.proc.args, self.proc.returncode, "".join(self.out), "".join(self.err)
        )


def _idle_blocks(stack: FrontendStack, stop: threading.Event) -> None:
    """An empty block every second, as `make up`'s anvil mines when idle: the chain's clock
    moves, so a challenge window closes on time (this stack's anvil mines only on demand)."""
    while not stop.wait(1.0):
        stack.mine()


def _expected_hours_by_tier() -> str:
    """What the Docker example's awk | sort writes: GPU-hours per tier, sorted."""
    hours: dict[str, int] = {}
    for row in DATA.read_text().splitlines()[1:]:
        tier, _region, h, _price = row.split(",")
        hours[tier] = hours.get(tier, 0) + int(h)
    return "".join(sorted(f"{tier} {total}\n" for tier, total in hours.items()))


def _close(a: Any, b: Any, path: str = "") -> None:
    """Same JSON, floats within 1e-4 relative (6 significant digits, any BLAS)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-9), path
    else:
        assert a == b, path


@pytest.mark.parametrize("example", EXAMPLE_FILES)
def test_every_example_runs_as_the_docs_show_until_released(
    example: str,
    example_runs: dict[str, tuple[subprocess.CompletedProcess[str], str]],
    stack: FrontendStack,
    home: Path,
    tmp_path: Path,
) -> None:
    done, provider = example_runs[example]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    job_id = lines[0]
    assert job_id.startswith("0x") and len(job_id) == 66
    assert f"{stack.frontend_url}/jobs/{job_id}" in done.stdout
    assert "paid after the challenge window" in done.stdout
    assert "released (on-chain released)" in done.stdout
    if example.startswith("docker") or example.startswith("python"):
        assert "@sha256:" in done.stderr  # "image TAG -> PINNED": the tag was resolved

    status = gm(stack, home, "status", job_id, "--json")
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    assert view["chain_status"] == "released"
    assert view["chain"]["submitter"] == stack.submitter.address
    assert view["chain"]["provider"] == provider
    text = gm(stack, home, "status", job_id)
    assert "released" in text.stdout and provider in text.stdout
    logs = gm(stack, home, "logs", job_id)
    assert logs.returncode == 0 and "success" in logs.stdout, logs.stdout
    jobs = gm(stack, home, "jobs")
    assert jobs.returncode == 0 and job_id in jobs.stdout
    payouts = stack.get("/api/payouts", params={"job": job_id}).json()["payouts"]
    assert len(payouts) == 1 and payouts[0]["provider"] == provider

    out = tmp_path / "out"
    got = gm(stack, home, "get", job_id, "-o", str(out))
    assert got.returncode == 0, got.stderr
    assert path_cid(out) == view["output_cid"]
    assert "integrity-checked" in got.stderr and "verified" not in got.stderr
    if example == "wasm-csvstats.yaml":
        assert view["chain"]["bounty_wei"] == str(10**15)
        stats = (out / "stats.txt").read_text()
        data = DATA.read_bytes()
        assert f"bytes={len(data)}" in stats
        assert f"lines={data.count(NEWLINE)}" in stats and "fields=" in stats
        direct = tmp_path / "direct"  # straight from an IPFS node, not through the front end
        got = subprocess.run(
            [sys.executable, "-m", "frontend_api.submitter_cli", "--ipfs-api", stack.ipfs_api,
             "get", view["output_cid"], "-o", str(direct)],
            capture_output=True, text=True, cwd=home, timeout=60, check=False,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        assert path_cid(direct) == view["output_cid"]
    elif example == "docker-hours-by-tier.yaml":
        assert view["chain"]["bounty_wei"] == str(2 * 10**15)
        assert (out / "hours-by-tier.txt").read_text() == _expected_hours_by_tier()
    elif example == "train-mlp.yaml":
        assert sorted(p.name for p in out.iterdir()) == [
            "loss.csv", "loss.svg", "metrics.json", "model.pt",
        ]  # fmt: skip
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["steps"] == 3000 and metrics["resumes"] == 0, metrics
        rows = (out / "loss.csv").read_text().splitlines()
        assert rows[0] == "step,loss" and len(rows) > 100
        progress = gm(stack, home, "progress", job_id)  # the job's checkpoints, as docs show
        assert progress.returncode == 0, progress.stderr
        assert "3000" in progress.stdout or "100 %" in progress.stdout, progress.stdout
    else:
        assert view["chain"]["bounty_wei"] == str(3 * 10**15)
        assert sorted(p.name for p in out.iterdir()) == ["plot.svg", "result.json"]
        local = tmp_path / "local"  # the same script, run here on the same data
        ran = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "python" / "hours_regression.py"),
             str(DATA), str(local)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        _close(json.loads((out / "result.json").read_text()),
               json.loads((local / "result.json").read_text()))  # fmt: skip
        svg = (out / "plot.svg").read_text()
        assert "<svg" in svg and svg.rstrip().endswith("</svg>")


def test_cancel_then_withdraw_from_the_terminal(
    stack: FrontendStack, home: Path, tmp_path: Path
) -> None:
    job = tmp_path / "waits.yaml"  # a Docker job: the stack's agent serves WASM only
    job.write_text(
        'name: waits\nexecutor: docker\nimage: gridmarket/busybox:test\ncommand: ["true"]\n'
        "limits: {timeout_s: 60}\nbounty: 0.003\ndeadline: 30m\n"
    )
    done = gm(stack, home, "submit", str(job))
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.splitlines()[0]
    assert f"mediator {stack.mediator.address}, collateral 0.003 ETH" in done.stdout
    assert f"paid after the challenge window ({CHALLENGE_WINDOW_S} s" in done.stdout
    stack.wait_job(job_id, {"queued"}, timeout=30)
    cancelled = gm(stack, home, "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled" in cancelled.stdout
    twice = gm(stack, home, "cancel", job_id)
    assert twice.returncode == 1 and "JobEscrowWrongStatus" in twice.stderr
    early = gm(stack, home, "refund", job_id)
    assert early.returncode == 1 and "refund would revert" in early.stderr
    withdrawn = gm(stack, home, "withdraw")
    assert withdrawn.returncode == 0, withdrawn.stderr
    assert "withdrew" in withdrawn.stdout
    assert stack.escrow.balance_of(stack.submitter.address) == 0


def test_bad_job_files_are_refused_naming_the_field(
    stack: FrontendStack, home: Path, tmp_path: Path
) -> None:
    before = stack.escrow.w3.eth.get_transaction_count(stack.submitter.address)
    cases = {
        "executor: docker\nimage: busybox\nbounty: 0.01\nresources: {ram_mib: 1}\n": (
            "resources.ram_mib"
        ),
        "executor: wasm\nbounty: 0.01\n": "module_cid",
        "executor: docker\nimage: busybox\nbounty: 0.01\ndeadline: soon\n": "deadline",
        "executor: docker\nimage: busybox\nbounty: lots\n": "bounty_eth",
        "executor: docker\nimage: busybox\n": "bounty",
        "executor: docker\nimage: busybox\nbounty: 0.01\ndataset: ./missing\n": "dataset",
        "executor: docker\nimage: busybox\nbounty: 0.01\ndeadline: 10s\n": "ttl_s",
        "executor: docker\nimage: busybox\nbounty: 99999\n": "not enough ETH",
        "- just\n- a list\n": "mapping",
        "executor: docker\nimage: busybox\nbounty: 0.01\npayment: someday\n": "payment",
        "executor: docker\nimage: busybox\nbounty: 0.01\nmediator: 0x12\n": "mediator",
        "executor: docker\nimage: busybox\nbounty: 0.01\ncollateral: 0.001\n": "collateral_eth",
    }
    for n, (text, words) in enumerate(cases.items()):
        path = tmp_path / f"bad{n}.yaml"
        path.write_text(text)
        done = gm(stack, home, "submit", str(path))
        assert done.returncode == 1, (text, done.stdout)
        assert words in done.stderr, (text, done.stderr)
        assert "Traceback" not in done.stderr
    assert stack.escrow.w3.eth.get_transaction_count(stack.submitter.address) == before

    # the Docker example is well-formed: checked end to end without funding it
    dry = gm(stack, home, "submit", "--dry-run", str(EXAMPLES / "docker-hours-by-tier.yaml"))
    assert dry.returncode == 0, dry.stderr
    assert "would lock 0.002 ETH" in dry.stdout
    # its image tag was pinned to the digest in the registry the front end advertises
    info = stack.get("/api/info").json()
    assert f"image gridmarket/busybox:test -> {info['registry']}/gridmarket/busybox@sha256:" in (
        dry.stderr
    )
    bad_id = gm(stack, home, "status", "0x1234")
    assert bad_id.returncode == 1 and "not a job id" in bad_id.stderr


def _docker_job(tmp_path: Path, name: str, bounty: str = "0.004") -> Path:
    """A Docker job file: the stack's agent serves WASM only, so nobody runs it but the test."""
    job = tmp_path / f"{name}.yaml"
    job.write_text(
        f'name: {name}\nexecutor: docker\nimage: gridmarket/busybox:test\ncommand: ["true"]\n'
        f"limits: {{timeout_s: 60}}\nbounty: {bounty}\ndeadline: 30m\n"
    )
    return job


def _submitted(stack: FrontendStack, home: Path, job: Path, *options: str) -> str:
    """Fund ``job`` from the CLI, then assign it by hand and submit a result for it."""
    done = gm(stack, home, "submit", str(job), *options)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = done.stdout.splitlines()[0]
    stack.assign_by_hand(job_id)
    stack.submit_by_hand(job_id, bytes_cid(f"cli output {job.stem}".encode()))
    stack.wait_chain(job_id, "submitted")
    return job_id


def test_terms_from_the_terminal_default_explicit_and_refused(
    stack: FrontendStack, home: Path, tmp_path: Path
) -> None:
    job = _docker_job(tmp_path, "terms")
    before = stack.escrow.w3.eth.get_transaction_count(stack.submitter.address)
    for options, words in (
        (("--mediator", "0x1234"), "mediator"),
        (("--mediator", stack.provider.address), "not a listed mediator"),
        (("--mediator", stack.devnet.operator.address), "operator"),
        (("--collateral", "0.0001"), "collateral_eth: the collateral must be at least"),
        (("--collateral", "much"), "collateral_eth"),
        (("--payment", "later"), "--payment"),
    ):
        done = gm(stack, home, "submit", str(job), *options)
        assert done.returncode == 1, (options, done.stdout)
        assert words in done.stderr, (options, done.stderr)
        assert "Traceback" not in done.stderr
    assert stack.escrow.w3.eth.get_transaction_count(stack.submitter.address) == before

    dry = gm(stack, home, "submit", "--dry-run", str(job))
    assert dry.returncode == 0, dry.stderr
    assert f"mediator {stack.mediator.address}, collateral 0.004 ETH" in dry.stdout

    me = stack.submitter.address
    done = gm(
        stack,
        home,
        "submit",
        str(job),
        "--mediator",
        me,
        "--collateral",
        "0.01",
        "--payment",
        "on-verify",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["terms"] == {
        "mediator": me,
        "collateral_wei": str(10**16),
        "flags": 1,
        "payment": "on_verify",
        "token": "0x" + "00" * 20,  # paid in ETH
        "operator": stack.devnet.operator.address,  # who assigns it: the one in office
    }
    state = stack.chain_job(out["job_id"])
    assert state.job.mediator == me and state.job.collateral == 10**16 and state.job.on_verify
    status = gm(stack, home, "status", out["job_id"])
    assert "on the scheduler's check" in status.stdout and "0.01 ETH" in status.stdout
    assert gm(stack, home, "cancel", out["job_id"]).returncode == 0

    # the same terms from the job file; an option overrides the file
    in_file = tmp_path / "terms-in-file.yaml"
    in_file.write_text(job.read_text() + f"mediator: {me}\ncollateral: 0.02\npayment: on-verify\n")
    done = gm(stack, home, "submit", str(in_file), "--collateral", "0.03", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["terms"]["mediator"] == me and out["terms"]["payment"] == "on_verify"
    assert out["terms"]["collateral_wei"] == str(3 * 10**16)
    assert gm(stack, home, "cancel", out["job_id"]).returncode == 0
    listed = gm(stack, home, "jobs")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(out["job_id"])]
    assert "on check" in row and "refunded" in row


def test_dispute_accept_and_finalize_from_the_terminal(
    stack: FrontendStack, home: Path, tmp_path: Path
) -> None:
    # one result left alone: its window closes while the others are handled
    waiting = _submitted(stack, home, _docker_job(tmp_path, "left-alone"))
    window_ends = stack.job(waiting)["chain"]["terms"]["window_ends"]

    disputed = _submitted(stack, home, _docker_job(tmp_path, "disputed"))
    status = gm(stack, home, "status", disputed)
    assert status.returncode == 0, status.stderr
    assert "window" in status.stdout and "closes" in status.stdout
    assert "accept, dispute" in status.stdout  # what "you may" do now
    done = gm(stack, home, "dispute", disputed)
    assert done.returncode == 0, done.stderr
    assert "disputed (tx 0x" in done.stdout
    # the deposit is the job's bounty (0.004 ETH), above the escrow's floor of 0.001 ETH
    assert "deposit  0.004 ETH" in done.stdout and stack.mediator.address in done.stdout
    assert stack.chain_job(disputed).status is Status.DISPUTED
    again = gm(stack, home, "dispute", disputed)
    assert again.returncode == 1 and "JobEscrowWrongStatus" in again.stderr
    # the mediator upholds it: the provider is paid, the deposit pays the mediator
    state, sent = stack.rule_by_hand(disputed, upheld=True)
    assert state.status is Status.RELEASED
    assert [e.name for e in sent.events] == ["Ruled", "Credited", "JobReleased"]
    stack.wait_chain(disputed, "released")
    status = gm(stack, home, "status", disputed)
    assert "ruling" in status.stdout and "upheld" in status.stdout

    accepted = _submitted(stack, home, _docker_job(tmp_path, "accepted"))
    early = gm(stack, home, "finalize", accepted)
    assert early.returncode == 1 and "JobEscrowChallengeWindowOpen" in early.stderr
    done = gm(stack, home, "accept", accepted)
    assert done.returncode == 0, done.stderr
    assert "accepted: the provider is paid" in done.stdout
    assert stack.chain_job(accepted).status is Status.RELEASED

    # anyone finalizes the result nobody disputed once its window has passed
    outsider = tmp_path / "outsider"
    outsider.mkdir()
    key = bytes(stack.devnet.providers[0].key)
    create_keystore(outsider / "submitter.json", PASSWORD, private_key=key, iterations=2**10)
    time.sleep(max(0.0, window_ends - time.time() + 1))
    stack.mine()
    late = gm(stack, home, "dispute", waiting)
    assert late.returncode == 1 and "JobEscrowChallengeWindowClosed" in late.stderr
    done = gm(stack, outsider, "finalize", waiting)
    assert done.returncode == 0, done.stderr
    assert "finalized: the provider is paid" in done.stdout
    state = stack.chain_job(waiting)
    assert state.status is Status.RELEASED
    (payout,) = stack.get("/api/payouts", params={"job": waiting}).json()["payouts"]
    assert payout["provider"] == stack.manual_provider.address
