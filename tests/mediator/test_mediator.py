"""The mediator (mediator/, docs/mediator.md) on a real anvil and the real js-ipfs
daemon: it rules wrong a result it cannot fetch or whose CID does not decode, leaves a good one
to be paid and upholds it when disputed (on integrity alone for a job that is not
deterministic; after a re-run on another provider, which it funds itself, for one that is),
ignores other mediators' jobs, resumes from its cursor without ruling twice or funding a second
re-run, and no event stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from eth_account.signers.local import LocalAccount
from multiformats import CID

from devstack.anvil import free_port
from devstack.ipfs import IpfsDaemon
from gridmarket.chain import Deployment, EscrowClient, Event
from gridmarket.cid import bytes_cid
from gridmarket.deploy import list_token
from gridmarket.eip712 import sign_acceptance
from gridmarket.escrow import JobState, Status
from gridmarket.ipfs import IpfsStore
from gridmarket.retry import RetryPolicy
from gridmarket.token import TokenClient
from gridmarket.wire import JobLimits, JobSpec
from mediator import (
    Decision,
    Mediator,
    MediatorConfig,
    MediatorError,
    MediatorState,
    StateError,
)

from ..conftest import ROOT, Devnet
from ..hostile import INVALID_UTF8, escrow_call
from ..scheduler.chain_support import fault_proxy, make_w3
from ..scheduler.harness import advance, fresh_escrow, register_on_chain

BOUNTY = 10**16
HOLD_FOR = 600
OUTPUT_CAP = 4096
SPEC = JobSpec.model_validate(
    {"executor": "docker", "image": "busybox", "limits": JobLimits(output_max_bytes=OUTPUT_CAP)}
)


@pytest.fixture
def escrow(devnet: Devnet) -> tuple[Deployment, EscrowClient]:
    deployment, client = fresh_escrow(devnet, challenge_window=3600, reassign_delay=60)
    for provider in devnet.providers[:2]:
        register_on_chain(client, provider)
    return deployment, client


@pytest.fixture
def store(ipfs_daemon: IpfsDaemon) -> Iterator[IpfsStore]:
    with IpfsStore(ipfs_daemon.api_addr) as s:
        yield s


@pytest.fixture
def spec_cid(store: IpfsStore) -> str:
    return store.add_bytes(SPEC.to_bytes())


CONFIG = MediatorConfig(
    fetch_timeout_s=2.0,
    fetch_attempts=2,
    retry_delay_s=0.3,
    spec_timeout_s=5.0,
    poll_interval_s=0.1,
    window_margin_s=5.0,
)


def mediator(
    devnet: Devnet, deployment: Deployment, ipfs: IpfsDaemon, state: Path, **config: Any
) -> Mediator:
    client = EscrowClient(devnet.w3, deployment)
    return Mediator(
        client,
        devnet.mediator,
        IpfsStore(ipfs.api_addr),
        state,
        replace(CONFIG, **config),
    )


def chain_now(client: EscrowClient) -> int:
    return int(client.w3.eth.get_block("latest")["timestamp"])


def submitted(
    devnet: Devnet,
    client: EscrowClient,
    spec_cid: str,
    output: str | bytes,
    *,
    provider: LocalAccount | None = None,
    mediator: str | None = None,
    submitter: LocalAccount | None = None,
    **changes: Any,
) -> JobState:
    """A job funded by ``submitter`` (default: the devnet's; its mediator: the listed one unless
    ``mediator``; the default terms otherwise, but for ``changes``: ``flags``, ``collateral``),
    assigned to ``provider`` with its acceptance, and its result submitted (``output`` as raw
    bytes goes on chain as they are)."""
    provider = provider or devnet.providers[0]
    submitter = submitter or devnet.submitter
    terms = client.default_terms(BOUNTY, submitter.address)
    if mediator is not None:
        terms = replace(terms, mediator=mediator)
    terms = replace(terms, **changes)
    state, _ = client.create_job(
        submitter, os.urandom(32), spec_cid, chain_now(client) + 3600, BOUNTY, terms
    )
    state = assign(devnet, client, state, provider)
    if isinstance(output, bytes):
        escrow_call(client, provider, "submitResult", state.job_id, state.job.as_tuple(), output)
        state = client.job_state(state.job_id)
    else:
        state, _ = client.call_job(provider, "submitResult", state, output)
    assert state.status is Status.SUBMITTED
    return state


def assign(
    devnet: Devnet, client: EscrowClient, state: JobState, provider: LocalAccount
) -> JobState:
    """The operator assigns ``state`` (a job or a seat) to ``provider``, with its acceptance
    of the job's terms for :data:`HOLD_FOR` seconds."""
    acceptance = sign_acceptance(
        provider,
        client.deployment.chain_id,
        client.address,
        state.job_id,
        state.job.attempt + 1,
        state.job,
        HOLD_FOR,
    )
    state, _ = client.assign(devnet.operator, state, provider.address, HOLD_FOR, acceptance)
    return state


def until(med: Mediator, done: Callable[[], bool], timeout: float = 30.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        med.poll_once()
        if done():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout} s: {med.decisions}")


def decision(med: Mediator, job: JobState, kind: str = "check") -> Decision | None:
    found = [d for d in med.decisions if d.job_id == job.job_id and d.kind == kind]
    assert len(found) <= 1, found
    return found[0] if found else None


