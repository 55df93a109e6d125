"""``gridmarket submit --currency tUSD`` against the real stack: the CLI signs the EIP-2612 permit
and the ``multicall([permitToken, createJobWith])`` with the local key, ``--wait`` follows the
job (assigned and given a result by hand, accepted by the submitter) and prints the payout in
tUSD; ``status`` and ``jobs`` show tUSD; ``dispute`` of a tUSD job deposits its bounty in
tUSD; an unknown currency, too many decimals and a bounty above the token balance are refused
with one line naming the problem, and nothing is funded or uploaded.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gridmarket.cid import bytes_cid
from gridmarket.keystore import create_keystore
from gridmarket.token import TokenClient
from tests.frontend.conftest import FrontendStack
from tests.frontend.test_api import relay, sign
from tests.frontend.test_cli import PASSWORD, ROOT, _cli_env, gm

TUSD = 10**6

JOB_FILE = """\
name: {name}
executor: docker
image: gridmarket/busybox:test
command: ["true"]
limits:
  timeout_s: 60
deadline: 2h
"""


@pytest.fixture(scope="module")
def home(frontend_stack: FrontendStack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A submitter's folder whose keystore holds the stack's submitter key (tUSD granted)."""
    home = tmp_path_factory.mktemp("token-submitter")
    key = bytes(frontend_stack.submitter.key)
    create_keystore(home / "submitter.json", PASSWORD, private_key=key, iterations=2**10)
    return home


def job_file(home: Path, name: str) -> Path:
    path = home / f"{name}.yaml"
    path.write_text(JOB_FILE.format(name=name))
    return path


def test_submit_in_tusd_by_permit_and_wait_shows_tusd(stack: FrontendStack, home: Path) -> None:
    token = stack.devnet.token
    tusd = TokenClient(stack.escrow.w3, token)
    before = tusd.balance_of(stack.submitter.address)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "frontend_api.submitter_cli",
            "submit",
            str(job_file(home, "cli-tusd")),
            "--currency",
            "tUSD",
            "--bounty",
            "5",
            "--wait",
            "--timeout",
            "180",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=home,
        env=_cli_env(stack, home),
    )
    try:
        assert proc.stdout is not None
        job_id = proc.stdout.readline().strip()
        assert job_id.startswith("0x") and len(job_id) == 66, (
            job_id,
            proc.stderr and proc.stderr.read(),
        )
        assert tusd.balance_of(stack.submitter.address) == before - 5 * TUSD
        chain = stack.wait_chain(job_id, "funded")["chain"]
        assert chain["token"] == token and chain["bounty_wei"] == str(5 * TUSD)
        collateral = int(chain["terms"]["collateral_wei"])
        stack.client().stake_token(stack.manual_provider, token, max(collateral, TUSD))
        stack.assign_by_hand(job_id)
        stack.submit_by_hand(job_id, bytes_cid(b"cli tusd output"))
        stack.wait_chain(job_id, "submitted")
        accept = stack.post(
            f"/api/jobs/{job_id}/accept/prepare", json={"from": stack.submitter.address}
        )
        assert accept.status_code == 200, accept.text
        relay(stack, sign(accept.json()["tx"], stack.submitter))
        proc.wait(timeout=120)
        out = proc.stdout.read()  # the rest, after the job id (buffered in the same reader)
        err = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    text = job_id + "\n" + out
    assert "funded   5 tUSD" in text, text
    assert " tUSD, paid after the challenge window" in text, text  # the collateral, in tUSD
    assert "you pay 5 tUSD for one run" in text, text
    paid = [line for line in text.splitlines() if line.startswith("paid ")]
    assert paid and paid[-1].endswith(" tUSD)") and " tUSD to " in paid[-1], text
    assert " ETH" not in text.replace("ETH ", ""), text

    status = gm(stack, home, "status", job_id)
    assert status.returncode == 0, status.stderr
    assert "5 tUSD" in status.stdout and "provider gets" in status.stdout
    jobs = gm(stack, home, "jobs")
    assert jobs.returncode == 0, jobs.stderr
    (row,) = [line for line in jobs.stdout.splitlines() if line.startswith(job_id)]
    assert "5 tUSD" in row


