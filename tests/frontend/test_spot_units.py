"""Spot checks on the submitter's side without a chain: the ``spot:p`` choice (forms), the
price (``C > B (1 - p) / p``), the job page's check states and the reveal's display, from real
draws of :mod:`gridmarket.spot` (a real seed, commitment and sealed seed; events built as the
front end's index records them), and the job page's template rendered with them."""

from __future__ import annotations

from typing import Any

import pytest

from frontend_api.forms import (
    FieldError,
    PrepareJobRequest,
    check_job,
    parse_policy,
    spot_public_key,
    verification_name,
)
from frontend_api.records import ChainEvent
from frontend_api.spotcheck import reveal_view, spot_price, spot_view
from frontend_api.submitter_client import CliError
from frontend_api.submitter_spot import SeedStore, drawn_attempts, mediator_key
from gridmarket import spot
from gridmarket.escrow import FLAG_SPOT
from gridmarket.wire import JobSpec, SpotCheck

MEDIATOR_KEY = bytes.fromhex("11" * 32)
MEDIATOR = spot.address_of(spot.public_key_of(MEDIATOR_KEY))
SUBMITTER = "0x" + "22" * 20
PROVIDER = "0x" + "33" * 20
PARAMS = {
    "min_bounty": 10**12,
    "min_collateral_bps": 10_000,
    "min_duration": 60,
    "mediator": MEDIATOR,
    "mediator_pubkey": "0x" + spot.public_key_of(MEDIATOR_KEY).hex(),
}
WASM = {
    "executor": "wasm",
    "module_cid": "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku",
}


@pytest.mark.parametrize(
    ("text", "bps", "name"),
    [("spot:0.1", 1000, "spot:0.1"), ("spot:0.25", 2500, "spot:0.25"), ("SPOT=10%", 1000,
     "spot:0.1"), ("spot:1", 10_000, "spot:1"), ("spot:0.0001", 1, "spot:0.0001")],
)  # fmt: skip
def test_spot_choices_parse_to_basis_points(text: str, bps: int, name: str) -> None:
    policy = parse_policy(text)
    assert (policy.replicas, policy.spot_bps, policy.name) == (0, bps, name)
    assert verification_name(0, bps) == name


@pytest.mark.parametrize("text", ["spot:0", "spot:1.5", "spot:0.00001", "spot:", "spot:abc"])
def test_bad_spot_choices_are_refused_naming_verification(text: str) -> None:
    with pytest.raises(ValueError, match=r"^verification: "):
        parse_policy(text)


def request(**fields: Any) -> PrepareJobRequest:
    body = {"from": SUBMITTER, "spec": WASM, "bounty_wei": 10**15, "verification": "spot:0.1"}
    return PrepareJobRequest.model_validate({**body, **fields})


def test_check_job_draws_seals_to_the_listed_mediator_and_asks_the_spot_collateral() -> None:
    checked = check_job(request(), chain_now=1_000_000, params=PARAMS)
    assert checked.flags == FLAG_SPOT and checked.spot_bps == 1000
    assert checked.funding_wei == 2 * 10**15
    assert checked.collateral_wei == spot.min_collateral(10**15, 1000) == 9 * 10**15 + 1
    assert spot.cheater_profit(10**15, checked.collateral_wei, 1000) < 0
    assert spot.cheater_profit(10**15, checked.collateral_wei - 1, 1000) == 0
    check = checked.spec.spot
    assert check is not None and check.p_bps == 1000
    seed = spot.unseal(
        check.sealed_bytes, MEDIATOR_KEY, SUBMITTER, check.commit_bytes
    )  # opens, matches
    assert spot.verify_reveal(seed, check.commit_bytes, SUBMITTER)
    again = check_job(request(), chain_now=1_000_000, params=PARAMS).spec.spot
    assert again is not None and again.commit != check.commit  # a fresh draw each time


def test_check_job_refuses_what_cannot_be_spot_checked() -> None:
    docker = {"executor": "docker", "image": "busybox:latest"}
    with pytest.raises(FieldError) as err:
        check_job(request(spec=docker), chain_now=1_000_000, params=PARAMS)
    assert err.value.field == "spec.deterministic" and "honest runs agree" in err.value.message
    with pytest.raises(FieldError) as err:
        check_job(request(payment="on_verify"), chain_now=1_000_000, params=PARAMS)
    assert err.value.field == "payment"
    with pytest.raises(FieldError) as err:  # less than B (1 - p) / p: cheating would pay
        check_job(request(collateral_wei=9 * 10**15), chain_now=1_000_000, params=PARAMS)
    assert err.value.field == "collateral_wei" and "(1 - p) / p" in err.value.message
    self_mediated = request(mediator=SUBMITTER)
    with pytest.raises(FieldError, match="none is known for yourself"):
        check_job(self_mediated, chain_now=1_000_000, params=PARAMS)
    with pytest.raises(FieldError, match="not the mediator's public key"):
        spot_public_key("0x" + spot.public_key_of(b"\x07" * 32).hex(), MEDIATOR, SUBMITTER, {})
    sealed = SpotCheck(p_bps=2500, commit="0x" + "00" * 32, sealed="0x" + "00" * 93)
    spec = {**WASM, "spot": sealed.model_dump()}
    with pytest.raises(FieldError) as err:  # the spec's own p must be the one named
        check_job(request(spec=spec), chain_now=1_000_000, params=PARAMS)
    assert err.value.field == "verification"