def status(client: EscrowClient, job: JobState) -> Status:
    return Status(client.call("statusOf", job.job_id))


def ruled_events(client: EscrowClient, job: JobState) -> list[Event]:
    return [
        e
        for e in client.events(client.deployment.block, "latest", [None, "0x" + job.job_id.hex()])
        if e.name == "Ruled"
    ]


def test_an_unreachable_output_is_ruled_wrong_and_the_collateral_goes_to_the_submitter(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    spec_cid: str,
    tmp_path: Path,
) -> None:
    deployment, client = escrow
    missing = bytes_cid(b"never added " + os.urandom(16))
    job = submitted(devnet, client, spec_cid, missing)
    before = client.balance_of(devnet.submitter.address)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        t0 = time.monotonic()
        until(med, lambda: decision(med, job) is not None, what="the ruling")
        took = time.monotonic() - t0
        d = decision(med, job)
        assert d is not None and d.verdict == "not upheld" and d.upheld is False
        assert "unreachable after 2 tries" in d.reason and missing in d.reason
        assert took >= 2 * CONFIG.fetch_timeout_s  # two checks, each up to its time limit
        assert d.tx_hash is not None
        assert status(client, job) is Status.FUNDED
        assert client.balance_of(devnet.submitter.address) - before == job.job.collateral
        receipt = client.w3.eth.get_transaction_receipt(d.tx_hash)  # type: ignore[arg-type]
        (slashed,) = [e for e in client.decode_logs(receipt["logs"]) if e.name == "ProviderSlashed"]
        assert slashed.args["amount"] == job.job.collateral
        assert slashed.args["toMediator"] == 0  # not disputed: no re-run fee
        assert slashed.args["provider"] == devnet.providers[0].address
        # the next poll folds its own ruling: the job is Funded again, the ruling confirmed
        med.poll_once()
        folded = med.state.job(job.job_id)
        assert folded is not None and folded.status is Status.FUNDED
        ruling = med.state.ruling(job.job_id, job.job.attempt)
        assert ruling is not None and ruling.outcome == "confirmed" and not ruling.upheld
        assert ruling.tx_hash == d.tx_hash


def test_an_output_over_the_spec_cap_or_with_an_invalid_cid_is_ruled_wrong_at_once(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    spec_cid: str,
    tmp_path: Path,
) -> None:
    deployment, client = escrow
    big = store.add_bytes(os.urandom(OUTPUT_CAP + 1))
    too_large = submitted(devnet, client, spec_cid, big)
    poison = submitted(devnet, client, spec_cid, INVALID_UTF8, provider=devnet.providers[1])
    assert poison.output_problem is not None
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        until(med, lambda: len(med.decisions) == 2, what="two rulings")
        big_d, poison_d = decision(med, too_large), decision(med, poison)
        assert big_d is not None and big_d.verdict == "not upheld"
        assert "too_large (the job spec's cap)" in big_d.reason
        assert poison_d is not None and poison_d.verdict == "not upheld"
        assert "output CID unusable: not valid UTF-8" in poison_d.reason
        assert status(client, too_large) is Status.FUNDED
        assert status(client, poison) is Status.FUNDED


def test_a_good_result_is_left_alone_then_upheld_when_disputed(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    spec_cid: str,
    tmp_path: Path,
) -> None:
    deployment, client = escrow
    output = store.add_bytes(b"the provider's real output\n" + os.urandom(16))
    job = submitted(devnet, client, spec_cid, output)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        until(med, lambda: decision(med, job) is not None, what="the check")
        d = decision(med, job)
        assert d is not None and d.verdict == "no ruling" and d.tx_hash is None
        assert "integrity ok" in d.reason and output in d.reason
        assert status(client, job) is Status.SUBMITTED
        assert med.state.ruling(job.job_id, job.job.attempt) is None
        assert ruled_events(client, job) == []

        deposit = int(client.call("depositOf", job.job.as_tuple()))
        client.send(devnet.submitter, "dispute", job.job_id, job.job.as_tuple(), value=deposit)
        mediator_before = client.balance_of(devnet.mediator.address)
        until(med, lambda: decision(med, job, "dispute") is not None, what="the ruling")
        d = decision(med, job, "dispute")
        assert d is not None and d.verdict == "upheld" and d.tx_hash is not None
        assert "integrity only: the job is not deterministic" in d.reason  # busybox by tag
        assert med.state.reruns() == []
        assert status(client, job) is Status.RELEASED
        assert client.balance_of(devnet.mediator.address) - mediator_before == deposit
        (ruled,) = ruled_events(client, job)
        assert ruled.args["upheld"] is True


def test_a_disputed_result_that_fails_is_ruled_wrong(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    spec_cid: str,
    tmp_path: Path,
) -> None:
    """The submitter disputes before the mediator has looked: the dispute is ruled on (the
    check of the submitted result is moot once the job is Disputed)."""
    deployment, client = escrow
    job = submitted(devnet, client, spec_cid, INVALID_UTF8)
    deposit = int(client.call("depositOf", job.job.as_tuple()))
    client.send(devnet.submitter, "dispute", job.job_id, job.job.as_tuple(), value=deposit)
    before = client.balance_of(devnet.submitter.address)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        until(med, lambda: decision(med, job, "dispute") is not None, what="the ruling")
        d = decision(med, job, "dispute")
        assert d is not None and d.verdict == "not upheld"
        assert decision(med, job, "check") is None
        assert status(client, job) is Status.FUNDED
        # the deposit (the job's bounty) back, plus the collateral less the mediator's re-run
        assert deposit == job.job.bounty
        to_mediator = min(2 * deposit, job.job.collateral)
        assert client.balance_of(devnet.submitter.address) - before == (
            deposit + job.job.collateral - to_mediator
        )