def test_dispute_of_a_tusd_job_deposits_the_bounty_in_tusd(
    stack: FrontendStack, home: Path
) -> None:
    token = stack.devnet.token
    tusd = TokenClient(stack.escrow.w3, token)
    submitted = gm(
        stack, home, "submit", str(job_file(home, "cli-tusd-dispute")), "--currency", "tusd",
        "--bounty", "2", "--collateral", "2.5",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.splitlines()[0].strip()
    assert "collateral 2.5 tUSD" in submitted.stdout
    stack.wait_chain(job_id, "funded")
    stack.client().stake_token(stack.manual_provider, token, 3 * TUSD)
    stack.assign_by_hand(job_id)
    stack.submit_by_hand(job_id, bytes_cid(b"cli tusd disputed output"))
    stack.wait_chain(job_id, "submitted")
    before = tusd.balance_of(stack.submitter.address)
    disputed = gm(stack, home, "dispute", job_id)
    assert disputed.returncode == 0, disputed.stderr
    # the deposit is the bounty (JobEscrow.depositOf), not the larger collateral
    assert "deposit  2 tUSD" in disputed.stdout
    assert tusd.balance_of(stack.submitter.address) == before - 2_000_000
    stack.wait_chain(job_id, "disputed")


def test_bad_currency_input_is_refused_and_nothing_is_funded(
    stack: FrontendStack, home: Path
) -> None:
    tusd = TokenClient(stack.escrow.w3, stack.devnet.token)
    balance = tusd.balance_of(stack.submitter.address)
    count = stack.get("/api/jobs", params={"submitter": stack.submitter.address}).json()["count"]
    path = str(job_file(home, "cli-tusd-refused"))
    for args, words in (
        (("--currency", "DOGE", "--bounty", "1"), "--currency: 'DOGE' is not a currency"),
        (("--currency", "tUSD", "--bounty", "1.1234567"), "more than 6 decimals"),
        (("--currency", "tUSD", "--bounty", str(balance // TUSD + 1)), "less than the bounty"),
        (("--currency", "tUSD", "--bounty", "1", "--collateral", "0.0000001"), "6 decimals"),
        (("--currency", "tUSD", "--bounty", "1e300000"), "bounty: '1e300000' is too large"),
        (("--bounty", "1e999999999"), "bounty_eth: '1e999999999' is too large"),
    ):
        result = gm(stack, home, "submit", path, *args)
        assert result.returncode == 1, (args, result.stdout)
        assert words in result.stderr, (args, result.stderr)
        assert (
            "nothing was funded" in result.stderr
            or "currency" in result.stderr
            or ("decimals" in result.stderr)
            or ("is too large" in result.stderr)
        )
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    time.sleep(0.5)
    assert tusd.balance_of(stack.submitter.address) == balance
    after = stack.get("/api/jobs", params={"submitter": stack.submitter.address}).json()["count"]
    assert after == count


def test_the_docs_token_example_is_checked_as_written(stack: FrontendStack, home: Path) -> None:
    """docs/submitter.md's ``gridmarket submit examples/jobs/wasm-csvstats.yaml --currency tUSD
    --bounty 5``, checked end to end short of uploading and funding (``--dry-run``)."""
    doc = (ROOT / "docs" / "submitter.md").read_text()
    command = "gridmarket submit examples/jobs/wasm-csvstats.yaml --currency tUSD --bounty 5"
    assert command in doc
    args = command.split()[1:]
    args[1] = str(ROOT / args[1])
    result = gm(stack, home, *args, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "would lock 5 tUSD" in result.stdout and "collateral 5 tUSD" in result.stdout
