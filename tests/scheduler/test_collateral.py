"""The acceptance check's remembered free collateral (scheduler/collateral.py).

The view's own rules are checked directly (a read function that answers what the test says);
its use by the scheduler on real services: anvil with a fresh escrow, js-ipfs, uvicorn. The
safety claims of the module are what the service tests pin down: a stake that shrank is not
believed once the watcher folded it, and a remembered value never refuses an acceptance
that fits.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gridmarket.chain import EscrowClient
from gridmarket.escrow import Status
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, JobSpec
from scheduler.collateral import CollateralView

from ..conftest import Devnet
from .harness import (
    CPU_CAP,
    Provider,
    Server,
    fresh_escrow,
    register_on_chain,
    scheduler,
    submit_job,
)
from .test_service import chain_status, ipfs, wait_chain

# --------------------------------------------------------------------------- the view alone


class Chain:
    """What ``freeCollateralIn`` answers, set by the test; counts reads."""

    def __init__(self) -> None:
        self.free = 100
        self.block = 10
        self.reads = 0
        self.during_read: Any = None

    def read(self, wallet: str, token: str) -> tuple[int, int]:
        self.reads += 1
        answer = (self.free, self.block)
        if self.during_read is not None:
            self.during_read()
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


W = "0x00000000000000000000000000000000000000aA"
T = "0x0000000000000000000000000000000000000000"


def view(max_age_s: float = 2.0) -> tuple[CollateralView, Chain, Clock]:
    chain, clock = Chain(), Clock()
    return CollateralView(chain.read, max_age_s, clock), chain, clock


def test_a_value_is_reused_until_it_is_max_age_old_then_read_again() -> None:
    v, chain, clock = view(2.0)
    assert v.peek(W, T) is None
    assert v.get(W, T) == (100, 10, False)
    chain.free, chain.block = 50, 11
    clock.now += 1.9
    assert v.get(W.lower(), T) == (100, 10, True)  # addresses in any case
    assert v.peek(W, T) == (100, 10)
    clock.now += 0.1
    assert v.peek(W, T) is None
    assert v.get(W, T) == (50, 11, False)
    assert (chain.reads, v.reads, v.hits) == (2, 2, 2)


def test_fresh_always_reads_and_zero_max_age_never_remembers() -> None:
    v, chain, _ = view(2.0)
    v.get(W, T)
    assert v.get(W, T, fresh=True) == (100, 10, False)
    assert chain.reads == 2
    v0, chain0, _ = view(0)
    v0.get(W, T)
    assert v0.peek(W, T) is None and v0.get(W, T)[2] is False and chain0.reads == 2


def test_tokens_are_kept_apart_and_forget_drops_every_token_of_the_wallet() -> None:
    v, chain, _ = view()
    other = "0x00000000000000000000000000000000000000Bb"
    v.get(W, T)
    chain.free = 7
    assert v.get(W, other) == (7, 10, False)
    assert v.get(W, T)[0] == 100
    v.forget(W.upper().replace("0X", "0x"))
    assert v.peek(W, T) is None and v.peek(W, other) is None


def test_a_read_that_raced_a_forget_is_answered_but_not_kept() -> None:
    v, chain, _ = view()
    chain.during_read = lambda: v.forget(W)  # the watcher folds an unstake mid-read
    assert v.get(W, T) == (100, 10, False)
    assert v.peek(W, T) is None
    chain.during_read = None
    v.get(W, T)
    assert v.peek(W, T) == (100, 10)


def test_an_older_block_never_replaces_a_newer_one() -> None:
    v, chain, clock = view()
    chain.block = 20
    v.get(W, T)
    chain.block, chain.free = 19, 1  # a lagging node behind a load balancer
    clock.now += 5
    assert v.get(W, T) == (1, 19, False)  # answered, not kept
    clock.now -= 5
    assert v.peek(W, T) == (100, 20)


def test_observe_forgets_the_providers_of_stake_events_only() -> None:
    class Ev:
        def __init__(self, name: str, args: Any) -> None:
            self.name, self.args = name, args

    v, _, _ = view()
    others = ["0x" + f"{i:040x}" for i in range(1, 7)]
    for w in [W, *others]:
        v.get(w, T)
    v.observe(
        [
            Ev("JobAssigned", {"provider": others[0]}),  # counted by the store as pending
            Ev("UnstakeRequested", {"provider": W}),
            Ev("ProviderSlashed", {"provider": others[1]}),
            Ev("Staked", {"provider": others[2]}),
            Ev("Unstaked", {"provider": others[3]}),
            Ev("UnstakeRequested", {"provider": 12}),  # hostile: not an address string
            Ev("UnstakeRequested", None),
            object(),
        ]
    )
    kept = [w for w in [W, *others] if v.peek(w, T) is not None]
    assert kept == [others[0], others[4], others[5]]


def test_the_view_is_safe_from_many_threads() -> None:
    v, _, _ = view(0.001)
    errors: list[BaseException] = []

    def hammer(k: int) -> None:
        try:
            for i in range(2000):
                w = "0x" + f"{(k * 7 + i) % 50:040x}"
                v.get(w, T)
                if i % 17 == 0:
                    v.forget(w)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# --------------------------------------------------------------------------- in the scheduler

ipfs = ipfs  # test_service's fixture: js-ipfs client on the session daemon
SPEC = JobSpec.model_validate(
    {"executor": "docker", "image": "busybox:1", "command": ["true"], "max_attempts": 3}
)
BOUNTY = 10**16
CAP = CPU_CAP.model_copy(update={"slots": 4})
"""Room for every job of a test at once: only collateral decides."""


@pytest.fixture
def grid(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any, db_url: str
) -> Iterator[tuple[Server, EscrowClient]]:
    """A scheduler that remembers free collateral for a minute: only the watcher's
    forgetting and the fresh re-read can make it see a change within a test."""
    deployment, client = fresh_escrow(devnet)
    with scheduler(
        tmp_path, deployment, devnet, ipfs_daemon.api_addr, database_url=db_url,
        collateral_cache_s=60,
    ) as server:  # fmt: skip
        yield server, client


def lookups(server: Server) -> dict[str, float]:
    text = server.get(API.METRICS).text
    found = re.findall(r'gridmarket_collateral_lookups\{source="(\w+)"\} ([0-9.e+]+)', text)
    return {k: float(n) for k, n in found}


def folded(server: Server, block: int, timeout: float = 15) -> None:
    """Wait until the scheduler's chain watcher has folded ``block``."""
    deadline = time.monotonic() + timeout
    while (server.get(API.HEALTH).json().get("chain_cursor") or 0) < block:
        assert time.monotonic() < deadline, f"the watcher did not reach block {block}"
        time.sleep(0.05)


