"""Stateful property test: random sequences of every escrow function by random actors.

After every step the contract must be solvent to the wei:
    ETH held == bounties of open jobs + withdrawable balances + stakes + fees accrued
and every account's withdrawals must stay within what the events credited it. Each step is a
real transaction on anvil (or a call the contract refused, which must change nothing).

Steps: GRIDMARKET_INVARIANT_STEPS (default 10,000, as CI runs it).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, ClassVar

from eth_account import Account
from eth_account.signers.local import LocalAccount
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from web3 import Web3

from gridmarket.chain import ChainError, Deployment, EscrowClient
from gridmarket.devstack.anvil import Anvil, dev_accounts
from gridmarket.eip712 import sign_result
from gridmarket.escrow import JobState, Status, apply_event

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


class EscrowMachine(RuleBasedStateMachine):
    w3: ClassVar[Web3]
    artifact: ClassVar[tuple[list[dict[str, Any]], str]]
    keys: ClassVar[list[str]]
    steps: ClassVar[int] = 0

    @initialize()
    def deploy(self) -> None:
        accts = [Account.from_key(k) for k in self.keys]
        self.owner, self.operator, self.treasury = accts[0], accts[1], accts[2]
        self.submitters = accts[3:5]
        self.providers = accts[5:8]  # the last one never registers at start
        self.stranger = accts[8]
        self.everyone: list[LocalAccount] = accts[:9]
        abi, code = self.artifact
        factory = self.w3.eth.contract(abi=abi, bytecode=code)
        tx = factory.constructor(
            params(self.operator.address, self.treasury.address)
        ).build_transaction(
            {
                "from": self.owner.address,
                "nonce": self.w3.eth.get_transaction_count(self.owner.address, "pending"),
            }
        )
        receipt = self.w3.eth.wait_for_transaction_receipt(
            self.w3.eth.send_raw_transaction(self.owner.sign_transaction(tx).raw_transaction)
        )
        self.escrow = EscrowClient(
            self.w3,
            Deployment(
                chain_id=self.w3.eth.chain_id,
                escrow=str(receipt["contractAddress"]),
                abi=abi,
                block=int(receipt["blockNumber"]),
            ),
        )
        self.snapshot = self.w3.provider.make_request("evm_snapshot", [])["result"]  # type: ignore[arg-type]
        self.jobs: dict[bytes, JobState] = {}
        self.credited: dict[str, int] = defaultdict(int)
        self.withdrawn: dict[str, int] = defaultdict(int)
        self.stakes: dict[str, int] = defaultdict(int)
        self.fees = 0
        for p in self.providers[:2]:
            self._send(p, "registerProvider", "bafkreimeta", value=10**17)

    # ------------------------------------------------------------------ plumbing
    def _send(self, account: LocalAccount, fn: str, *args: Any, value: int = 0) -> bool:
        EscrowMachine.steps += 1
        try:
            sent = self.escrow.send(account, fn, *args, value=value)
        except ChainError as exc:
            assert exc.reason is not None, f"{fn} failed without a decoded reason: {exc}"
            return False
        for e in sent.events:
            self._observe(e.name, e.args)
        return True

    def _observe(self, name: str, a: dict[str, Any]) -> None:
        if "jobId" in a and name in {
            "JobCreated", "JobAssigned", "JobUnassigned", "ResultSubmitted", "ResultRejected",
            "JobReleased", "JobRefunded",
        }:  # fmt: skip
            jid = bytes(a["jobId"])
            self.jobs[jid] = apply_event(self.jobs.get(jid), name, a)
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

    def _job(self, data: st.DataObject, *statuses: Status) -> JobState | None:
        candidates = [j for j in self.jobs.values() if not statuses or j.status in statuses]
        if not candidates or data.draw(st.integers(0, 9)) == 0:
            candidates = list(self.jobs.values())  # sometimes any job, in any state
        return data.draw(st.sampled_from(candidates)) if candidates else None

    def _actor(self, data: st.DataObject, likely: LocalAccount | None = None) -> LocalAccount:
        if likely is not None and data.draw(st.integers(0, 3)) > 0:
            return likely
        return data.draw(st.sampled_from(self.everyone))

    def _by_address(self, address: str) -> LocalAccount | None:
        return next((a for a in self.everyone if a.address == address), None)

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
        now = self.w3.eth.get_block("latest")["timestamp"]
        self._send(who, "createJob", salt, spec, now + duration, value=bounty)

    @rule(data=st.data())
    def assign(self, data: st.DataObject) -> None:
        job = self._job(data, Status.FUNDED, Status.ASSIGNED)
        if job:
            provider = data.draw(st.sampled_from([*self.providers, self.stranger]))
            who = self._actor(data, self.operator)
            self._send(who, "assign", job.job_id, job.job.as_tuple(), provider.address)

    @rule(data=st.data())
    def unassign(self, data: st.DataObject) -> None:
        job = self._job(data, Status.ASSIGNED)
        if job:
            self._send(self._actor(data, self.operator), "unassign", job.job_id, job.job.as_tuple())

    @rule(data=st.data(), out=st.sampled_from(OUTPUTS))
    def submit(self, data: st.DataObject, out: str) -> None:
        job = self._job(data, Status.ASSIGNED)
        if job:
            who = self._actor(data, self._by_address(job.job.provider))
            self._send(who, "submitResult", job.job_id, job.job.as_tuple(), out)

    @rule(data=st.data(), out=st.sampled_from(OUTPUTS), settle=st.booleans())
    def relay(self, data: st.DataObject, out: str, settle: bool) -> None:
        job = self._job(data, Status.ASSIGNED)
        if job:
            signer = self._actor(data, self._by_address(job.job.provider))
            attempt = job.job.attempt if data.draw(st.integers(0, 5)) else job.job.attempt + 1
            sig = sign_result(signer, self.w3.eth.chain_id, self.escrow.address, job.job_id,
                              attempt, out)  # fmt: skip
            fn = "settle" if settle else "submitResultFor"
            who = self._actor(data, self.operator)
            self._send(who, fn, job.job_id, job.job.as_tuple(), out, sig)

    @rule(data=st.data(), fn=st.sampled_from(["release", "claim", "reject"]))
    def decide(self, data: st.DataObject, fn: str) -> None:
        job = self._job(data, Status.SUBMITTED)
        if job:
            accepter = self._by_address(job.job.submitter)
            likely = {
                "release": data.draw(st.sampled_from([self.operator, accepter])),
                "claim": self._by_address(job.job.provider),
                "reject": self.operator,
            }[fn]  # fmt: skip
            self._send(self._actor(data, likely), fn, job.job_id, job.job.as_tuple())

    @rule(data=st.data(), fn=st.sampled_from(["cancel", "refund"]))
    def give_back(self, data: st.DataObject, fn: str) -> None:
        job = self._job(data, Status.FUNDED, Status.ASSIGNED)
        if job:
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
        self.w3.provider.make_request("evm_increaseTime", [seconds])  # type: ignore[arg-type]
        self.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]

    def teardown(self) -> None:
        if hasattr(self, "snapshot"):
            self.w3.provider.make_request("evm_revert", [self.snapshot])  # type: ignore[arg-type]

    # ------------------------------------------------------------------ invariants
    @invariant()
    def solvent_and_accounted(self) -> None:
        if not hasattr(self, "escrow"):
            return
        e = self.escrow
        addrs = [a.address for a in self.everyone]
        calls = [("feesAccrued", ())] + [("balanceOf", (a,)) for a in addrs]
        stakers = [p.address for p in self.providers] + [self.stranger.address]
        calls += [("providerOf", (a,)) for a in stakers]
        with self.w3.batch_requests() as batch:
            batch.add(self.w3.eth.get_balance(e.address))
            for fn, args in calls:
                batch.add(self.w3.eth.call({"to": e.address, "data": e.encode(fn, *args)}))
            out = batch.execute()
        held = int(out[0])
        values = [e.decode_output(fn, raw) for (fn, _), raw in zip(calls, out[1:], strict=True)]
        fees = int(values[0])
        balances = [int(x) for x in values[1 : 1 + len(addrs)]]
        stakes = [int(x[0]) for x in values[1 + len(addrs) :]]
        escrowed = sum(j.job.bounty for j in self.jobs.values() if j.status in OPEN)
        assert held == escrowed + sum(balances) + sum(stakes) + fees, "escrow is not solvent"
        assert fees == self.fees
        for a, bal in zip(addrs, balances, strict=True):
            assert self.withdrawn[a] <= self.credited[a], f"{a} withdrew more than credited"
            assert bal == self.credited[a] - self.withdrawn[a], f"balance of {a} is off"
        for a, stake in zip(stakers, stakes, strict=True):
            assert stake == self.stakes[a], f"stake of {a} is off"
        if EscrowMachine.steps % 8:
            return  # the per-job storage check is sampled: it costs two more calls
        for j in list(self.jobs.values())[-1:]:
            assert e.call("statusOf", j.job_id) == j.status
            assert e.call("isCurrent", j.job_id, j.job.as_tuple())


def test_escrow_invariants_hold_under_random_use(project: Any) -> None:
    # Its own plain anvil: the one Ape manages runs with step tracing, ~7x slower per call.
    contract_type = project.JobEscrow.contract_type
    with Anvil(accounts=9) as anvil:
        EscrowMachine.w3 = Web3(Web3.HTTPProvider(anvil.url))
        EscrowMachine.artifact = (
            [a.model_dump(mode="json", by_alias=True) for a in contract_type.abi],
            contract_type.deployment_bytecode.bytecode,
        )
        EscrowMachine.keys = dev_accounts(9)
        EscrowMachine.steps = 0
        runs = 0
        while EscrowMachine.steps < TARGET_STEPS:
            runs += 1
            run_state_machine_as_test(
                EscrowMachine,
                settings=settings(
                    max_examples=max(1, (TARGET_STEPS - EscrowMachine.steps) // STEPS_PER_RUN),
                    stateful_step_count=STEPS_PER_RUN,
                    deadline=None,
                    suppress_health_check=list(HealthCheck),
                    database=None,
                    phases=PHASES,
                ),
            )
            assert runs < 200, "the state machine keeps ending early"
    print(f"escrow invariants held over {EscrowMachine.steps} steps")
