"""Stateful property test: random sequences of every escrow function by random actors.

After every step the contract must be solvent to the wei:
    ETH held == bounties of open jobs + withdrawable balances + stakes + fees accrued
every account's withdrawable balance must equal what the events credited it minus what it
withdrew (so nobody withdrew more than it was credited), every stake and the fee pot must match
the events, and every job the step touched must be stored exactly as its events say. Each step is
a real transaction on anvil. A call the contract refuses is first simulated (it must revert with
a decoded custom error), then mined anyway: it must revert on chain too, emit nothing and change
nothing (the full comparison after the step would see any change).

How it stays fast (10,000 steps in under a minute, docs/benchmarks.md): bare JSON-RPC over
one keep-alive connection (web3's middleware cost ~2 ms of Python per call); the dev accounts
are unlocked, so anvil signs, and `eth_sendTransactionSync` returns the receipt in the same
round trip; no gas estimate (a fixed gas limit, one `eth_call` instead); the model is folded
from each receipt's logs; the whole comparison after a step is one batched request; anvil keeps
no history (`--prune-history`). Block timestamps advance by exactly one second per block
(`anvil_setBlockTimestampInterval`), so the simulation sees the very timestamp its transaction
is mined with, and a run does not depend on the wall clock.

Steps: GRIDMARKET_INVARIANT_STEPS (default 10,000, as CI runs it). A step is one transaction
(accepted or refused) or one jump in time.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from collections import Counter, defaultdict
from typing import Any, ClassVar
from urllib.parse import urlsplit

from eth_abi.abi import decode as abi_decode
from eth_abi.abi import encode as abi_encode
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.abi import event_abi_to_log_topic, function_abi_to_4byte_selector
from eth_utils.address import to_checksum_address
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from devstack.anvil import Anvil, dev_accounts
from gridmarket.eip712 import sign_result
from gridmarket.escrow import JOB_EVENTS, Job, JobState, Status, apply_event

from .conftest import params

TARGET_STEPS = int(os.environ.get("GRIDMARKET_INVARIANT_STEPS", "10000"))
STEPS_PER_RUN = 100
# Shrinking replays a failing run many times over; set GRIDMARKET_INVARIANT_SHRINK=1 locally.
PHASES = (
    [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
    if os.environ.get("GRIDMARKET_INVARIANT_SHRINK")
    else [Phase.explicit, Phase.reuse, Phase.generate]
)
SPECS = ["bafkreispec1", "bafkreispec2"]
OUTPUTS = ["bafkreiout1", "bafkreiout2"]
BOUNTIES = [10**15, 10**15 + 1, 3 * 10**17 + 7, 10**18]
SLEEPS = [1, 59, 61, 600, 3601, 7 * 24 * 3600]
OPEN = (Status.FUNDED, Status.ASSIGNED, Status.SUBMITTED)
GAS = hex(1_000_000)  # above any escrow call (settle on a first job is ~71k): no estimate needed
# Known contract behaviour (reported, not changed here): `settle` stores
# `_pack(_hashCalldata(job), Released)`, the commitment of the struct as assigned, while it emits
# ResultSubmitted, whose fold (`apply_event`) sets submittedAt and resultDigest. So after a settle,
# `isCurrent(jobId, <folded struct>)` is false and `isCurrent(jobId, <assigned struct>)` is true.
# The job is terminal, so no call can take that struct again and no money depends on it; the
# two-step path (`submitResult`/`submitResultFor` then `release`/`claim`) commits the folded
# struct. The machine checks a settled job's commitment against the assigned struct, exactly
# (`committed`), so a change on either side shows up here.


# ---------------------------------------------------------------------- bare JSON-RPC
class RpcError(Exception):
    """A JSON-RPC error object; ``data`` holds the revert data of a refused call."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        super().__init__(f"{method}: {error.get('message')} (code {error.get('code')})")
        self.data = error.get("data")