def test_a_ruling_refused_because_the_job_was_disputed_meanwhile_does_not_block_the_dispute(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    spec_cid: str,
    tmp_path: Path,
) -> None:
    deployment, client = escrow
    job = submitted(devnet, client, spec_cid, INVALID_UTF8)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        med.watcher.poll_once()  # it knows the result, has not checked it yet
        deposit = int(client.call("depositOf", job.job.as_tuple()))
        client.send(devnet.submitter, "dispute", job.job_id, job.job.as_tuple(), value=deposit)
        med.work()  # rules on the Submitted job it knows: the escrow refuses (it is Disputed)
        refused = decision(med, job)
        assert refused is not None and refused.verdict == "no ruling"
        assert "refused by the escrow (JobEscrowJobMismatch" in refused.reason
        until(med, lambda: decision(med, job, "dispute") is not None, what="the ruling")
        d = decision(med, job, "dispute")
        assert d is not None and d.verdict == "not upheld"
    assert status(client, job) is Status.FUNDED
    assert len(ruled_events(client, job)) == 1


def test_a_job_naming_another_mediator_is_ignored(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    spec_cid: str,
    tmp_path: Path,
) -> None:
    deployment, client = escrow
    # the submitter names itself as mediator (the contract allows it), with a poisoned result
    other = submitted(devnet, client, spec_cid, INVALID_UTF8, mediator=devnet.submitter.address)
    ours = submitted(devnet, client, spec_cid, INVALID_UTF8, provider=devnet.providers[1])
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        until(med, lambda: decision(med, ours) is not None, what="the ruling on its own job")
        med.poll_once()
        assert decision(med, other) is None
        assert med.state.job(other.job_id) is None
        assert med.counters["jobs_ignored"] == 1
        assert status(client, other) is Status.SUBMITTED
        assert ruled_events(client, other) == []


def test_a_restart_resumes_from_the_cursor_and_never_rules_twice(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    spec_cid: str,
    tmp_path: Path,
) -> None:
    deployment, client = escrow
    path = tmp_path / "m.db"
    first = submitted(devnet, client, spec_cid, INVALID_UTF8)
    with mediator(devnet, deployment, ipfs_daemon, path) as med:
        until(med, lambda: decision(med, first) is not None, what="the first ruling")
        # stop before its own Ruled event is folded: a crash right after sending
        cursor = med.state.load()
    assert cursor is not None
    second = submitted(devnet, client, spec_cid, INVALID_UTF8, provider=devnet.providers[1])
    with mediator(devnet, deployment, ipfs_daemon, path) as med:
        assert med.state.load() == cursor
        until(med, lambda: decision(med, second) is not None, what="the ruling after restart")
        med.poll_once()
        assert [d.job_id for d in med.decisions] == [second.job_id]
        assert {r.job_id: r.outcome for r in med.state.rulings()} == {
            first.job_id: "confirmed",
            second.job_id: "confirmed",
        }
        assert (med.state.load() or 0) > cursor
    with mediator(devnet, deployment, ipfs_daemon, path) as med:  # and once more: nothing new
        med.poll_once()
        assert med.decisions == []
    assert len(ruled_events(client, first)) == 1
    assert len(ruled_events(client, second)) == 1


def test_an_event_that_does_not_fold_is_skipped_and_the_rest_are_handled(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    spec_cid: str,
    tmp_path: Path,
) -> None:
    """Forged events (ones that cannot follow the job's state, one missing its arguments) in
    the same batch as the real ones: refused and counted, the cursor moves, the real result is
    still ruled on."""
    deployment, client = escrow
    job = submitted(devnet, client, spec_cid, INVALID_UTF8)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        real = client.events(deployment.block)
        (created,) = [e for e in real if e.name == "JobCreated"]
        head = int(client.w3.eth.block_number)
        reassigned = Event(
            name="JobAssigned",
            args={
                "jobId": job.job_id,
                "provider": devnet.providers[1].address,
                "previousProvider": job.job.provider,
                "attempt": 9,
                "since": 1,
            },
            block=head,
            tx_hash="0x" + "ab" * 32,
            log_index=0,
        )
        no_args = replace(reassigned, name="ResultDisputed", args={"jobId": job.job_id})
        med.watcher.sink([*real, reassigned, no_args, created], head)
        assert med.counters["events_refused"] == 3
        assert med.state.load() == head
        folded = med.state.job(job.job_id)
        assert folded is not None and folded.status is Status.SUBMITTED
        assert folded.job.attempt == 1
        until(med, lambda: decision(med, job) is not None, what="the ruling")
        d = decision(med, job)
        assert d is not None and d.verdict == "not upheld"