def test_a_spec_carrying_its_own_spot_is_taken_as_is() -> None:
    seed = spot.new_seed()
    own = {
        "p_bps": 2500,
        "commit": "0x" + spot.commit_of(seed, SUBMITTER).hex(),
        "sealed": "0x" + spot.seal(seed, spot.public_key_of(MEDIATOR_KEY), SUBMITTER).hex(),
    }
    checked = check_job(
        request(spec={**WASM, "spot": own}, verification="spot:0.25"),
        chain_now=1_000_000,
        params=PARAMS,
    )
    assert checked.spec.spot is not None and checked.spec.spot.model_dump() == own
    assert checked.collateral_wei == 3 * 10**15 + 1


def test_the_price_says_deposit_collateral_and_expected_compute() -> None:
    price = spot_price(10**15, 9 * 10**15 + 1, 1000, PARAMS, lambda w: f"{w} wei")
    assert price["funding_wei"] == str(2 * 10**15)
    assert price["check_deposit_wei"] == str(10**15)
    assert price["min_collateral_wei"] == str(9 * 10**15 + 1)
    assert price["expected_runs"] == "1 + 0.1"
    assert price["expected_cost_wei"] == str(11 * 10**14)
    assert int(price["cheater_profit_wei"]) < 0
    text = " ".join(price["lines"])
    assert "check deposit" in text and "returned to you unless a check upholds" in text
    assert "C > B (1 - p) / p" in text and "x 9" in text and "expects to lose on it" in text
    cheap = spot_price(10**15, 10**15, 1000, PARAMS, lambda w: f"{w} wei")
    assert "raise the collateral" in " ".join(cheap["lines"])


def event(seq: int, name: str, tx: str, **args: Any) -> ChainEvent:
    return ChainEvent(seq, name, {"jobId": b"\x01" * 32, **args}, seq, seq, tx, 0)


def history() -> list[ChainEvent]:
    """Attempt 1 checked by the mediator and ruled not upheld; attempt 2 disputed by the
    submitter and upheld; attempt 3 unchecked, then released."""
    return [
        event(1, "JobCreated", "0xc1", flags=FLAG_SPOT),
        event(2, "JobAssigned", "0xa1", provider=PROVIDER, attempt=1),
        event(3, "ResultSubmitted", "0xb1", attempt=1, outputCid="bafkreiwrong"),
        event(4, "ResultDisputed", "0xd1", deposit=10**15),
        event(5, "Ruled", "0xe1", attempt=1, upheld=False),
        event(6, "JobAssigned", "0xa2", provider=PROVIDER, attempt=2),
        event(7, "ResultSubmitted", "0xb2", attempt=2, outputCid="bafkreiright"),
        event(8, "ResultDisputed", "0xd2", deposit=10**15),
        event(9, "Ruled", "0xe2", attempt=2, upheld=True),
        event(10, "JobAssigned", "0xa3", provider=PROVIDER, attempt=3),
        event(11, "ResultSubmitted", "0xb3", attempt=3, outputCid="bafkreiright"),
    ]


def spec_with(seed: bytes, p_bps: int = 2500) -> dict[str, Any]:
    check = SpotCheck(
        p_bps=p_bps,
        commit="0x" + spot.commit_of(seed, SUBMITTER).hex(),
        sealed="0x" + spot.seal(seed, spot.public_key_of(MEDIATOR_KEY), SUBMITTER).hex(),
    )
    return JobSpec.model_validate({**WASM, "spot": check.model_dump()}).model_dump(mode="json")


