"""Replicated jobs (escrow version 3, ``replicate:k``) through the front end's API and pages, on
the real stack (tests/frontend/conftest.py): ``POST /api/jobs/prepare`` with ``verification``
builds ``createJob(..., replicas)`` (k seats, each ``bounty / k``, collateral per seat) or
refuses the request naming the field; the submitter cancels the whole job with ``resolve``
while every seat is Funded, and is told why not once a seat is held; the contract's new
reverts map to fields; a group of three seats assigned and submitted by hand (two agreeing
results, one not), resolved on-chain, is shown on the seat's job page, in its API view and in
the explorer (Resolved, the paid seats, the slashed provider). Hostile ReplicasCreated /
Resolved logs are shown and never stop the index.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak

from frontend_api.index import ChainIndex
from frontend_api.txs import TxBuilder, TxError
from gridmarket.chain import ChainError, Event
from gridmarket.cid import bytes_cid
from gridmarket.escrow import Status, Terms, cid_digest, job_id, seat_ids
from tests.frontend.conftest import MANUAL_STAKE, FrontendStack, unrunnable_spec
from tests.frontend.test_api import relay, sign

ROOT = Path(__file__).resolve().parents[2]
SHARE = 2 * 10**15
"""Each seat's share of the bounty (the escrow's minimum bounty is 10**15)."""
PINNED = "gridmarket/busybox@sha256:" + "ab" * 32
"""A Docker image named by digest (replicated Docker jobs must be); the stack's agent serves
WASM only, so these jobs stay queued until assigned by hand."""


def replicated_spec(name: str) -> dict[str, Any]:
    return unrunnable_spec(name=name, image=PINNED, deterministic=True)


def prepare(stack: FrontendStack, **fields: Any) -> Any:
    body: dict[str, Any] = {
        "from": stack.submitter.address,
        "spec": replicated_spec("replicas"),
        "bounty_wei": str(3 * SHARE),
        "ttl_s": 3600,
        "verification": "replicate:3",
    }
    body.update(fields)
    return stack.post("/api/jobs/prepare", json={k: v for k, v in body.items() if v is not None})


def fund_replicated(stack: FrontendStack, name: str, k: int = 3, **fields: Any) -> dict[str, Any]:
    """A replicated job prepared through the API, signed here, relayed: its prepared body."""
    response = prepare(
        stack,
        spec=replicated_spec(name),
        bounty_wei=str(k * SHARE),
        verification=f"replicate:{k}",
        **fields,
    )
    assert response.status_code == 200, response.text
    prepared: dict[str, Any] = response.json()
    relayed = relay(stack, sign(prepared["tx"], stack.submitter))
    names = [e["name"] for e in relayed["events"]]
    assert names == ["ReplicasCreated"] + ["JobCreated"] * k, names
    prepared["events"] = relayed["events"]
    return prepared


def registered(stack: FrontendStack, account: LocalAccount) -> LocalAccount:
    """``account`` registered and staked as a provider (once per chain)."""
    escrow = stack.client()
    if not escrow.call("providerOf", account.address)[3]:
        escrow.send(account, "registerProvider", "bafkreireplicaseat", value=MANUAL_STAKE)
    return account


def test_prepare_replicate_3_builds_create_replicated_with_k_seats(stack: FrontendStack) -> None:
    prepared = fund_replicated(stack, "three-seats")
    assert prepared["verification"] == "replicate:3" and prepared["replicas"] == 3
    group = job_id(
        stack.submitter.address, prepared["spec_cid"], bytes.fromhex(prepared["salt"][2:])
    )
    seats = ["0x" + s.hex() for s in seat_ids(group, 3)]
    assert prepared["group_id"] == "0x" + group.hex()
    assert prepared["seat_ids"] == seats and prepared["job_id"] == seats[0]
    assert prepared["job_url"] == f"/jobs/{seats[0]}"
    # the price: k runs, each seat's share, collateral per seat (default minCollateral(share))
    price = prepared["price"]
    assert price["runs"] == 3 and price["total_wei"] == str(3 * SHARE)
    assert price["per_seat_wei"] == str(SHARE)
    assert price["collateral_per_seat_wei"] == str(SHARE) == prepared["terms"]["collateral_wei"]
    assert "3 runs by distinct providers" in price["summary"]
    assert prepared["terms"]["flags"] == 0 and prepared["terms"]["payment"] == "after_window"
    # on-chain: each seat a job of its own, its salt the group id, k in flags bits 1..3
    created = [e["args"] for e in prepared["events"]]
    assert created[0]["groupId"] == prepared["group_id"] and created[0]["replicas"] == 3
    assert [c["jobId"] for c in created[1:]] == seats
    for c in created[1:]:
        assert c["bounty"] == str(SHARE) and c["collateral"] == str(SHARE)
        assert c["salt"] == prepared["group_id"] and c["flags"] == 3 << 1

    # the API view of any seat shows the group, every seat and no verdict yet
    view = stack.wait_chain(seats[1], "funded")
    assert view["chain"]["verification"] == "replicate:3"
    group_view = view["group"]
    assert group_view["group_id"] == prepared["group_id"] and group_view["replicas"] == 3
    assert [s["job_id"] for s in group_view["seats"]] == seats
    assert {s["status"] for s in group_view["seats"]} == {"funded"}
    assert group_view["verdict"] is None and group_view["final"] is False
    assert view["actions"]["dispute"] is False and view["actions"]["finalize"] is False
    listed = {j["job_id"]: j for j in stack.get("/api/jobs").json()["jobs"]}
    assert (
        listed[seats[2]]["replicas"] == 3 and listed[seats[2]]["group_id"] == group_view["group_id"]
    )
    jobs_page = stack.get("/jobs", headers={"accept": "text/html"}).text
    assert 'data-verification="replicate:3"' in jobs_page
    page = stack.get(f"/jobs/{seats[1]}", headers={"accept": "text/html"})
    assert page.status_code == 200 and 'id="job-group"' in page.text
    assert 'id="job-verdict-pending"' in page.text and page.text.count('class="seat') == 3

    # the escrow refuses to cancel a seat on its own (version 5): the submitter cancels the
    # whole job from any seat's page with resolve(groupId, seats) while every seat is Funded
    assert view["actions"]["cancel"] is True and view["chain"]["cancel_problem"] is None
    assert "Cancel every seat and refund" in page.text
    with pytest.raises(TxError) as caught:
        TxBuilder(stack.client()).job_call(
            stack.submitter.address, "cancel", stack.chain_job(seats[1])
        )
    assert "JobEscrowReplicated" in caught.value.message
    outsider = stack.devnet.providers[3].address
    refused = stack.post(f"/api/jobs/{seats[1]}/cancel/prepare", json={"from": outsider})
    assert refused.status_code == 400 and refused.json()["field"] == "from"
    assert "only the job's submitter" in refused.json()["detail"]
    before = stack.escrow.balance_of(stack.submitter.address)
    r = stack.post(f"/api/jobs/{seats[1]}/cancel/prepare", json={"from": stack.submitter.address})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["action"] == "resolve" and body["group_id"] == prepared["group_id"]
    assert body["seat_ids"] == seats
    relayed = relay(stack, sign(body["tx"], stack.submitter))
    names = [e["name"] for e in relayed["events"]]
    assert names[0] == "Resolved" and names.count("JobRefunded") == 3, names
    assert stack.escrow.balance_of(stack.submitter.address) == before + 3 * SHARE
    # taken out again: other tests expect the submitter's escrow balance empty
    out = stack.post("/api/withdraw/prepare", json={"from": stack.submitter.address})
    assert out.status_code == 200, out.text
    relay(stack, sign(out.json()["tx"], stack.submitter))
    assert stack.escrow.balance_of(stack.submitter.address) == 0
    final = stack.wait_chain(seats[0], "refunded")
    assert final["group"]["final"] is True and final["final"] is True
    assert {s["status"] for s in final["group"]["seats"]} == {"refunded"}
    again = stack.post(
        f"/api/jobs/{seats[2]}/cancel/prepare", json={"from": stack.submitter.address}
    )
    assert again.status_code == 400 and "refunded" in again.json()["detail"]


def test_prepare_integrity_is_unchanged(stack: FrontendStack) -> None:
    response = prepare(stack, verification="integrity", dry_run=True, spec=unrunnable_spec())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["verification"] == "integrity" and body["replicas"] == 0
    assert body["group_id"] is None and body["seat_ids"] == []
    assert body["price"]["runs"] == 1 and body["price"]["per_seat_wei"] == str(3 * SHARE)


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"verification": "replicate:1"}, "verification", "k must be 2..5"),
        ({"verification": "replicate:6"}, "verification", "k must be 2..5"),
        ({"verification": "majority"}, "verification", "integrity or replicate:k"),
        ({"payment": "on_verify"}, "payment", "choose after_window"),
        ({"bounty_wei": str(3 * SHARE + 1)}, "bounty_wei", "must divide by 3"),
        ({"bounty_eth": "0.0015", "bounty_wei": None}, "bounty_eth", "less than the escrow's"),
        ({"collateral_wei": str(SHARE - 1)}, "collateral_wei", "each seat's share"),
        ({"spec": unrunnable_spec()}, "spec.image", "pinned by digest"),
        ({"spec": unrunnable_spec(image=PINNED)}, "spec.deterministic", "deterministic: true"),
    ],
)
def test_prepare_refuses_bad_replicated_inputs_naming_the_field(
    stack: FrontendStack, fields: dict[str, Any], field: str, words: str
) -> None:
    response = prepare(stack, dry_run=True, **fields)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["field"] == field, error
    assert words in error["detail"], error


def test_replicated_create_job_reverts_name_the_field(stack: FrontendStack) -> None:
    """The contract's own checks (the API checks first, so they are reached here directly)."""
    txs = TxBuilder(stack.client())
    sender = stack.submitter.address
    deadline = int(stack.escrow.w3.eth.get_block("latest")["timestamp"]) + 3600
    terms = Terms(mediator=stack.mediator.address, collateral=SHARE)
    cid = bytes_cid(b"replicas revert")
    cases = [
        (6, 6 * SHARE, terms, "verification", "JobEscrowBadReplicas"),
        (3, 3 * SHARE + 1, terms, "bounty", "JobEscrowBountyNotDivisible"),
        (2, 2 * SHARE, Terms(stack.mediator.address, SHARE, 1), "payment", "JobEscrowBadFlags"),
        (2, 2 * SHARE, Terms(stack.mediator.address, SHARE - 1), "collateral", "CollateralTooLow"),
    ]
    for k, value, t, field, error in cases:
        with pytest.raises(TxError) as caught:
            txs.create_job(sender, os.urandom(32), cid, deadline, value, t, None, k)
        assert caught.value.field == field, caught.value
        assert error in caught.value.message