def test_a_ruling_whose_reply_is_lost_is_never_sent_twice(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    spec_cid: str,
    tmp_path: Path,
) -> None:
    """Through a JSON-RPC proxy in front of the real anvil: the first ruling reaches the node
    but its reply is lost (the mediator then finds it in the events and never sends it again);
    the second never reaches the node (sent again after backoff, once)."""
    deployment, client = escrow
    lost = submitted(devnet, client, spec_cid, INVALID_UTF8)
    with fault_proxy(devnet.url) as proxy:
        med = Mediator(
            EscrowClient(make_w3(proxy.url), deployment),
            devnet.mediator,
            IpfsStore(ipfs_daemon.api_addr),
            tmp_path / "m.db",
            replace(CONFIG, error_backoff=RetryPolicy(initial_delay_s=0.2, max_delay_s=0.5)),
        )
        with med:
            proxy.fail(1, "eth_sendRawTransaction", forward=True)
            until(med, lambda: decision(med, lost) is not None, what="the lost ruling")
            assert med.counters["errors"] == 1
            d = decision(med, lost)
            assert d is not None and d.verdict == "not upheld"
            assert "confirmed by its Ruled event" in d.reason
            assert proxy.counts["eth_sendRawTransaction"] == 1

            unsent = submitted(devnet, client, spec_cid, INVALID_UTF8, provider=devnet.providers[1])
            proxy.fail(1, "eth_sendRawTransaction")
            until(med, lambda: decision(med, unsent) is not None, what="the resent ruling")
            assert med.counters["errors"] == 2
            d = decision(med, unsent)
            assert d is not None and d.verdict == "not upheld" and d.tx_hash is not None
            assert proxy.counts["eth_sendRawTransaction"] == 3
            med.poll_once()
            assert {r.outcome for r in med.state.rulings()} == {"confirmed"}
    for job in (lost, unsent):
        assert len(ruled_events(client, job)) == 1
        assert status(client, job) is Status.FUNDED


def test_no_ruling_once_the_challenge_window_is_about_to_close(
    devnet: Devnet, ipfs_daemon: IpfsDaemon, spec_cid: str, tmp_path: Path
) -> None:
    deployment, client = fresh_escrow(devnet, challenge_window=20)
    register_on_chain(client, devnet.providers[0])
    job = submitted(devnet, client, spec_cid, INVALID_UTF8)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db", window_margin_s=30) as med:
        until(med, lambda: decision(med, job) is not None, what="the decision")
        d = decision(med, job)
        assert d is not None and d.verdict == "no ruling" and "challenge window closes" in d.reason
    assert status(client, job) is Status.SUBMITTED
    assert ruled_events(client, job) == []


def test_its_own_ipfs_daemon_down_never_slashes_the_provider(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    spec_cid: str,
    tmp_path: Path,
) -> None:
    """An output this mediator cannot fetch because its own daemon is down is not the
    provider's fault: the check waits (no try counted against the provider), nothing is sent."""
    deployment, client = escrow
    job = submitted(devnet, client, spec_cid, bytes_cid(b"never added " + os.urandom(16)))
    dead = f"/ip4/127.0.0.1/tcp/{free_port()}/http"
    med = Mediator(
        EscrowClient(devnet.w3, deployment),
        devnet.mediator,
        IpfsStore(dead),
        tmp_path / "m.db",
        CONFIG,
    )
    with med:
        deadline = time.monotonic() + 2.0  # several checks, each failing at once
        while time.monotonic() < deadline:
            med.poll_once()
            time.sleep(0.1)
        assert med.decisions == []
        (task,) = med.state.pending_tasks()
        assert task.job_id == job.job_id and task.tries == 0
        assert "IPFS daemon is down" in task.note
    assert status(client, job) is Status.SUBMITTED
    assert ruled_events(client, job) == []


def test_refuses_the_operator_key_and_another_escrows_state(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    tmp_path: Path,
) -> None:
    deployment, client = escrow
    with (
        IpfsStore(ipfs_daemon.api_addr) as ipfs,
        pytest.raises(MediatorError, match="operator"),
    ):
        Mediator(client, devnet.operator, ipfs, tmp_path / "op.db", CONFIG)
    other = tmp_path / "other.db"
    MediatorState(other, escrow="0x" + "11" * 20, chain_id=deployment.chain_id).close()
    with pytest.raises(StateError, match="belongs to escrow"):
        mediator(devnet, deployment, ipfs_daemon, other)