def test_the_page_tells_a_check_from_the_submitters_dispute_and_verifies_the_reveal() -> None:
    seed = spot.new_seed()
    senders = {"0xd1": MEDIATOR, "0xd2": SUBMITTER}
    status = {"seed": "0x" + seed.hex(), "checked_attempts": [1]}  # the scheduler's claim
    view = spot_view(spec_with(seed), True, 3, history(), SUBMITTER, senders, status, None)
    assert view is not None and view["p"] == "0.25" and view["checks"] == 1
    states = [a["state"] for a in view["attempts"]]
    assert states == [
        "check: not upheld (slashed)",
        "ruling: upheld",  # the submitter's own dispute is no check
        "unchecked",
    ]
    reveal = view["reveal"]
    assert reveal["verified"] is True
    want = [a for a in (1, 2, 3) if spot.checked(seed, a, 2500)]
    assert reveal["checked_attempts"] == want  # recomputed here, not the scheduler's word
    assert [a["drawn"] for a in view["attempts"]] == [a in want for a in (1, 2, 3)]
    other = reveal_view(
        SpotCheck.model_validate(spec_with(seed)["spot"]), {"seed": "0x" + "00" * 32}, 3, SUBMITTER
    )
    assert other is not None and other["verified"] is False and other["checked_attempts"] == []
    unknown = spot_view(spec_with(seed), True, 1, history()[:4], SUBMITTER, {}, None, "down")
    assert unknown is not None and unknown["attempts"][0]["state"] == "disputed (sender unknown)"
    assert unknown["reveal"] is None and unknown["status_error"] == "down"
    assert spot_view({**WASM}, False, 1, history(), SUBMITTER, {}, None, None) is None
    flagged = spot_view(None, True, 0, [], SUBMITTER, {}, None, None)
    assert flagged is not None and "could not be read" in flagged["problem"]


def test_the_job_page_renders_the_spot_section() -> None:
    from frontend_api.web import env

    seed = spot.new_seed()
    sp = spot_view(
        spec_with(seed, 10_000), True, 3, history(), SUBMITTER, {"0xd1": MEDIATOR},
        {"seed": "0x" + seed.hex()}, None,
    )  # fmt: skip
    view = {
        "job_id": "0x" + "01" * 32,
        "state": "released",
        "chain_status": "released",
        "chain": {"token": "0x" + "00" * 20, "bounty_wei": "1000", "attempt": 3,
                  "payout_wei": "900", "fee_wei": "100", "fee_bps": 1000, "deadline": 0,
                  "submitter": SUBMITTER, "provider": PROVIDER, "spec_cid": WASM["module_cid"],
                  "terms": {"mediator": MEDIATOR, "spot": True, "payment": "after_window",
                            "collateral_wei": "1", "challenge_window_s": 60}},
        "scheduler": None,
        "actions": {},
        "spot": sp,
        "chain_time": 0,
    }  # fmt: skip
    html = env.get_template("_job_live.html").render(view=view, b=None)
    assert 'id="job-spot"' in html and 'id="spot-p">1<' in html
    assert sp is not None and sp["commit"] in html
    assert 'data-verified="true"' in html and 'id="spot-drawn">1, 2, 3<' in html  # p = 1
    assert 'data-check="check: not upheld (slashed)"' in html
    assert "spot-checked" in html


def test_the_cli_keeps_the_seed_0600_and_checks_the_mediators_key(tmp_path: Any) -> None:
    store = SeedStore.beside(tmp_path / "submitter.json")
    seed, field = spot.new_seed(), None
    key = mediator_key(MEDIATOR, None, {"params": PARAMS}, b"\x05" * 32, SUBMITTER)
    assert key == spot.public_key_of(MEDIATOR_KEY)
    own = mediator_key(SUBMITTER, None, {"params": PARAMS}, b"\x05" * 32, SUBMITTER)
    assert own == spot.public_key_of(b"\x05" * 32)  # self-mediated: sealed to oneself
    with pytest.raises(CliError, match="--mediator-pubkey: not the key of mediator"):
        mediator_key(MEDIATOR, "0x" + own.hex(), {"params": PARAMS}, b"\x05" * 32, SUBMITTER)
    with pytest.raises(CliError, match="none is known"):
        mediator_key(PROVIDER, None, {"params": PARAMS}, b"\x05" * 32, SUBMITTER)
    field = {"p_bps": 1000, "commit": "0x" + spot.commit_of(seed, SUBMITTER).hex()}
    path = store.save("0x" + "ab" * 32, seed, field, submitter=SUBMITTER)
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert store.load("0x" + "AB" * 32)["seed"] == "0x" + seed.hex()
    with pytest.raises(CliError, match="already kept"):
        store.save("0x" + "ab" * 32, seed, field, submitter=SUBMITTER)
    assert drawn_attempts("0x" + seed.hex(), 10_000, 3) == [1, 2, 3]
    with pytest.raises(CliError, match="no spot seed kept"):
        store.load("0x" + "cd" * 32)