class Rpc:
    """JSON-RPC over one keep-alive HTTP/1.1 connection: single calls and batches."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, 60)
        self._headers = {"Content-Type": "application/json"}

    def _post(self, body: Any) -> Any:
        self._conn.request("POST", "/", json.dumps(body), self._headers)
        response = self._conn.getresponse()
        payload = response.read()
        if response.status != 200:
            raise RuntimeError(f"anvil answered HTTP {response.status}: {payload[:200]!r}")
        return json.loads(payload)

    def call(self, method: str, *params: Any) -> Any:
        reply = self._post({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)})
        if "error" in reply:
            raise RpcError(method, reply["error"])
        return reply["result"]

    def batch(self, calls: list[tuple[str, list[Any]]]) -> list[Any]:
        """Results in the order of ``calls``; any error fails the whole batch."""
        body = [
            {"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(calls)
        ]
        replies = sorted(self._post(body), key=lambda r: int(r["id"]))
        for (method, _), reply in zip(calls, replies, strict=True):
            if "error" in reply:
                raise RpcError(method, reply["error"])
        return [r["result"] for r in replies]

    def close(self) -> None:
        self._conn.close()


def _abi_type(param: dict[str, Any]) -> str:
    kind = str(param["type"])
    if kind.startswith("tuple"):
        inner = ",".join(_abi_type(c) for c in param["components"])
        return f"({inner}){kind[len('tuple') :]}"
    return kind


class Codec:
    """Calldata, return values, custom errors and logs of the escrow, from precomputed ABI data."""

    def __init__(self, abi: list[dict[str, Any]], addresses: list[str]) -> None:
        self.fns = {
            f["name"]: (
                function_abi_to_4byte_selector(f),  # type: ignore[arg-type]
                [_abi_type(i) for i in f["inputs"]],
                [_abi_type(o) for o in f["outputs"]],
            )
            for f in abi
            if f["type"] == "function"
        }
        self.constructor = next(
            [_abi_type(i) for i in f["inputs"]] for f in abi if f["type"] == "constructor"
        )
        self.errors = {
            function_abi_to_4byte_selector(e): (e["name"], e["inputs"])  # type: ignore[arg-type]
            for e in abi
            if e["type"] == "error"
        }
        self.events = {
            event_abi_to_log_topic(e): (  # type: ignore[arg-type]
                e["name"],
                [(i["name"], _abi_type(i)) for i in e["inputs"] if i["indexed"]],
                [i["name"] for i in e["inputs"] if not i["indexed"]],
                [_abi_type(i) for i in e["inputs"] if not i["indexed"]],
            )
            for e in abi
            if e["type"] == "event"
        }
        # eth-abi decodes addresses lower-case; the model keys are checksummed.
        self._checksum = {a.lower(): a for a in addresses}

    def address(self, raw: str) -> str:
        return self._checksum.get(raw) or to_checksum_address(raw)

    def encode(self, fn: str, *args: Any) -> str:
        selector, types, _ = self.fns[fn]
        return "0x" + (selector + abi_encode(types, list(args))).hex()

    def decode_output(self, fn: str, raw: str) -> Any:
        values = abi_decode(self.fns[fn][2], bytes.fromhex(raw[2:]))
        return values[0] if len(values) == 1 else values

    def decode_error(self, data: Any) -> str | None:
        """``Name(arg=value, ...)`` for a custom-error revert, else None."""
        if not isinstance(data, str) or len(data) < 10:
            return None
        raw = bytes.fromhex(data[2:])
        known = self.errors.get(raw[:4])
        if known is None:
            return None
        name, inputs = known
        values = abi_decode([_abi_type(i) for i in inputs], raw[4:])
        shown = ", ".join(f"{i['name']}={v!r}" for i, v in zip(inputs, values, strict=True))
        return f"{name}({shown})"

    def decode_log(self, log: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        topics = log["topics"]
        known = self.events.get(bytes.fromhex(topics[0][2:])) if topics else None
        if known is None:
            return None
        name, indexed, names, types = known
        args: dict[str, Any] = {}
        for (arg, kind), topic in zip(indexed, topics[1:], strict=True):
            (args[arg],) = abi_decode([kind], bytes.fromhex(topic[2:]))
        args.update(zip(names, abi_decode(types, bytes.fromhex(log["data"][2:])), strict=True))
        for arg, value in args.items():
            if isinstance(value, str) and value.startswith("0x") and len(value) == 42:
                args[arg] = self.address(value)
        return name, args


# ---------------------------------------------------------------------- the state machine
class EscrowMachine(RuleBasedStateMachine):
    rpc: ClassVar[Rpc]
    codec: ClassVar[Codec]
    bytecode: ClassVar[str]
    keys: ClassVar[list[str]]
    chain_id: ClassVar[int]
    steps: ClassVar[int] = 0
    refused: ClassVar[int] = 0
    examples: ClassVar[int] = 0
    accepted: ClassVar[Counter[str]] = Counter()

    @initialize()
    def deploy(self) -> None:
        EscrowMachine.examples += 1
        accts = [Account.from_key(k) for k in self.keys]
        self.owner, self.operator, self.treasury = accts[0], accts[1], accts[2]
        self.submitters = accts[3:5]
        self.providers = accts[5:8]  # the last one never registers at start
        self.stranger = accts[8]
        self.everyone: list[LocalAccount] = accts[:9]
        self.addrs = [a.address for a in self.everyone]
        self.stakers = [p.address for p in self.providers] + [self.stranger.address]
        args = abi_encode(
            self.codec.constructor, [params(self.operator.address, self.treasury.address)]
        )
        receipt = self.rpc.call(
            "eth_sendTransactionSync",
            {"from": self.owner.address, "data": self.bytecode + args.hex()},
        )
        assert receipt["status"] == "0x1", "the escrow could not be deployed"
        self.escrow = to_checksum_address(receipt["contractAddress"])
        reads = [("feesAccrued", ())] + [("balanceOf", (a,)) for a in self.addrs]
        reads += [("providerOf", (a,)) for a in self.stakers]
        self.views: list[tuple[str, list[Any]]] = [("eth_getBalance", [self.escrow, "latest"])]
        self.views += [
            ("eth_call", [{"to": self.escrow, "data": self.codec.encode(fn, *a)}, "latest"])
            for fn, a in reads
        ]
        self.now = int(receipt["blockTimestamp"])
        self.snapshot = self.rpc.call("evm_snapshot")
        self.jobs: dict[bytes, JobState] = {}
        self.touched: set[bytes] = set()
        self.committed: dict[bytes, Job] = {}  # where the chain's struct is not the folded one
        self.clean = True  # False from a step's start until its invariant passed
        self.credited: dict[str, int] = defaultdict(int)
        self.withdrawn: dict[str, int] = defaultdict(int)
        self.stakes: dict[str, int] = defaultdict(int)
        self.fees = 0
        for p in self.providers[:2]:
            self._send(p, "registerProvider", "bafkreimeta", value=10**17)

    # ------------------------------------------------------------------ plumbing
    def _send(self, account: LocalAccount, fn: str, *args: Any, value: int = 0) -> bool:
        """Simulate, then mine, ``fn(*args)``; fold the events; True when it was accepted.

        A refused call must revert with a decoded custom error in the simulation, and must
        revert on chain with no logs (its state is compared after the step like any other).
        """
        EscrowMachine.steps += 1
        self.clean = False
        if args and isinstance(args[0], bytes) and len(args[0]) == 32 and fn != "createJob":
            self.touched.add(args[0])
        tx = {
            "from": account.address,
            "to": self.escrow,
            "data": self.codec.encode(fn, *args),
            "value": hex(value),
            "gas": GAS,
        }
        reason: str | None = None
        try:
            self.rpc.call("eth_call", tx, "pending")  # the block it will be mined in
        except RpcError as exc:
            reason = self.codec.decode_error(exc.data)
            assert reason is not None, f"{fn} was refused without a decoded reason: {exc}"
        receipt = self.rpc.call("eth_sendTransactionSync", tx)
        self.now = int(receipt["blockTimestamp"])
        accepted = receipt["status"] == "0x1"
        assert accepted == (reason is None), (
            f"{fn}: the simulation said {reason or 'accepted'} but the mined transaction "
            f"{'succeeded' if accepted else 'reverted'} in the same block"
        )
        if accepted:
            EscrowMachine.accepted[fn] += 1
        else:
            EscrowMachine.refused += 1
            assert not receipt["logs"], f"refused {fn} ({reason}) emitted logs"
            return False
        events: list[tuple[str, dict[str, Any]]] = []
        for log in receipt["logs"]:
            assert log["address"].lower() == self.escrow.lower(), f"{fn}: log of another address"
            decoded = self.codec.decode_log(log)
            assert decoded is not None, f"{fn} emitted a log the ABI does not know: {log}"
            events.append(decoded)
        per_job: dict[bytes, list[str]] = defaultdict(list)
        for name, a in events:
            if name in JOB_EVENTS:
                per_job[bytes(a["jobId"])].append(name)
        before = {jid: self.jobs.get(jid) for jid in per_job}
        for name, a in events:
            self._observe(name, a)
        for jid, names in per_job.items():
            prior = before[jid]
            if names == ["ResultSubmitted", "JobReleased"] and prior is not None:
                # `settle` commits the struct it was given (the assignment) with the status
                # Released, not the struct with the result folded in (the note at the top).
                self.committed[jid] = prior.job
        return True

    def _observe(self, name: str, a: dict[str, Any]) -> None:
        if name in JOB_EVENTS:
            jid = bytes(a["jobId"])
            self.jobs[jid] = apply_event(self.jobs.get(jid), name, a)
            self.touched.add(jid)
        if name == "JobReleased":
            self.credited[a["provider"]] += a["payout"]
            self.fees += a["fee"]
        elif name == "JobRefunded":
            self.credited[a["submitter"]] += a["amount"]
        elif name == "ProviderSlashed":
            self.credited[a["beneficiary"]] += a["amount"]
            self.stakes[a["provider"]] -= a["amount"]
        elif name == "Staked":
            self.stakes[a["provider"]] += a["amount"]
        elif name == "Unstaked":
            self.stakes[a["provider"]] -= a["amount"]
            self.credited[a["provider"]] += a["amount"]
        elif name == "FeesCollected":
            self.fees -= a["amount"]
            self.credited[a["treasury"]] += a["amount"]
        elif name == "Withdrawn":
            self.withdrawn[a["account"]] += a["amount"]

    def _job(self, data: st.DataObject, *statuses: Status) -> JobState:
        candidates = [j for j in self.jobs.values() if not statuses or j.status in statuses]
        if not candidates or data.draw(st.integers(0, 9)) == 0:
            candidates = list(self.jobs.values())  # sometimes any job, in any state
        return data.draw(st.sampled_from(candidates))

    def _actor(self, data: st.DataObject, likely: LocalAccount | None = None) -> LocalAccount:
        if likely is not None and data.draw(st.integers(0, 3)) > 0:
            return likely
        return data.draw(st.sampled_from(self.everyone))

    def _by_address(self, address: str) -> LocalAccount | None:
        return next((a for a in self.everyone if a.address == address), None)

    def _has_jobs(self) -> bool:
        return bool(getattr(self, "jobs", None))

    # ------------------------------------------------------------------ rules
    @rule(
        data=st.data(),
        bounty=st.sampled_from(BOUNTIES),
        spec=st.sampled_from(SPECS),
        duration=st.sampled_from([30, 120, 3600]),
        salt=st.binary(min_size=32, max_size=32),
    )
    def create(
        self, data: st.DataObject, bounty: int, spec: str, duration: int, salt: bytes
    ) -> None:
        who = data.draw(st.sampled_from([*self.submitters, self.stranger]))
        self._send(who, "createJob", salt, spec, self.now + duration, value=bounty)

    @precondition(_has_jobs)
    @rule(data=st.data())
    def assign(self, data: st.DataObject) -> None:
        job = self._job(data, Status.FUNDED, Status.ASSIGNED)
        provider = data.draw(st.sampled_from([*self.providers, self.stranger]))
        who = self._actor(data, self.operator)
        self._send(who, "assign", job.job_id, job.job.as_tuple(), provider.address)

    @precondition(_has_jobs)
    @rule(data=st.data())
    def unassign(self, data: st.DataObject) -> None:
        job = self._job(data, Status.ASSIGNED)
        self._send(self._actor(data, self.operator), "unassign", job.job_id, job.job.as_tuple())

    @precondition(_has_jobs)
    @rule(data=st.data(), out=st.sampled_from(OUTPUTS))
    def submit(self, data: st.DataObject, out: str) -> None:
        job = self._job(data, Status.ASSIGNED)
        who = self._actor(data, self._by_address(job.job.provider))
        self._send(who, "submitResult", job.job_id, job.job.as_tuple(), out)

    @precondition(_has_jobs)
    @rule(data=st.data(), out=st.sampled_from(OUTPUTS), settle=st.booleans())
    def relay(self, data: st.DataObject, out: str, settle: bool) -> None:
        job = self._job(data, Status.ASSIGNED)
        signer = self._actor(data, self._by_address(job.job.provider))
        attempt = job.job.attempt if data.draw(st.integers(0, 5)) else job.job.attempt + 1
        sig = sign_result(signer, self.chain_id, self.escrow, job.job_id, attempt, out)
        fn = "settle" if settle else "submitResultFor"
        who = self._actor(data, self.operator)
        self._send(who, fn, job.job_id, job.job.as_tuple(), out, sig)

    @precondition(_has_jobs)
    @rule(data=st.data(), fn=st.sampled_from(["release", "claim", "reject"]))
    def decide(self, data: st.DataObject, fn: str) -> None:
        job = self._job(data, Status.SUBMITTED)
        accepter = self._by_address(job.job.submitter)
        likely = {
            "release": data.draw(st.sampled_from([self.operator, accepter])),
            "claim": self._by_address(job.job.provider),
            "reject": self.operator,
        }[fn]  # fmt: skip
        self._send(self._actor(data, likely), fn, job.job_id, job.job.as_tuple())

    @precondition(_has_jobs)
    @rule(data=st.data(), fn=st.sampled_from(["cancel", "refund"]))
    def give_back(self, data: st.DataObject, fn: str) -> None:
        job = self._job(data, Status.FUNDED, Status.ASSIGNED)
        who = self._actor(data, self._by_address(job.job.submitter))
        self._send(who, fn, job.job_id, job.job.as_tuple())

    @rule(data=st.data(), to_other=st.booleans())
    def withdraw(self, data: st.DataObject, to_other: bool) -> None:
        who = data.draw(st.sampled_from(self.everyone))
        if to_other:
            self._send(who, "withdrawTo", data.draw(st.sampled_from(self.everyone)).address)
        else:
            self._send(who, "withdraw")

    @rule(data=st.data(), amount=st.sampled_from([1, 10**16, 5 * 10**16, 10**17, 10**18]))
    def registry(self, data: st.DataObject, amount: int) -> None:
        who = data.draw(st.sampled_from([*self.providers, self.stranger]))
        op = data.draw(st.sampled_from(["register", "stake", "request", "complete"]))
        if op == "register":
            self._send(
                who,
                "registerProvider",
                "bafkreimeta2",
                value=data.draw(st.sampled_from([0, amount])),
            )
        elif op == "stake":
            self._send(who, "stake", value=amount)
        elif op == "request":
            self._send(who, "requestUnstake", amount)
        else:
            self._send(who, "completeUnstake")

    @rule(data=st.data())
    def collect_fees(self, data: st.DataObject) -> None:
        self._send(data.draw(st.sampled_from(self.everyone)), "collectFees")

    @rule(seconds=st.sampled_from(SLEEPS))
    def sleep(self, seconds: int) -> None:
        EscrowMachine.steps += 1
        self.clean = False
        self.now += seconds
        self.rpc.call("evm_mine", {"timestamp": self.now})  # one empty block, `seconds` later

    def teardown(self) -> None:
        if not hasattr(self, "snapshot"):
            return
        try:
            if self.clean:  # not after a failure: that would hide the first error
                self._check_jobs(list(self.jobs))  # the whole job table, once per run
        finally:
            self.rpc.call("evm_revert", self.snapshot)

    # ------------------------------------------------------------------ invariants
    def _stored(self, jid: bytes) -> tuple[Any, ...]:
        """The struct the chain must hold the commitment of for job ``jid``."""
        job = self.committed.get(jid) or self.jobs[jid].job
        return job.as_tuple()

    def _job_calls(self, jid: bytes) -> list[tuple[str, list[Any]]]:
        """``statusOf`` and ``isCurrent`` of one job, as batch entries."""
        status = self.codec.encode("statusOf", jid)
        current = self.codec.encode("isCurrent", jid, self._stored(jid))
        return [("eth_call", [{"to": self.escrow, "data": d}, "latest"]) for d in (status, current)]

    def _check_job(self, jid: bytes, status_raw: str, current_raw: str) -> None:
        """The job is stored on chain in exactly the state its events give."""
        (status,) = _words(status_raw, 1)
        assert status == self.jobs[jid].status, (
            f"job 0x{jid.hex()} is {status} on chain, its events say {self.jobs[jid].status!r}"
        )
        assert _words(current_raw, 1) == [1], (
            f"job 0x{jid.hex()}: the chain's commitment is not the struct its events give"
        )

    def _check_jobs(self, job_ids: list[bytes]) -> None:
        calls = [call for jid in job_ids for call in self._job_calls(jid)]
        out = self.rpc.batch(calls) if calls else []
        for k, jid in enumerate(job_ids):
            self._check_job(jid, out[2 * k], out[2 * k + 1])

    @invariant()
    def solvent_and_accounted(self) -> None:
        """The whole money state and every touched job against the model: one batched request.

        The calldata of the fixed views is built once per run and the answers are read as raw
        32-byte words: ABI-coding 15 calls each step cost more than the node answering them.
        """
        if not hasattr(self, "escrow"):
            return
        touched = [jid for jid in self.touched if jid in self.jobs]
        self.touched = set()
        calls = self.views + [call for jid in touched for call in self._job_calls(jid)]
        out = self.rpc.batch(calls)
        n, m = len(self.addrs), len(self.stakers)
        held = int(out[0], 16)
        (fees,) = _words(out[1], 1)
        balances = [_words(raw, 1)[0] for raw in out[2 : 2 + n]]
        stakes = [_words(raw, 4)[0] for raw in out[2 + n : 2 + n + m]]  # Provider.stake
        escrowed = sum(j.job.bounty for j in self.jobs.values() if j.status in OPEN)
        assert held == escrowed + sum(balances) + sum(stakes) + fees, (
            f"escrow is not solvent: holds {held} wei, owes {escrowed} in open bounties + "
            f"{sum(balances)} withdrawable + {sum(stakes)} staked + {fees} fees"
        )
        assert fees == self.fees, f"feesAccrued is {fees}, the events say {self.fees}"
        for a, bal in zip(self.addrs, balances, strict=True):
            assert self.withdrawn[a] <= self.credited[a], f"{a} withdrew more than credited"
            assert bal == self.credited[a] - self.withdrawn[a], (
                f"balance of {a} is {bal}, events say {self.credited[a] - self.withdrawn[a]}"
            )
        for a, stake in zip(self.stakers, stakes, strict=True):
            assert stake == self.stakes[a], f"stake of {a} is {stake}, events say {self.stakes[a]}"
        rest = out[2 + n + m :]
        for k, jid in enumerate(touched):
            self._check_job(jid, rest[2 * k], rest[2 * k + 1])
        self.clean = True


def _words(raw: str, count: int) -> list[int]:
    """A static ABI return value of exactly ``count`` 32-byte words, as integers."""
    assert len(raw) == 2 + 64 * count, f"expected {count} words, got {raw!r}"
    return [int(raw[2 + 64 * i : 66 + 64 * i], 16) for i in range(count)]


def test_escrow_invariants_hold_under_random_use(project: Any) -> None:
    # Its own plain anvil: the one Ape manages runs with step tracing, ~7x slower per call.
    # No history: every read is at the head, and keeping past states made each 1,000 steps
    # slower than the last (5 s for the first, 26 s for the tenth).
    contract_type = project.JobEscrow.contract_type
    abi = [a.model_dump(mode="json", by_alias=True) for a in contract_type.abi]
    keys = dev_accounts(9)
    with Anvil(accounts=9, prune_history=True) as anvil:
        rpc = Rpc(anvil.url)
        # Each block one second after the last, whatever the wall clock says (sleeps jump).
        rpc.call("anvil_setBlockTimestampInterval", 1)
        EscrowMachine.rpc = rpc
        EscrowMachine.codec = Codec(abi, [Account.from_key(k).address for k in keys])
        EscrowMachine.bytecode = str(contract_type.deployment_bytecode.bytecode)
        EscrowMachine.keys = keys
        EscrowMachine.chain_id = int(rpc.call("eth_chainId"), 16)
        EscrowMachine.steps = EscrowMachine.refused = EscrowMachine.examples = 0
        EscrowMachine.accepted = Counter()
        started = time.perf_counter()
        runs = 0
        try:
            while EscrowMachine.steps < TARGET_STEPS:
                runs += 1
                run_state_machine_as_test(
                    EscrowMachine,
                    settings=settings(
                        max_examples=max(
                            1, -(-(TARGET_STEPS - EscrowMachine.steps) // STEPS_PER_RUN)
                        ),
                        stateful_step_count=STEPS_PER_RUN,
                        deadline=None,
                        suppress_health_check=list(HealthCheck),
                        database=None,
                        phases=PHASES,
                    ),
                )
                assert runs < 200, "the state machine keeps ending early"
        finally:
            rpc.close()
    elapsed = time.perf_counter() - started
    print(
        f"escrow invariants held over {EscrowMachine.steps} steps "
        f"({EscrowMachine.refused} refused) in {EscrowMachine.examples} runs: "
        f"{elapsed:.1f} s, {1000 * elapsed / max(1, EscrowMachine.steps):.2f} ms/step; accepted: "
        + ", ".join(f"{fn} {n}" for fn, n in sorted(EscrowMachine.accepted.items()))
    )