def collateral_of(client: EscrowClient, devnet: Devnet) -> int:
    terms = client.default_terms(BOUNTY, devnet.submitters[0].address)
    return int(terms.collateral)


def test_an_unstake_folded_by_the_watcher_is_believed_at_once(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore
) -> None:
    """The wallet's free collateral is remembered at its first acceptance; it then requests
    an unstake that leaves less than a job's collateral. Once the watcher folded
    ``UnstakeRequested``, the next acceptance reads the chain again and is refused, though the
    remembered value (a minute old at most) would have covered it."""
    server, client = grid
    c = collateral_of(client, devnet)
    p = devnet.providers[0]
    register_on_chain(client, p, stake=max(devnet.params.min_stake, c) + 3 * c)
    node = Provider(p, server, name="unstaker", capacity=CAP)
    assert node.register().status_code == 200
    first = submit_job(client, ipfs, devnet.submitters[0], SPEC, bounty=BOUNTY)
    a = node.next_job(wait_s=20).json()
    assert a["job_id"] == first
    assert node.accept(a).json()["accepted"] is True
    assert lookups(server)["chain"] == 1
    wait_chain(client, first, Status.ASSIGNED)
    free = int(client.call("freeCollateralOf", p.address))
    sent = client.send(p, "requestUnstake", free - c // 2)  # c/2 left: not one more job
    folded(server, sent.block)
    second = submit_job(client, ipfs, devnet.submitters[0], SPEC, bounty=BOUNTY)
    b = node.next_job(wait_s=20).json()
    assert b["job_id"] == second
    ack = node.accept(b).json()
    assert ack["accepted"] is False and "free collateral" in ack["message"], ack
    assert lookups(server) == {"chain": 2, "remembered": 0}
    assert chain_status(client, second) is Status.FUNDED


def test_a_remembered_value_never_refuses_an_acceptance_that_fits(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    """The remembered value was read while a job held collateral that has been released
    since: it says the wallet is short. The scheduler reads the chain again before refusing,
    and the acceptance goes through."""
    server, client = grid
    c = collateral_of(client, devnet)
    p = devnet.providers[1]
    register_on_chain(client, p, stake=max(devnet.params.min_stake, c) + c // 2)  # one job
    node = Provider(p, server, name="busy", capacity=CAP)
    assert node.register().status_code == 200
    first = submit_job(client, ipfs, devnet.submitters[0], SPEC, bounty=BOUNTY, on_verify=True)
    a = node.next_job(wait_s=20).json()
    assert node.accept(a).json()["accepted"] is True
    wait_chain(client, first, Status.ASSIGNED)
    sent = client.send(p, "stake", value=1)  # Staked: the watcher forgets the wallet
    folded(server, sent.block)
    # read now, while the first job holds its collateral: one job's worth is not free
    second = submit_job(client, ipfs, devnet.submitters[0], SPEC, bounty=BOUNTY)
    b = node.next_job(wait_s=20).json()
    assert b["job_id"] == second
    assert node.accept(b).json()["accepted"] is False
    assert lookups(server) == {"chain": 2, "remembered": 0}
    # the first job is paid: its collateral is free again, but the view remembers it locked
    out = tmp_path / "out"
    out.mkdir()
    (out / "result.txt").write_text("done")
    assert node.succeed(a, ipfs.add_dir(out)).status_code == 202
    server.wait_job(first, {"released"}, timeout=30)
    third = submit_job(client, ipfs, devnet.submitters[0], SPEC, bounty=BOUNTY)
    d = node.next_job(wait_s=20).json()
    assert d["job_id"] == third
    ack = node.accept(d).json()
    assert ack["accepted"] is True, ack
    assert lookups(server) == {"chain": 3, "remembered": 1}  # remembered, refused, read again
    wait_chain(client, third, Status.ASSIGNED)