def test_a_resolved_group_shows_its_verdict_and_slash(stack: FrontendStack) -> None:
    """Three seats, three distinct providers driven by hand: two submit the same output, one
    another; ``resolve`` pays the two and slashes the third. The seat's API view, its page and
    the explorer show it."""
    prepared = fund_replicated(stack, "verdict")
    seats = prepared["seat_ids"]
    providers = [
        stack.manual_provider,
        registered(stack, stack.devnet.providers[0]),
        registered(stack, stack.devnet.providers[1]),
    ]
    good, bad = bytes_cid(b"the right answer\n"), bytes_cid(b"a plausible wrong answer\n")
    for n, (seat, provider, output) in enumerate(
        zip(seats, providers, (good, good, bad), strict=True)
    ):
        stack.assign_by_hand(seat, provider)
        if n == 0:  # a seat is held: the submitter can no longer cancel, and is told why
            held = stack.wait_chain(seats[1], "funded")
            for _ in range(100):
                if not held["actions"]["cancel"]:
                    break
                time.sleep(0.2)
                held = stack.job(seats[1])
            assert held["actions"]["cancel"] is False
            assert "seat 0 of this replicated job is held" in held["chain"]["cancel_problem"]
            refused = stack.post(
                f"/api/jobs/{seats[1]}/cancel/prepare", json={"from": stack.submitter.address}
            )
            assert refused.status_code == 400, refused.text
            assert "wait for the seats' results" in refused.json()["detail"].lower()
        stack.submit_by_hand(seat, output)
    group = bytes.fromhex(prepared["group_id"][2:])
    states = [stack.chain_job(s) for s in seats]
    if any(s.status is Status.SUBMITTED for s in states):
        # the scheduler may resolve the group first: then this one is refused
        with contextlib.suppress(ChainError):
            stack.client().resolve(stack.devnet.providers[0], group, states)
    view = _wait_verdict(stack, seats[2])
    verdict = view["group"]["verdict"]
    assert verdict["majority"] is True and verdict["agreeing"] == 2 and verdict["replicas"] == 3
    assert verdict["result_digest"] == "0x" + cid_digest(good).hex()
    assert verdict["output_cid"] == good
    assert sorted(verdict["paid"]) == sorted(p.address for p in providers[:2])
    (slash,) = verdict["slashed"]
    assert slash["seat"] == 2 and slash["provider"] == providers[2].address
    assert slash["amount_wei"] == str(SHARE)
    rows = view["group"]["seats"]
    assert [r["status"] for r in rows] == ["released", "released", "refunded"]
    assert [r["provider"] for r in rows] == [p.address for p in providers]
    assert [r["output_cid"] for r in rows] == [good, good, bad]
    assert [r["agrees"] for r in rows] == [True, True, False]
    assert [r["slashed"] for r in rows] == [False, False, True]
    assert view["group"]["final"] is True and view["final"] is True
    assert view["state"] in ("released", "refunded")  # never a stale "queued" once settled

    page = stack.get(f"/jobs/{seats[2]}", headers={"accept": "text/html"})
    assert page.status_code == 200
    assert 'id="job-verdict" data-agreeing="2" data-replicas="3"' in page.text
    assert page.text.count('data-state="slashed"') == 1
    assert page.text.count('data-state="agrees"') == 2
    assert providers[2].address in page.text and good in page.text

    # the explorer: the group resolved, the slash listed; the provider's totals count it
    explorer = stack.get("/api/verdicts").json()
    listed = {g["group_id"]: g for g in explorer["groups"]}
    assert listed[prepared["group_id"]]["resolved"] is True
    assert listed[prepared["group_id"]]["agreeing"] == 2
    assert any(
        x["job_id"] == seats[2] and x["provider"] == providers[2].address
        for x in explorer["slashes"]
    )
    payouts = stack.get("/payouts", headers={"accept": "text/html"}).text
    assert f'data-group="{prepared["group_id"]}" data-resolved="true"' in payouts
    assert 'id="slashes"' in payouts
    totals = stack.get(f"/api/address/{providers[2].address}").json()["totals"]
    assert totals["slash_count"] >= 1