def test_the_command_line_runs_until_terminated(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    spec_cid: str,
    tmp_path: Path,
) -> None:
    deployment, client = escrow
    dep_file = tmp_path / "deployment.json"
    deployment.save(dep_file)
    args = [
        sys.executable,
        "-m",
        "mediator",
        "run",
        "--rpc-url",
        devnet.url,
        "--deployment",
        str(dep_file),
        "--ipfs-api",
        ipfs_daemon.api_addr,
        "--state",
        str(tmp_path / "cli.db"),
        "--poll-interval",
        "0.2",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GRIDMARKET_MEDIATOR_KEY", None)
    no_key = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert no_key.returncode == 2 and "GRIDMARKET_MEDIATOR_KEY" in no_key.stderr
    env["GRIDMARKET_MEDIATOR_KEY"] = "0x" + bytes(devnet.mediator.key).hex()
    job = submitted(devnet, client, spec_cid, INVALID_UTF8)
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while status(client, job) is not Status.FUNDED and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        assert status(client, job) is Status.FUNDED
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    (line,) = [ln for ln in out.splitlines() if "mediator decision" in ln]
    assert f"job 0x{job.job_id.hex()} attempt 1" in line
    assert "verdict=not_upheld" in line and "not valid UTF-8" in line


# --------------------------------------------------------------------------- re-runs

WASM_SPEC = JobSpec.model_validate(
    {
        "executor": "wasm",
        "module_cid": bytes_cid(b"a module the re-run tests never run"),
        "limits": JobLimits(output_max_bytes=OUTPUT_CAP),
    }
)


def disputed(devnet: Devnet, client: EscrowClient, job: JobState) -> int:
    """The submitter disputes ``job``'s result; the deposit (``depositOf``: its bounty)."""
    deposit = int(client.call("depositOf", job.job.as_tuple()))
    client.send(devnet.submitter, "dispute", job.job_id, job.job.as_tuple(), value=deposit)
    return deposit


def take_rerun(
    devnet: Devnet, client: EscrowClient, rerun_id: bytes, provider: LocalAccount, output: str
) -> JobState:
    """Do what the market does with the mediator's re-run: ``provider`` accepts it, the
    operator assigns it, ``provider`` posts ``output``."""
    state = client.job_state(rerun_id)
    assert state.status is Status.FUNDED
    state = assign(devnet, client, state, provider)
    state, _ = client.call_job(provider, "submitResult", state, output)
    return state


def to_base58btc(cid: str) -> str:
    """The same CID in another text encoding (``z...``)."""
    return str(CID.decode(cid).set(base="base58btc"))


def jobs_funded_by(client: EscrowClient, account: str) -> list[Event]:
    return [
        e
        for e in client.events(client.deployment.block, "latest")
        if e.name == "JobCreated" and e.args["submitter"] == account
    ]


def test_a_disputed_deterministic_result_is_rerun_elsewhere_and_ruled_wrong_when_it_differs(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
) -> None:
    """A plausible wrong output (intact, valid CID) of a WASM job: the dispute makes the
    mediator fund a re-run excluding the provider and the submitter; the re-run's output
    differs (and is intact), so the mediator holds it unpaid and funds the tie-break (run 2,
    excluding the first re-run's provider too), which agrees with the first re-run: the result
    is ruled wrong (2 of 3), the provider pays out of its collateral, and the mediator releases
    both re-runs."""
    deployment, client = escrow
    register_on_chain(client, devnet.providers[2])
    second_honest = devnet.providers[2]
    spec_cid = store.add_bytes(WASM_SPEC.to_bytes())
    wrong = store.add_bytes(b"mean=41.0\n")  # plausible, intact, and not what the job computes
    right = store.add_bytes(b"mean=42.5\n")
    job = submitted(devnet, client, spec_cid, wrong)
    cheater, honest = devnet.providers[0], devnet.providers[1]
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        until(med, lambda: decision(med, job) is not None, what="the check")
        assert decision(med, job).verdict == "no ruling"  # type: ignore[union-attr]
        deposit = disputed(devnet, client, job)
        until(med, lambda: bool(med.state.reruns()), what="the re-run")
        (rerun,) = med.state.reruns()
        assert (rerun.job_id, rerun.attempt, rerun.status) == (job.job_id, 1, "funded")
        spec = JobSpec.from_bytes(store.cat(rerun.spec_cid, max_bytes=1 << 16))
        assert spec.exclude_providers == [cheater.address, devnet.submitter.address]
        assert spec.model_copy(update={"exclude_providers": [], "name": "job"}) == WASM_SPEC
        funded = client.job_state(rerun.rerun_id)
        assert funded.job.submitter == funded.job.mediator == devnet.mediator.address
        assert funded.job.bounty == job.job.bounty and funded.spec_cid == rerun.spec_cid
        assert decision(med, job, "dispute") is None  # waiting for the re-run
        mediator_before = client.balance_of(devnet.mediator.address)
        honest_before = client.balance_of(honest.address)
        take_rerun(devnet, client, rerun.rerun_id, honest, right)
        until(med, lambda: med.state.rerun(job.job_id, 1, run=2) is not None, what="run 2")
        assert decision(med, job, "dispute") is None  # one re-run no longer decides
        assert med.state.rerun(job.job_id, 1).status == "held"  # type: ignore[union-attr]
        # held unpaid: the escrow's challenge window (1 h) is shorter than its mediation
        # window (3 days), so the mediator disputed its own re-run to hold it
        assert Status(client.call("statusOf", rerun.rerun_id)) is Status.DISPUTED
        tie = med.state.rerun(job.job_id, 1, run=2)
        assert tie is not None and tie.rerun_id != rerun.rerun_id
        tie_spec = JobSpec.from_bytes(store.cat(tie.spec_cid, max_bytes=1 << 16))
        assert tie_spec.exclude_providers == [
            cheater.address,
            devnet.submitter.address,
            honest.address,
        ]
        take_rerun(devnet, client, tie.rerun_id, second_honest, to_base58btc(right))
        until(med, lambda: decision(med, job, "dispute") is not None, what="the ruling")
        d = decision(med, job, "dispute")
        assert d is not None and d.verdict == "not upheld", d
        assert right in d.reason and wrong in d.reason and "different CID" in d.reason
        assert "the same as re-run 1 (2 of 3)" in d.reason
        assert Status(client.call("statusOf", tie.rerun_id)) is Status.RELEASED
        assert status(client, job) is Status.FUNDED  # to be done again elsewhere
        receipt = client.w3.eth.get_transaction_receipt(d.tx_hash)  # type: ignore[arg-type]
        (slashed,) = [e for e in client.decode_logs(receipt["logs"]) if e.name == "ProviderSlashed"]
        assert slashed.args["provider"] == cheater.address
        assert slashed.args["toMediator"] == min(2 * deposit, job.job.collateral)
        assert Status(client.call("statusOf", rerun.rerun_id)) is Status.RELEASED
        paid = funded.job.bounty - funded.job.bounty * funded.job.fee_bps // 10_000
        assert client.balance_of(honest.address) - honest_before == paid
        # the cheater's collateral pays the mediator; the deposit of its hold on the first
        # re-run comes back to it (upheld, as that job's mediator)
        hold = int(client.call("depositOf", funded.job.as_tuple()))
        assert client.balance_of(devnet.mediator.address) - mediator_before == hold + min(
            2 * deposit, job.job.collateral
        )
        # the liar's collateral pays up to two re-runs; this one's (the least: one bounty) pays
        # one, so the tie-break is the mediator's
        assert min(2 * deposit, job.job.collateral) == funded.job.bounty
        assert [r.status for r in med.state.reruns()] == ["compared", "compared"]
    assert len(jobs_funded_by(client, devnet.mediator.address)) == 2
    events = client.events(deployment.block, "latest")
    assert [e.args["provider"] for e in events if e.name == "ProviderSlashed"] == [cheater.address]


@pytest.mark.parametrize("challenge_window", [400_000, 40], ids=["long-window", "short-window"])
def test_a_lying_rerun_is_outvoted_by_the_tie_break_and_slashed_across_a_restart(
    devnet: Devnet,
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
    challenge_window: int,
) -> None:
    """The disputed result is right and the first re-run lies (a plausible, intact wrong
    output): the mediator does not rule yet, holds the first re-run unpaid and funds the
    tie-break; it restarts between the two re-runs (it finds both rows and funds nothing
    twice); the tie-break agrees with the disputed result: upheld, the honest provider keeps
    its stake, and the lying re-runner is ruled wrong on its own job, its collateral to the
    mediator. With a challenge window shorter than the dispute's mediation window the mediator
    holds the first re-run by disputing it (as its submitter) and rules on it as its mediator."""
    deployment, client = fresh_escrow(devnet, challenge_window=challenge_window, reassign_delay=60)
    honest, liar, tie_breaker = devnet.providers[:3]
    for provider in (honest, liar, tie_breaker):
        register_on_chain(client, provider)
    spec_cid = store.add_bytes(WASM_SPEC.to_bytes())
    right = store.add_bytes(b"mean=42.5\n" + os.urandom(8))
    wrong = store.add_bytes(b"mean=41.0\n" + os.urandom(8))
    job = submitted(devnet, client, spec_cid, right, provider=honest)
    stake_before = client.free_collateral_of(honest.address)
    path = tmp_path / "m.db"
    with mediator(devnet, deployment, ipfs_daemon, path) as med:
        deposit = disputed(devnet, client, job)
        until(med, lambda: bool(med.state.reruns()), what="the re-run")
        (first,) = med.state.reruns()
        take_rerun(devnet, client, first.rerun_id, liar, wrong)
        until(med, lambda: len(med.state.reruns()) == 2, what="the tie-break")
        for _ in range(3):
            med.poll_once()
        rows = med.state.reruns()
        assert [(r.run, r.status) for r in rows] == [(1, "held"), (2, "funded")]
        assert decision(med, job, "dispute") is None
        held = Status(client.call("statusOf", first.rerun_id))
        long_window = challenge_window > int(client.call("mediationWindow"))
        assert held is (Status.SUBMITTED if long_window else Status.DISPUTED)
    with mediator(devnet, deployment, ipfs_daemon, path) as med:
        for _ in range(5):
            med.poll_once()
        assert med.state.reruns() == rows  # both rows found, nothing funded again
        assert len(jobs_funded_by(client, devnet.mediator.address)) == 2
        mediator_before = client.balance_of(devnet.mediator.address)
        take_rerun(devnet, client, rows[1].rerun_id, tie_breaker, to_base58btc(right))
        until(med, lambda: decision(med, job, "dispute") is not None, what="the ruling")
        d = decision(med, job, "dispute")
        assert d is not None and d.verdict == "upheld", d
        assert "the same as the disputed result (2 of 3)" in d.reason and wrong in d.reason
        assert status(client, job) is Status.RELEASED
        until(
            med,
            lambda: Status(client.call("statusOf", first.rerun_id)) is Status.REFUNDED,
            what="the lying re-run ruled wrong and cancelled",
        )
        (liar_ruling,) = [x for x in med.decisions if x.job_id == first.rerun_id]
        assert liar_ruling.verdict == "not upheld" and "tie-break outvoted it" in liar_ruling.reason
        assert Status(client.call("statusOf", rows[1].rerun_id)) is Status.RELEASED
    slashes = [e for e in client.events(deployment.block, "latest") if e.name == "ProviderSlashed"]
    (slash,) = slashes
    assert slash.args["provider"] == liar.address
    assert bytes(slash.args["jobId"]) == first.rerun_id
    collateral = client.job_state(first.rerun_id).job.collateral
    assert slash.args["amount"] == collateral
    # the disputing submitter's deposit pays the mediator, the liar's collateral pays it too,
    # the lying re-run's bounty comes back (cancelled), and so does the deposit of its hold
    liar_job = client.job_state(first.rerun_id).job
    held_deposit = 0 if long_window else int(client.call("depositOf", liar_job.as_tuple()))
    gained = client.balance_of(devnet.mediator.address) - mediator_before
    assert gained == deposit + collateral + first.bounty + held_deposit
    assert client.free_collateral_of(honest.address) == stake_before + job.job.collateral
    assert len(jobs_funded_by(client, devnet.mediator.address)) == 2


def test_a_disputed_honest_result_is_upheld_after_the_rerun_even_across_a_restart(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
) -> None:
    """The re-run gives the same output (as a CIDv0 text: compared as binary CIDs): upheld,
    the deposit pays the mediator. The mediator restarts between funding the re-run and its
    result: it funds no second re-run and still rules."""
    deployment, client = escrow
    spec_cid = store.add_bytes(WASM_SPEC.to_bytes())
    output = store.add_bytes(b"mean=42.5\n" + os.urandom(8))
    job = submitted(devnet, client, spec_cid, output)
    path = tmp_path / "m.db"
    with mediator(devnet, deployment, ipfs_daemon, path) as med:
        deposit = disputed(devnet, client, job)
        until(med, lambda: bool(med.state.reruns()), what="the re-run")
        (rerun,) = med.state.reruns()
    with mediator(devnet, deployment, ipfs_daemon, path) as med:
        for _ in range(5):
            med.poll_once()
        assert med.state.reruns() == [rerun]
        mediator_before = client.balance_of(devnet.mediator.address)
        same = to_base58btc(output)
        take_rerun(devnet, client, rerun.rerun_id, devnet.providers[1], same)
        until(med, lambda: decision(med, job, "dispute") is not None, what="the ruling")
        d = decision(med, job, "dispute")
        assert d is not None and d.verdict == "upheld" and "the same CID" in d.reason, d
        assert status(client, job) is Status.RELEASED
        assert client.balance_of(devnet.mediator.address) - mediator_before == deposit
        assert Status(client.call("statusOf", rerun.rerun_id)) is Status.RELEASED
        # the submitter who was wrong paid the re-run: the mediator is made whole
        assert deposit == client.job_state(rerun.rerun_id).job.bounty
    assert len(jobs_funded_by(client, devnet.mediator.address)) == 1


def test_a_dispute_with_no_time_for_a_rerun_is_ruled_on_integrity_and_says_so(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
) -> None:
    deployment, client = escrow
    spec_cid = store.add_bytes(WASM_SPEC.to_bytes())
    job = submitted(devnet, client, spec_cid, store.add_bytes(b"out " + os.urandom(8)))
    window = int(client.call("mediationWindow"))
    state = tmp_path / "m.db"
    with mediator(devnet, deployment, ipfs_daemon, state, rerun_min_s=window + 1.0) as med:
        disputed(devnet, client, job)
        until(med, lambda: decision(med, job, "dispute") is not None, what="the ruling")
        d = decision(med, job, "dispute")
        assert d is not None and d.verdict == "upheld"
        assert "integrity only: no time for a re-run" in d.reason
        assert med.state.reruns() == []
    assert jobs_funded_by(client, devnet.mediator.address) == []


@pytest.mark.parametrize("tie_break", [False, True], ids=["run-1", "tie-break"])
def test_a_rerun_nobody_takes_is_cancelled_and_the_dispute_ruled_without_it(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
    tie_break: bool,
) -> None:
    """A re-run (run 1, or the tie-break: run 2) that no provider takes before the mediation
    window is about to close is abandoned and cancelled (its bounty back to the mediator), and
    the dispute is ruled without it: on integrity (run 1), or as run 1 alone says (run 2)."""
    deployment, client = escrow
    spec_cid = store.add_bytes(WASM_SPEC.to_bytes())
    wrong = store.add_bytes(b"mean=41.0\n")
    job = submitted(devnet, client, spec_cid, wrong)
    window = int(client.call("mediationWindow"))
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        disputed(devnet, client, job)
        until(med, lambda: bool(med.state.reruns()), what="the re-run")
        (waiting,) = med.state.reruns()
        if tie_break:
            right = store.add_bytes(b"mean=42.5\n")
            take_rerun(devnet, client, waiting.rerun_id, devnet.providers[1], right)
            until(med, lambda: med.state.rerun(job.job_id, 1, run=2) is not None, what="run 2")
            waiting = med.state.rerun(job.job_id, 1, run=2)  # type: ignore[assignment]
        assert decision(med, job, "dispute") is None
        assert Status(client.call("statusOf", waiting.rerun_id)) is Status.FUNDED
        advance(client.w3, window)  # the window closes: no time left to wait for it
        until(med, lambda: decision(med, job, "dispute") is not None, what="the ruling")
        d = decision(med, job, "dispute")
        assert d is not None
        name = "tie-break re-run" if tie_break else "re-run"
        assert f"{name} 0x{waiting.rerun_id.hex()} gave no usable result" in d.reason, d
        if tie_break:
            assert d.verdict == "not upheld" and "no tie-break" in d.reason, d
        else:
            assert d.verdict == "upheld" and "integrity only" in d.reason, d
        gone = med.state.rerun(job.job_id, 1, run=waiting.run)
        assert gone is not None and gone.status == "abandoned"
        assert med.counters["reruns_abandoned"] == 1
        assert Status(client.call("statusOf", waiting.rerun_id)) is Status.REFUNDED  # cancelled


def test_a_token_job_is_ruled_in_its_token_across_a_restart(
    devnet: Devnet, ipfs_daemon: IpfsDaemon, spec_cid: str, tmp_path: Path
) -> None:
    """A job paid in tUSD (escrow v4): the mediator's state keeps the job's token (the struct
    it passes back to ``rule`` names it, else the escrow refuses the ruling), and the slashed
    collateral goes to the submitter in tUSD."""
    deployment, _ = fresh_escrow(devnet, challenge_window=3600, reassign_delay=60)
    deployment = list_token(devnet.w3, devnet.owner, deployment, devnet.token)
    client = EscrowClient(devnet.w3, deployment)
    provider, submitter, token = devnet.providers[0], devnet.submitter, devnet.token
    register_on_chain(client, provider)
    client.stake_token(provider, token, 10 * 10**6)
    bounty = 2 * 10**6  # 2 tUSD
    terms = client.default_terms(bounty, submitter.address, token=token)
    state, _ = client.create_job(
        submitter, os.urandom(32), spec_cid, chain_now(client) + 3600, bounty, terms
    )
    assert state.job.token == token
    state = assign(devnet, client, state, provider)
    escrow_call(client, provider, "submitResult", state.job_id, state.job.as_tuple(), INVALID_UTF8)
    job = client.job_state(state.job_id)
    assert job.status is Status.SUBMITTED and job.job.token == token
    path = tmp_path / "m.db"
    with mediator(devnet, deployment, ipfs_daemon, path) as med:
        med.watcher.poll_once()  # it knows the result; stops before checking it
        assert decision(med, job) is None
    before = client.balance_of(submitter.address, token)
    eth_before = client.balance_of(submitter.address)
    with mediator(devnet, deployment, ipfs_daemon, path) as med:  # from its state file
        until(med, lambda: decision(med, job) is not None, what="the ruling")
        d = decision(med, job)
        assert d is not None and d.verdict == "not upheld" and d.tx_hash is not None, d
        assert status(client, job) is Status.FUNDED
        assert client.balance_of(submitter.address, token) - before == job.job.collateral
        assert client.balance_of(submitter.address) == eth_before


def test_a_disputed_token_job_is_rerun_in_its_token_within_the_token_cap(
    devnet: Devnet, ipfs_daemon: IpfsDaemon, store: IpfsStore, tmp_path: Path
) -> None:
    """A disputed deterministic job paid in tUSD: the re-run is funded in tUSD from the
    mediator's own balance (its permit and createJobWith in one transaction), offers the same
    bounty, and is capped by ``rerun_max_bounty_token``, not by the wei cap."""
    deployment, _ = fresh_escrow(devnet, challenge_window=3600, reassign_delay=60)
    deployment = list_token(devnet.w3, devnet.owner, deployment, devnet.token)
    client = EscrowClient(devnet.w3, deployment)
    token, submitter = devnet.token, devnet.submitter
    TokenClient(devnet.w3, token).send(devnet.owner, "mint", devnet.mediator.address, 10**8)
    for provider in devnet.providers[:2]:
        register_on_chain(client, provider)
        client.stake_token(provider, token, 10 * 10**6)
    spec_cid = store.add_bytes(WASM_SPEC.to_bytes())
    bounty = 2 * 10**6

    def tusd_job(output: str) -> JobState:
        provider = devnet.providers[0]
        terms = client.default_terms(bounty, submitter.address, token=token)
        state, _ = client.create_job(
            submitter, os.urandom(32), spec_cid, chain_now(client) + 3600, bounty, terms
        )
        state = assign(devnet, client, state, provider)
        state, _ = client.call_job(provider, "submitResult", state, output)
        # the dispute deposit is pulled in the job's token
        TokenClient(devnet.w3, token).send(submitter, "approve", client.address, 10**9)
        client.send(submitter, "dispute", state.job_id, state.job.as_tuple())
        return state

    capped = tusd_job(store.add_bytes(b"mean=1\n" + os.urandom(8)))
    with mediator(
        devnet,
        deployment,
        ipfs_daemon,
        tmp_path / "capped.db",
        rerun_max_bounty_wei=10**18,  # no bar for a tUSD job: another unit
        rerun_max_bounty_token=bounty - 1,
    ) as med:
        until(med, lambda: decision(med, capped, "dispute") is not None, what="the ruling")
        d = decision(med, capped, "dispute")
        assert d is not None and d.verdict == "upheld", d
        assert f"over this mediator's cap {bounty - 1}" in d.reason
        assert f"units of token {token}" in d.reason
        assert med.state.reruns() == []
    job = tusd_job(store.add_bytes(b"mean=2\n" + os.urandom(8)))
    balance = TokenClient(devnet.w3, token)
    before = balance.balance_of(devnet.mediator.address)
    with mediator(
        devnet, deployment, ipfs_daemon, tmp_path / "m.db", rerun_max_bounty_token=bounty
    ) as med:
        until(med, lambda: bool(med.state.reruns()), what="the re-run")
        (rerun,) = med.state.reruns()
        assert (rerun.job_id, rerun.status) == (job.job_id, "funded"), rerun
        funded = client.job_state(rerun.rerun_id)
        assert funded.job.token == token and funded.job.bounty == bounty
        assert funded.job.submitter == devnet.mediator.address
        assert before - balance.balance_of(devnet.mediator.address) == bounty
