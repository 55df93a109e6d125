"""The spot-check draw, commitment and sealing (gridmarket.spot)."""

from __future__ import annotations

import os

import pytest
from eth_account import Account

from gridmarket import spot
from gridmarket.wire import JobSpec

SUBMITTER = "0x" + "22" * 20
OTHER = "0x" + "33" * 20


def test_commit_and_reveal() -> None:
    seed = spot.new_seed()
    commit = spot.commit_of(seed, SUBMITTER)
    assert spot.verify_reveal(seed, commit, SUBMITTER)
    assert not spot.verify_reveal(os.urandom(32), commit, SUBMITTER)
    assert not spot.verify_reveal(seed[:31], commit, SUBMITTER)
    # the commitment names its submitter: another's copy of it is not its own
    assert not spot.verify_reveal(seed, commit, OTHER)
    with pytest.raises(spot.SpotError, match="submitter must be a 0x address"):
        spot.commit_of(seed, "0x1234")


def test_draws_follow_p_and_differ_per_attempt() -> None:
    # 4,000 seeds x 5 attempts at p = 0.25: the share checked is 0.25 within 4 sigma
    n, hits, patterns = 4_000, 0, set()
    for _ in range(n):
        seed = spot.new_seed()
        row = tuple(spot.checked(seed, a, 2_500) for a in range(1, 6))
        hits += sum(row)
        patterns.add(row)
    share = hits / (5 * n)
    assert abs(share - 0.25) < 4 * (0.25 * 0.75 / (5 * n)) ** 0.5
    assert len(patterns) > 20  # attempts are drawn independently, not all alike
    seed = spot.new_seed()
    assert all(spot.checked(seed, a, 10_000) for a in range(1, 50))
    with pytest.raises(spot.SpotError, match="basis points"):
        spot.checked(seed, 1, 0)


def test_sealed_seed_opens_only_with_the_mediators_key() -> None:
    mediator, other = Account.create(), Account.create()
    pub = spot.public_key_of(bytes(mediator.key))
    assert spot.address_of(pub) == mediator.address
    assert spot.check_public_key(pub, mediator.address) == pub
    with pytest.raises(spot.SpotError, match="is not the key of"):
        spot.check_public_key(pub, other.address)
    seed = spot.new_seed()
    sealed = spot.seal(seed, pub, SUBMITTER)
    assert len(sealed) == spot.SEALED_BYTES
    commit = spot.commit_of(seed, SUBMITTER)
    assert spot.unseal(sealed, bytes(mediator.key), SUBMITTER, commit) == seed
    with pytest.raises(spot.SpotError, match="does not open"):
        spot.unseal(sealed, bytes(other.key), SUBMITTER)
    # copied into another submitter's spec, the sealed seed does not open for its job
    with pytest.raises(spot.SpotError, match=f"does not open with this key for submitter {OTHER}"):
        spot.unseal(sealed, bytes(mediator.key), OTHER)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(spot.SpotError, match="does not open"):
        spot.unseal(tampered, bytes(mediator.key), SUBMITTER)
    with pytest.raises(spot.SpotError, match="does not match the spec's commitment"):
        spot.unseal(
            sealed, bytes(mediator.key), SUBMITTER, spot.commit_of(spot.new_seed(), SUBMITTER)
        )
    with pytest.raises(spot.SpotError, match="sealed seed must be 93 bytes"):
        spot.unseal(sealed[:-1], bytes(mediator.key), SUBMITTER)


@pytest.mark.parametrize(
    ("bounty", "p_bps", "least"),
    [(10**18, 1_000, 9 * 10**18 + 1), (100, 2_500, 301), (7, 10_000, 1)],
)
def test_min_collateral_makes_cheating_unprofitable(bounty: int, p_bps: int, least: int) -> None:
    assert spot.min_collateral(bounty, p_bps) == least
    assert spot.cheater_profit(bounty, least, p_bps) < 0
    assert spot.cheater_profit(bounty, least - 1, p_bps) >= 0


def test_the_spec_carries_the_policy_only_for_comparable_jobs() -> None:
    seed, key = spot.new_seed(), Account.create().key
    policy = {
        "p_bps": 1000,
        "commit": "0x" + spot.commit_of(seed, SUBMITTER).hex(),
        "sealed": "0x" + spot.seal(seed, spot.public_key_of(bytes(key)), SUBMITTER).hex(),
    }
    wasm = JobSpec.model_validate(
        {
            "executor": "wasm",
            "module_cid": "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
            "spot": policy,
        }
    )
    assert wasm.spot is not None and wasm.spot.commit_bytes == spot.commit_of(seed, SUBMITTER)
    assert JobSpec.from_bytes(wasm.to_bytes()) == wasm
    with pytest.raises(ValueError, match="spot checks need a job whose honest runs agree"):
        JobSpec.model_validate({"executor": "docker", "image": "busybox:1", "spot": policy})
    with pytest.raises(ValueError, match="p_bps"):
        JobSpec.model_validate(
            {"executor": "wasm", "module_cid": wasm.module_cid, "spot": {**policy, "p_bps": 0}}
        )
    plain = JobSpec.model_validate({"executor": "wasm", "module_cid": wasm.module_cid})
    assert b"spot" not in plain.to_bytes()