def _wait_verdict(stack: FrontendStack, seat: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = stack.job(seat)
        if (view.get("group") or {}).get("verdict") and view["group"]["final"]:
            return view
        time.sleep(0.3)
    raise AssertionError(f"no verdict for {seat} after {timeout} s: {view.get('group')}")


def test_hostile_group_events_are_shown_and_never_stop_the_index(stack: FrontendStack) -> None:
    index = ChainIndex(stack.client())
    index.refresh(force=True)
    groups = len(index.groups())
    block = stack.escrow.w3.eth.block_number
    tx = "0x" + "dd" * 32
    ghost = os.urandom(32)
    who = stack.submitter.address
    hostile = [
        # malformed: a group id that is not 32 bytes, a seat count out of range, no submitter
        Event("ReplicasCreated", {"groupId": "0x12", "submitter": who, "replicas": 3,
                                  "salt": b"\0" * 32}, block, tx, 0),
        Event("ReplicasCreated", {"groupId": os.urandom(32), "submitter": who, "replicas": 9,
                                  "salt": b"\0" * 32}, block, tx, 1),
        Event("ReplicasCreated", {"groupId": os.urandom(32), "replicas": 2}, block, tx, 2),
        # a verdict for a group the log never created
        Event("Resolved", {"groupId": os.urandom(32), "resultDigest": b"\1" * 32,
                           "agreeing": 2, "replicas": 3}, block, tx, 3),
        # an orderly group (its seats never created), then verdicts that cannot be its own
        Event("ReplicasCreated", {"groupId": ghost, "submitter": who, "replicas": 3,
                                  "salt": b"\0" * 32}, block, tx, 4),
        Event("ReplicasCreated", {"groupId": ghost, "submitter": who, "replicas": 3,
                                  "salt": b"\0" * 32}, block, tx, 5),
        Event("Resolved", {"groupId": ghost, "resultDigest": b"\1" * 32, "agreeing": 7,
                           "replicas": 3}, block, tx, 6),
        Event("Resolved", {"groupId": ghost, "resultDigest": b"\1" * 3, "agreeing": 2,
                           "replicas": 3}, block, tx, 7),
        Event("Resolved", {"groupId": ghost, "resultDigest": b"\1" * 32, "agreeing": 2,
                           "replicas": 5}, block, tx, 8),
        Event("Resolved", {"groupId": ghost, "agreeing": 2, "replicas": 3}, block, tx, 9),
        Event("Resolved", {"groupId": ghost, "resultDigest": b"\1" * 32, "agreeing": 2,
                           "replicas": 3}, block, tx, 10),
        Event("Resolved", {"groupId": ghost, "resultDigest": b"\2" * 32, "agreeing": 3,
                           "replicas": 3}, block, tx, 11),
    ]  # fmt: skip
    for event in hostile:
        index._ingest(event)
    bad = index.bad_events()
    assert len(bad) == 10, bad  # the orderly group and its first sound verdict fold
    assert any("KeyError" in why for why in bad.values())
    assert any("never created" in why for why in bad.values())
    assert any("a second Resolved" in why for why in bad.values())
    assert len(index.groups()) == groups + 1
    found, seats, events = index.group("0x" + ghost.hex())
    assert seats == [None, None, None]  # shown as unknown, never invented
    assert found.agreeing == 2 and found.result_digest == "0x" + "01" * 32
    assert len(events) == 8  # every event naming it, folded or not
    # the index still reads the chain and folds what follows
    fund_replicated(stack, "after-the-hostile-groups", k=2)
    index.refresh(force=True)
    assert len(index.groups()) == groups + 2
    # and a front end with these pages answers
    for path in ("/payouts", "/api/verdicts", "/jobs"):
        response = stack.get(
            path, headers={} if path.startswith("/api") else {"accept": "text/html"}
        )
        assert response.status_code == 200, (path, response.text[:500])


def test_terms_say_what_each_verification_means(stack: FrontendStack) -> None:
    terms = stack.get(
        "/api/terms", params={"bounty_wei": str(3 * SHARE), "verification": "replicate:3"}
    ).json()
    assert terms["replicas"] == 3 and terms["share_wei"] == str(SHARE)
    assert terms["min_collateral_wei"] == str(SHARE)  # minCollateral of a seat's share
    assert "colluding" in terms["verifications"]["replicate"]
    bad = stack.get("/api/terms", params={"verification": "replicate:9"})
    assert bad.status_code == 400 and bad.json()["field"] == "verification"
    page = stack.get("/submit", headers={"accept": "text/html"}).text
    assert 'id="verification"' in page and 'value="replicate:5"' in page
    # funding with a wallet that has nothing fails naming `from`, not the seat count
    poor = "0x" + os.urandom(20).hex()
    response = prepare(stack, **{"from": poor}, dry_run=True)
    assert response.status_code == 400 and response.json()["field"] == "from", response.text


def _doc_blocks() -> list[str]:
    """The ``sh`` blocks of docs/protocol.md's section 7 (replicated jobs), in order."""
    doc = (ROOT / "docs" / "protocol.md").read_text()
    section = doc.split("## 7. Replicated jobs", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


def test_the_protocol_doc_commands_fund_and_read_a_replicated_job(
    stack: FrontendStack, tmp_path: Path
) -> None:
    """docs/protocol.md section 7, run as written with ``cast`` and ``jq`` against the stack's
    chain: fund three seats, list their ids, and (after three providers deliver by hand, two
    agreeing, and the group is resolved) read the verdict."""
    fund_block, seats_block, verdict_block = _doc_blocks()
    deadline = int(stack.escrow.w3.eth.get_block("latest")["timestamp"]) + 3600
    created_sig = (
        "0x"
        + keccak(
            text="JobCreated(bytes32,address,uint96,uint40,uint16,address,address,uint96,uint8,"
            "address,bytes32,string)"
        ).hex()
    )
    account = stack.devnet.submitters[1]
    env = {
        **os.environ,
        "PATH": f"{ROOT / 'node_modules' / '.bin'}{os.pathsep}{os.environ['PATH']}",
        "RPC": stack.devnet.url,
        "ESCROW": stack.escrow.address,
        "KEY": "0x" + bytes(account.key).hex(),
        "SUBMITTER": account.address,
        "MEDIATOR": stack.mediator.address,
        "OPERATOR": stack.devnet.operator.address,  # section 2 reads it: operator()
        "SPEC_CID": bytes_cid(b'{"doc": "replicated"}'),
        "DEADLINE": str(deadline),
        "BOUNTY": str(SHARE),
        "CREATED_SIG": created_sig,
    }

    def sh(script: str, *names: str) -> dict[str, str]:
        """Run ``script`` in bash; the values of ``names`` it set."""
        dump = f'for v in {" ".join(names)}; do printf "%s=%s\\0" "$v" "${{!v}}"; done'
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", f"{script}\n{dump}"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return dict(item.partition("=")[::2] for item in done.stdout.split("\0") if item)

    found = sh(
        f"{fund_block}\n{seats_block}",
        *("GROUP_SALT", "GROUP_ID", "SEAT_0", "SEATS", "SEAT_COLLATERAL", "GROUP_BOUNTY"),
    )
    group = job_id(account.address, env["SPEC_CID"], bytes.fromhex(found["GROUP_SALT"][2:]))
    seats = ["0x" + s.hex() for s in seat_ids(group, 3)]
    assert found["GROUP_ID"] == "0x" + group.hex() and found["SEAT_0"] == seats[0]
    assert found["SEATS"].split() == seats
    assert found["SEAT_COLLATERAL"] == str(SHARE) and found["GROUP_BOUNTY"] == str(3 * SHARE)
    for seat in seats:
        state = stack.chain_job(seat)
        assert state.status is Status.FUNDED and state.job.bounty == SHARE
        assert state.job.replicas == 3 and state.salt == group

    providers = [
        stack.manual_provider,
        registered(stack, stack.devnet.providers[0]),
        registered(stack, stack.devnet.providers[1]),
    ]
    good, bad = bytes_cid(b"doc: right\n"), bytes_cid(b"doc: wrong\n")
    for seat, provider, output in zip(seats, providers, (good, bad, good), strict=True):
        stack.assign_by_hand(seat, provider)
        stack.submit_by_hand(seat, output)
    states = [stack.chain_job(s) for s in seats]
    if any(s.status is Status.SUBMITTED for s in states):
        with contextlib.suppress(ChainError):  # the scheduler may have resolved it first
            stack.client().resolve(stack.devnet.providers[0], group, states)
    _wait_verdict(stack, seats[0])
    env["BLOCK"] = str(stack.escrow.deployment.block)
    verdict = sh(
        f"GROUP_ID={found['GROUP_ID']}\n{verdict_block}", "WINNING", "AGREEING", "SEAT_COUNT"
    )
    assert verdict["WINNING"] == "0x" + cid_digest(good).hex()
    assert (verdict["AGREEING"], verdict["SEAT_COUNT"]) == ("2", "3")
