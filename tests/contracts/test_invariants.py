"""Stateful property test of the escrow (version 5): random sequences of every escrow function
by random actors, a malicious operator among them, with single, spot-checked (``FLAG_SPOT``) and
replicated jobs paid in ETH or in TestUSD (an allow-listed ERC-20, 6 decimals), and stakes in
both.

Actors: two submitters, three registered providers (one of them cheats: it delivers a bad output
the mediator rules against), a provider that registers later, the mediator listed at deployment,
a stranger, the owner, the treasury, and the operator, who besides its honest work tries every
job function on every job with whatever acceptances it has seen (replays included). Since
version 5 also: providers signing holds longer than `reassignDelay` and an operator trying to
take those jobs back early (`take_back`), a mediator ruling seats at any time and in either
form (`mediator_seats`), a submitter cancelling seats or the group (`submitter_seats`), and an
operator giving one wallet a second seat with that wallet's own acceptance (`double_seat`);
funding sometimes names an operator that is not in office. On a spot job
the mediator opens checks (`dispute`, sending nothing) and the submitter disputes sending nothing
too; both, and everyone else, also try it with ETH, on other jobs and out of time.

After every step, for ETH and for the token alike:
- solvency to the smallest unit: what the escrow holds (its ETH; its tUSD `balanceOf`) == the
  bounties of open jobs in that currency (Funded, Assigned, Submitted, Disputed) + the check
  deposit (the bounty again) of every open spot job + withdrawable balances + stakes + stakes
  pending unstake + fees accrued + the dispute deposit of every Disputed job that is not a spot
  job (`depositOf`: the bounty for a token job, for an ETH job the bounty but at least
  `disputeDeposit`, FLOOR here, which lies between the smallest and the largest BOUNTIES);
- every balance, stake, pending unstake and fee pot, per currency, equal what the events say
  (nobody withdrew more than it was credited);
- every provider's locked collateral in each currency == the collateral of the jobs in that
  currency it holds (Assigned, Submitted, Disputed);
- consent: every JobReleased came from the submitter's `release`, a `finalize` after the
  challenge window (or after the mediation window of a dispute), the job's mediator upholding
  it (`rule(.., true)`), or the job's operator on a job funded on-verify (`settle`/`release`);
  every ProviderSlashed from the job's mediator ruling against the result, for exactly the
  job's collateral, of which the mediator gets `min(collateral, deposit)` after a dispute and
  nothing on its own check (the submitter the rest, and its deposit back in full);
- deposits: every Credited is one of the escrow's deposit movements, for exactly the job's
  deposit, to the party and on the call its reason names ("result upheld": the mediator's
  upholding `rule` of a Disputed job; "deposit returned": a non-spot dispute ruled wrong; "deposit
  returned: no ruling": `finalize` of a Disputed job; "check deposit returned": a spot job ending
  any other way), and a spot job's check deposit is paid out exactly once: never while the job is
  open, once when it ends (Released or Refunded);
- replicated jobs: a seat is paid by `resolve` only when the seats' results (Submitted or
  already paid, one vote per distinct provider, as the model counts them before the call) agree
  in a strict majority of k, and only the seats with that result; a seat is slashed by `resolve`
  only for a result other than the majority's; `resolve` without a majority only refunds, and
  only after the deadline plus the mediation window, except the submitter's cancel of a group
  whose seats are all Funded. The cheater is one wallet: it never holds two seats of a job
  (every JobAssigned of a seat goes to a wallet that held no other seat of the group), so its
  bad output is never the majority;
- a seat is ruled (paid or slashed by `rule`) only when the seats hold no strict majority, no
  seat is still running (or the deadline passed), and before the deadline plus the mediation
  window;
- a job is taken from its provider (the operator's `unassign`, or a reassignment) only at or
  after ``max(since + reassignDelay, holdUntil)``, the hold the provider signed for
  (``holdFor``); the provider hands it back at any time;
- every job the step touched is stored exactly as its events fold (`statusOf`, `isCurrent` of
  the folded struct); the whole job table again at the end of each run.
Each step is a real transaction on anvil. A call the contract refuses is first simulated (it
must revert with a decoded custom error), then mined anyway: it must revert on chain too, emit
nothing and change nothing (the full comparison after the step would see any change).

How it stays fast: bare JSON-RPC over one keep-alive connection; the dev accounts are unlocked,
so anvil signs, and `eth_sendTransactionSync` returns the receipt in the same round trip; no gas
estimate (a fixed gas limit, one `eth_call` instead); the model is folded from each receipt's
logs; the whole comparison after a step is one batched request; anvil keeps no history
(`--prune-history`). Block timestamps advance by exactly one second per block
(`anvil_setBlockTimestampInterval`), so the simulation sees the very timestamp its transaction
is mined with, and a run does not depend on the wall clock.

Steps: GRIDMARKET_INVARIANT_STEPS (default 10,000, the issue's bar: about 70 s on the 2-core
dev machine, 5.8 ms a step idle and 9 to 14 ms under the load of parallel work; 10,013 steps
took 87.5 s at load 6). Set it higher for a longer run. A step is one transaction (accepted or
refused) or one jump in time. Each run prints its steps, time, accepted calls by function,
refusals by error, and how each payout and slash was authorised.
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
    rule,
    run_state_machine_as_test,
)

from devstack.anvil import Anvil, dev_accounts
from gridmarket.eip712 import sign_acceptance, sign_result
from gridmarket.escrow import (
    FLAG_ON_VERIFY,
    FLAG_SPOT,
    JOB_EVENTS,
    ZERO_HASH,
    Job,
    JobState,
    Status,
    apply_event,
    assign_target,
    cid_digest,
    rule_args,
    seat_ids,
)

from .conftest import CHALLENGE, MEDIATION_WINDOW, REASSIGN_DELAY, params

TARGET_STEPS = int(os.environ.get("GRIDMARKET_INVARIANT_STEPS", "10000"))
STEPS_PER_RUN = 100
# Shrinking replays a failing run many times over; set GRIDMARKET_INVARIANT_SHRINK=1 locally.
PHASES = (
    [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
    if os.environ.get("GRIDMARKET_INVARIANT_SHRINK")
    else [Phase.explicit, Phase.reuse, Phase.generate]
)
SPECS = ["bafkreispec1", "bafkreispec2"]
GOOD, BAD = "bafkreigoodoutput", "bafkreibadoutput"
OTHER = "bafkreiothergoodoutput"
"""An honest provider's other output (a job that is not quite deterministic): ties."""
BOUNTIES = [10**15, 10**15 + 1, 3 * 10**17 + 7, 10**18]
FLOOR = 10**16
"""`disputeDeposit` of the machine's escrow: an ETH job's dispute deposit is its bounty, at
least this, so the two smallest BOUNTIES deposit the floor (more than their collateral, unless
doubled) and the two largest their bounty."""
T_MIN = 10**6  # tokenMinBounty of tUSD: 1 tUSD
T_BOUNTIES = [T_MIN, T_MIN + 1, 3 * 10**7 + 7, 10**8]
T_FUNDS = 10**13  # tUSD minted to each account
ETH = "0x" + "00" * 20
MAX_UINT = 2**256 - 1
SLEEPS = [1, 59, REASSIGN_DELAY, CHALLENGE + 1, MEDIATION_WINDOW, 7 * 24 * 3600]
HOLDS = [0, 0, 0, 2 * REASSIGN_DELAY, CHALLENGE]
"""The seconds a provider signs for (`holdFor`): zero (the operator may take the job back after
`reassignDelay`), or longer than `reassignDelay` (a long run: not before `holdUntil`)."""
DURATIONS = [3600, 120, 24 * 3600]
SINGLE_FLAGS = [0, 0, FLAG_ON_VERIFY, FLAG_ON_VERIFY, FLAG_SPOT]
"""A single job's flags: plain and on-verify as often as before spot jobs came, one in five spot."""
DEPOSIT_REASONS = {
    "result upheld", "deposit returned", "deposit returned: no ruling", "check deposit returned",
}  # fmt: skip
HOLDING = (Status.ASSIGNED, Status.SUBMITTED, Status.DISPUTED)
OPEN = (Status.FUNDED, *HOLDING)
JOB_FUNCTIONS = [
    "assign", "unassign", "submitResult", "submitResultFor", "settle", "release", "finalize",
    "dispute", "rule", "cancel", "refund",
]  # fmt: skip
GAS = hex(1_000_000)  # above any escrow call: no estimate needed
N_ACCOUNTS = 11
WEIGHTS = {
    "create": 3, "assign": 4, "unassign": 1, "submit": 2, "relay": 3, "release": 2,
    "finalize": 2, "dispute": 2, "rule_on": 2, "give_back": 1, "malicious_operator": 3,
    "withdraw": 1, "registry": 1, "collect_fees": 1, "sleep": 3, "progress": 10,
    "create_group": 2, "resolve_group": 2, "create_token": 2, "create_token_group": 1,
    "mediator_seats": 1, "submitter_seats": 1, "double_seat": 1, "take_back": 1,
}  # fmt: skip
ACTIONS = [name for name, weight in WEIGHTS.items() for _ in range(weight)]
NEEDS_JOBS = {
    "assign", "unassign", "submit", "relay", "release", "finalize", "dispute", "rule_on",
    "give_back", "malicious_operator", "resolve_group", "mediator_seats", "submitter_seats",
    "double_seat", "take_back",
}  # fmt: skip


# ---------------------------------------------------------------------- bare JSON-RPC
def _spot(job: Job) -> bool:
    return bool(job.flags & FLAG_SPOT)


def _deposit_of(job: Job) -> int:
    """`depositOf(job)`: the bounty (in the job's token), for an ETH job that is not a spot job
    at least FLOOR."""
    return max(job.bounty, FLOOR) if job.token == ETH and not _spot(job) else job.bounty


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
    token_codec: ClassVar[Codec]
    bytecode: ClassVar[str]
    token_bytecode: ClassVar[str]
    keys: ClassVar[list[str]]
    chain_id: ClassVar[int]
    steps: ClassVar[int] = 0
    refused: ClassVar[int] = 0
    examples: ClassVar[int] = 0
    accepted: ClassVar[Counter[str]] = Counter()
    reasons: ClassVar[Counter[str]] = Counter()
    paid_by: ClassVar[Counter[str]] = Counter()

    @initialize()
    def deploy(self) -> None:
        EscrowMachine.examples += 1
        accts = [Account.from_key(k) for k in self.keys]
        self.owner, self.operator, self.treasury = accts[0], accts[1], accts[2]
        self.submitters = accts[3:5]
        self.providers = accts[5:8]  # accts[7] cheats
        self.cheater = accts[7]
        self.mediator = accts[8]
        self.stranger = accts[9]
        self.late = accts[10]  # a provider that is not registered at the start
        self.everyone: list[LocalAccount] = accts
        self.addrs = [a.address for a in self.everyone]
        args = abi_encode(
            self.codec.constructor,
            [
                params(
                    self.operator.address,
                    self.treasury.address,
                    self.mediator.address,
                    dispute_deposit=FLOOR,
                )
            ],
        )
        receipt = self.rpc.call(
            "eth_sendTransactionSync",
            {"from": self.owner.address, "data": self.bytecode + args.hex()},
        )
        assert receipt["status"] == "0x1", "the escrow could not be deployed"
        self.escrow = to_checksum_address(receipt["contractAddress"])
        self.usd = self._deploy_token()
        usd = self.usd
        reads: list[tuple[str, tuple[Any, ...]]] = [("feesAccrued", ())]
        reads += [("balanceOf", (a,)) for a in self.addrs]
        reads += [("providerOf", (a,)) for a in self.addrs]
        reads += [("tokenFeesAccrued", (usd,))]
        reads += [("balanceOfToken", (a, usd)) for a in self.addrs]
        reads += [("stakeOf", (a, usd)) for a in self.addrs]
        self.views: list[tuple[str, list[Any]]] = [("eth_getBalance", [self.escrow, "latest"])]
        self.views += [
            ("eth_call", [{"to": self.escrow, "data": self.codec.encode(fn, *a)}, "latest"])
            for fn, a in reads
        ]
        held = self.token_codec.encode("balanceOf", self.escrow)
        self.views.append(("eth_call", [{"to": usd, "data": held}, "latest"]))
        self.now = int(receipt["blockTimestamp"])
        self.snapshot = self.rpc.call("evm_snapshot")
        self.jobs: dict[bytes, JobState] = {}
        self.touched: set[bytes] = set()
        self.clean = True  # False from a step's start until its invariant passed
        # the model's money, keyed by (account, currency): ETH is the zero address
        self.credited: dict[tuple[str, str], int] = defaultdict(int)
        self.withdrawn: dict[tuple[str, str], int] = defaultdict(int)
        self.stakes: dict[tuple[str, str], int] = defaultdict(int)
        self.pending: dict[tuple[str, str], int] = defaultdict(int)
        self.fees: dict[str, int] = defaultdict(int)
        self.seen_acceptances: list[tuple[str, bytes]] = []  # what the operator was ever given
        self.salts = 0
        self.groups: dict[bytes, list[bytes]] = {}
        self.seat_holders: dict[bytes, dict[str, int]] = {}  # group -> wallet -> its seat
        self.before: dict[bytes, JobState] = {}
        self.check_paid: Counter[bytes] = Counter()  # a spot job's check deposit paid out
        for p, stake in zip(self.providers, (2 * 10**18, 2 * 10**18, 10**18), strict=True):
            self._send(p, "registerProvider", "bafkreimeta", value=stake)
            self._send(p, "stakeToken", usd, stake // 10**10)  # 200, 200 and 100 tUSD

    def _deploy_token(self) -> str:
        """TestUSD, listed at 1 tUSD; every account holds T_FUNDS and has approved the escrow
        for all of it (so a token dispute or stake is refused only by the escrow's rules)."""
        receipt = self.rpc.call(
            "eth_sendTransactionSync", {"from": self.owner.address, "data": self.token_bytecode}
        )
        assert receipt["status"] == "0x1", "TestUSD could not be deployed"
        usd = to_checksum_address(receipt["contractAddress"])
        self._setup_tx(self.owner, self.escrow, self.codec.encode("setToken", usd, T_MIN))
        for a in self.everyone:
            self._setup_tx(self.owner, usd, self.token_codec.encode("mint", a.address, T_FUNDS))
            self._setup_tx(a, usd, self.token_codec.encode("approve", self.escrow, MAX_UINT))
        return usd

    def _setup_tx(self, account: LocalAccount, to: str, data: str) -> None:
        tx = {"from": account.address, "to": to, "data": data, "gas": GAS}
        receipt = self.rpc.call("eth_sendTransactionSync", tx)
        assert receipt["status"] == "0x1", f"set-up transaction to {to} failed"

    # ------------------------------------------------------------------ plumbing
    def _send(self, account: LocalAccount, fn: str, *args: Any, value: int = 0) -> bool:
        """Simulate, then mine, ``fn(*args)``; fold the events; True when it was accepted.

        A refused call must revert with a decoded custom error in the simulation, and must
        revert on chain with no logs (its state is compared after the step like any other).
        """
        EscrowMachine.steps += 1
        self.clean = False
        if (
            args
            and isinstance(args[0], bytes)
            and len(args[0]) == 32
            and fn not in ("createJob", "createJobWith")
        ):
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
        if not accepted:
            EscrowMachine.refused += 1
            EscrowMachine.reasons[f"{fn}: {str(reason).split('(')[0]}"] += 1
            assert not receipt["logs"], f"refused {fn} ({reason}) emitted logs"
            return False
        EscrowMachine.accepted[fn] += 1
        events: list[tuple[str, dict[str, Any]]] = []
        for log in receipt["logs"]:
            if log["address"].lower() == self.usd.lower():
                continue  # the token's own Transfer (the solvency check reads its balances)
            assert log["address"].lower() == self.escrow.lower(), f"{fn}: log of another address"
            decoded = self.codec.decode_log(log)
            assert decoded is not None, f"{fn} emitted a log the ABI does not know: {log}"
            events.append(decoded)
        before = self.before = dict(self.jobs)
        resolved = next((a for name, a in events if name == "Resolved"), None)
        if resolved is not None:
            self._check_resolution(resolved, before, account)
        for name, a in events:
            if name in ("JobReleased", "ProviderSlashed"):
                prior = before[bytes(a["jobId"])]
                if fn == "resolve":
                    self._check_seat(name, a, prior, resolved)
                else:
                    self._check_consent(name, a, prior, account, fn, args)
            elif name == "ResultDisputed":
                job = before[bytes(a["jobId"])].job
                assert a["deposit"] == _deposit_of(job), (
                    f"{job.token} job of bounty {job.bounty} disputed with a deposit of "
                    f"{a['deposit']}, the model's is {_deposit_of(job)}"
                )
                if _spot(job):
                    opener = "mediator" if account.address == job.mediator else "submitter"
                    EscrowMachine.paid_by[f"spot job disputed by its {opener}"] += 1
            elif name == "Credited":
                self._check_credit(a, before[bytes(a["jobId"])], account, fn, args)
            elif name == "ReplicasCreated":
                k = int(a["replicas"])
                self.groups[bytes(a["groupId"])] = seat_ids(bytes(a["groupId"]), k)
            elif name == "JobAssigned":
                self._check_assigned(a, before[bytes(a["jobId"])], account)
            elif name == "JobUnassigned":
                self._check_take_back(before[bytes(a["jobId"])], account, "unassign")
            self._observe(name, a)
        for jid in {bytes(a["jobId"]) for _, a in events if "jobId" in a}:
            state = self.jobs[jid]
            if _spot(state.job):
                ended = state.status in (Status.RELEASED, Status.REFUNDED)
                assert self.check_paid[jid] == int(ended), (
                    f"spot job 0x{jid.hex()} ({state.status.name}): its check deposit was paid "
                    f"out {self.check_paid[jid]} times"
                )
        return True

    def _check_credit(
        self,
        a: dict[str, Any],
        prior: JobState,
        sender: LocalAccount,
        fn: str,
        args: tuple[Any, ...],
    ) -> None:
        """A deposit moves only as its reason says: to whom, how much, on which call."""
        job, why, who = prior.job, a["reason"], sender.address
        assert why in DEPOSIT_REASONS, f"Credited for an unknown reason {why!r}"
        assert a["amount"] == _deposit_of(job), (
            f"{why}: {a['amount']} credited, the job's deposit is {_deposit_of(job)}"
        )
        disputed = prior.status is Status.DISPUTED
        if why == "result upheld":
            ok = fn == "rule" and who == job.mediator and args[3] is True and disputed
            to = job.mediator
        elif why == "deposit returned":
            ok = fn == "rule" and args[3] is False and disputed and not _spot(job)
            to = job.submitter
        elif why == "deposit returned: no ruling":
            ok = fn == "finalize" and disputed
            to = job.submitter
        else:  # the check deposit of a spot job that ends without a check paying the re-run
            ok = (
                _spot(job)
                and not disputed
                and fn in ("release", "finalize", "rule", "cancel", "refund")
            )
            to = job.submitter
        assert ok and a["account"] == to, (
            f"job 0x{prior.job_id.hex()}: {why!r} to {a['account']} by {fn} from {who} "
            f"(status {prior.status.name}, flags {job.flags})"
        )
        if _spot(job):
            self.check_paid[prior.job_id] += 1
            EscrowMachine.paid_by[f"spot deposit: {why}"] += 1

    def _tally(self, seats: list[JobState]) -> tuple[bytes, int]:
        """The model's count: the result digest with the most distinct providers among the
        seats that voted (Submitted or Released). Each seat has its own wallet (checked at
        every JobAssigned), so this is also the count of seats."""
        voters: dict[bytes, set[str]] = defaultdict(set)
        for seat in seats:
            if seat.status in (Status.SUBMITTED, Status.RELEASED):
                voters[seat.job.result_digest].add(seat.job.provider)
        if not voters:
            return ZERO_HASH, 0
        best = max(voters.items(), key=lambda kv: len(kv[1]))
        return best[0], len(best[1])

    def _check_resolution(
        self, a: dict[str, Any], before: dict[bytes, JobState], sender: LocalAccount
    ) -> None:
        """A Resolved event says what the model's own count of the seats says."""
        group = bytes(a["groupId"])
        seats = [before[i] for i in self.groups[group]]
        k = len(seats)
        digest, agreeing = self._tally(seats)
        if 2 * agreeing > k:
            assert (bytes(a["resultDigest"]), a["agreeing"]) == (digest, agreeing), (
                f"group 0x{group.hex()} resolved to {a}, the model counts {agreeing} for "
                f"0x{digest.hex()}"
            )
            assert digest != cid_digest(BAD), "one cheating wallet outvoted honest providers"
            EscrowMachine.paid_by["resolve: majority"] += 1
        else:
            assert bytes(a["resultDigest"]) == ZERO_HASH and a["agreeing"] == 0, a
            deadline = seats[0].job.deadline
            if self.now < deadline + MEDIATION_WINDOW:  # only the submitter's cancel
                assert sender.address == seats[0].job.submitter, "no majority, resolved early"
                assert all(s.status is Status.FUNDED for s in seats), (
                    f"group 0x{group.hex()} cancelled with a seat held: "
                    f"{[s.status.name for s in seats]}"
                )
                EscrowMachine.paid_by["resolve: submitter cancelled the group"] += 1
            else:
                EscrowMachine.paid_by["resolve: no majority, refunded"] += 1

    def _check_assigned(self, a: dict[str, Any], prior: JobState, sender: LocalAccount) -> None:
        """An assignment: a reassignment only once the hold is over, and a seat only to a
        wallet that holds no other seat of its group (ever)."""
        if prior.status is Status.ASSIGNED:
            self._check_take_back(prior, sender, "reassign")
        hold = int(a["holdUntil"]) - int(a["since"])
        assert 0 <= hold < 2**32 and int(a["since"]) == self.now, a
        if not prior.job.replicas:
            return
        group, seat = assign_target(prior)
        seats = self.seat_holders.setdefault(group, {})
        held = seats.setdefault(a["provider"], seat)
        assert held == seat, (
            f"{a['provider']} given seat {seat} of group 0x{group.hex()}, it held seat {held}"
        )

    def _check_take_back(self, prior: JobState, sender: LocalAccount, how: str) -> None:
        """The operator takes a job from its provider only after the hold the provider signed
        for, and at least `reassignDelay` after the assignment; the provider hands back at any
        time."""
        job = prior.job
        if how == "unassign" and sender.address == job.provider:
            EscrowMachine.paid_by["unassign: provider handed back"] += 1
            return
        assert sender.address == job.operator, f"{how} by {sender.address}, not the operator"
        allowed = max(job.since + REASSIGN_DELAY, job.hold_until)
        assert self.now >= allowed, (
            f"job 0x{prior.job_id.hex()}: {how} at {self.now}, the hold ends at {allowed}"
        )
        if job.hold_until > job.since + REASSIGN_DELAY:
            EscrowMachine.paid_by[f"{how}: operator after a long hold"] += 1

    def _check_seat_ruling(self, prior: JobState) -> None:
        """The mediator rules a seat only without a majority, once no seat is still running
        (or the deadline passed), and before the deadline plus the mediation window."""
        group, _ = assign_target(prior)
        seats = [self.before[i] for i in self.groups[group]]
        _, agreeing = self._tally(seats)
        assert 2 * agreeing <= len(seats), f"a seat of group 0x{group.hex()} ruled on a majority"
        deadline = prior.job.deadline
        pending = any(s.status in (Status.FUNDED, Status.ASSIGNED) for s in seats)
        assert not pending or self.now > deadline, "a seat ruled while another is running"
        assert self.now < deadline + MEDIATION_WINDOW, "a seat ruled after the mediation window"
        EscrowMachine.paid_by["rule: a seat without a majority"] += 1

    def _check_seat(
        self, name: str, a: dict[str, Any], prior: JobState, resolved: dict[str, Any] | None
    ) -> None:
        """A seat paid or slashed by `resolve`: only against the majority's result."""
        assert resolved is not None and prior.job.replicas, f"{name} by resolve, not a seat"
        win = bytes(resolved["resultDigest"])
        assert win != ZERO_HASH, f"{name} by resolve without a majority"
        assert prior.status is Status.SUBMITTED, f"{name} of a seat in {prior.status.name}"
        if name == "JobReleased":
            assert prior.job.result_digest == win, "resolve paid a seat outside the majority"
            assert a["provider"] == prior.job.provider
        else:
            assert prior.job.result_digest != win, "resolve slashed a seat of the majority"
            assert a["amount"] == prior.job.collateral and a["toMediator"] == 0

    def _check_consent(
        self,
        name: str,
        a: dict[str, Any],
        prior: JobState,
        sender: LocalAccount,
        fn: str,
        args: tuple[Any, ...],
    ) -> None:
        """A payout or a slash only with the consent its terms give (the module docstring)."""
        job, who = prior.job, sender.address
        if fn == "rule" and job.replicas:
            self._check_seat_ruling(prior)
        if name == "ProviderSlashed":
            assert fn == "rule" and who == job.mediator and args[3] is False, (
                f"{a['provider']} slashed by {fn} from {who}, not by the job's mediator's ruling"
            )
            assert a["amount"] == job.collateral, "slashed more or less than the job's collateral"
            if prior.status is Status.DISPUTED:
                deposit = _deposit_of(job)
                bound = min(job.collateral, 2 * deposit)  # the re-run and its tie-break
                assert a["toMediator"] == bound, (
                    f"the mediator took {a['toMediator']} of a slashed collateral of "
                    f"{job.collateral}, its re-runs' bound is {bound}"
                )
            else:
                assert a["toMediator"] == 0, "the mediator was paid for its own check"
            what = "token" if job.token != ETH else "ETH"
            EscrowMachine.paid_by[f"slash: mediator ruled wrong ({what} job)"] += 1
            return
        if fn == "release" and who == job.submitter:
            kind = "release: submitter"
        elif fn in ("release", "settle") and who == job.operator and job.on_verify:
            kind = f"{fn}: operator, on-verify job"
        elif fn == "rule" and who == job.mediator and args[3] is True:
            kind = "rule: mediator upheld"
        elif fn == "finalize" and prior.status is Status.SUBMITTED:
            assert self.now >= job.since + CHALLENGE, "finalized within the challenge window"
            kind = "finalize: after the challenge window"
        elif fn == "finalize" and prior.status is Status.DISPUTED:
            assert self.now >= job.disputed_at + MEDIATION_WINDOW, "finalized an open dispute"
            kind = "finalize: mediator silent"
        else:
            raise AssertionError(
                f"job 0x{prior.job_id.hex()} paid by {fn} from {who} without consent "
                f"(status {prior.status.name}, flags {job.flags})"
            )
        assert a["provider"] == job.provider, "paid someone other than the job's provider"
        EscrowMachine.paid_by[kind] += 1
        if job.token != ETH:
            EscrowMachine.paid_by["(of which token jobs)"] += 1

    def _observe(self, name: str, a: dict[str, Any]) -> None:
        if name in JOB_EVENTS:
            jid = bytes(a["jobId"])
            self.jobs[jid] = apply_event(self.jobs.get(jid), name, a)
            self.touched.add(jid)
        # a job's money moves in the job's currency; the registry's events name theirs
        cur = self.jobs[bytes(a["jobId"])].job.token if "jobId" in a else a.get("token", ETH)
        if name == "JobReleased":
            self.credited[a["provider"], cur] += a["payout"]
            self.fees[cur] += a["fee"]
        elif name == "JobRefunded":
            self.credited[a["submitter"], cur] += a["amount"]
        elif name == "ProviderSlashed":
            mediator = self.jobs[bytes(a["jobId"])].job.mediator
            self.credited[a["submitter"], cur] += a["amount"] - a["toMediator"]
            self.credited[mediator, cur] += a["toMediator"]
            self.stakes[a["provider"], cur] -= a["amount"]
        elif name == "Credited":
            self.credited[a["account"], cur] += a["amount"]
        elif name == "Staked":
            self.stakes[a["provider"], cur] += a["amount"]
        elif name == "UnstakeRequested":
            self.stakes[a["provider"], cur] -= a["amount"]
            self.pending[a["provider"], cur] += a["amount"]
        elif name == "Unstaked":
            self.pending[a["provider"], cur] -= a["amount"]
            self.credited[a["provider"], cur] += a["amount"]
        elif name == "FeesCollected":
            self.fees[cur] -= a["amount"]
            self.credited[a["treasury"], cur] += a["amount"]
        elif name == "Withdrawn":
            self.withdrawn[a["account"], cur] += a["amount"]

    def _job(self, data: st.DataObject, *statuses: Status) -> JobState:
        candidates = [j for j in self.jobs.values() if not statuses or j.status in statuses]
        if not candidates or data.draw(st.integers(0, 9)) == 9:
            candidates = list(self.jobs.values())  # sometimes any job, in any state
        return data.draw(st.sampled_from(candidates))

    def _actor(self, data: st.DataObject, likely: LocalAccount | None = None) -> LocalAccount:
        if likely is not None and data.draw(st.integers(0, 3)) != 3:
            return likely
        return data.draw(st.sampled_from(self.everyone))

    def _by_address(self, address: str) -> LocalAccount | None:
        return next((a for a in self.everyone if a.address == address), None)

    def _has_jobs(self) -> bool:
        return bool(getattr(self, "jobs", None))

    def _wrong(self, data: st.DataObject, *ways: str) -> str | None:
        """One of ``ways`` to get a call wrong, one time in eight; None otherwise."""
        if data.draw(st.integers(0, 7)) != 7:
            return None
        return data.draw(st.sampled_from(ways))

    def _acceptance(
        self, data: st.DataObject, job: JobState, provider: LocalAccount, hold: int
    ) -> bytes:
        """Mostly the provider's acceptance of this very assignment for ``hold`` seconds;
        sometimes one by another key, for another attempt, for a shorter hold than the one
        sent, or one the operator saw before (a replay)."""
        kind = self._wrong(data, "replay", "signer", "attempt", "hold")
        if kind == "replay" and self.seen_acceptances:
            return data.draw(st.sampled_from(self.seen_acceptances))[1]
        signer = self._actor(data) if kind == "signer" else provider
        attempt = job.job.attempt + (2 if kind == "attempt" else 1)
        signed = max(0, hold - 1) if kind == "hold" and hold else hold
        sig = sign_acceptance(
            signer, self.chain_id, self.escrow, job.job_id, attempt, job.job, signed
        )
        self.seen_acceptances.append((provider.address, sig))
        del self.seen_acceptances[:-50]
        return sig

    def _assign(
        self, who: LocalAccount, job: JobState, provider: LocalAccount, hold: int, sig: bytes
    ) -> bool:
        """``assign`` of ``job`` (a seat: through its group id and index)."""
        target, seat = assign_target(job)
        tup = job.job.as_tuple()
        return self._send(who, "assign", target, seat, tup, provider.address, hold, sig)

    def _rule(self, who: LocalAccount, job: JobState, upheld: bool) -> bool:
        """``rule`` on ``job`` (a seat: with its whole group's structs)."""
        seats = [self.jobs[i] for i in self.groups.get(job.salt, [])] if job.job.replicas else []
        return self._send(who, "rule", *rule_args(job, seats), upheld)

    def _result_sig(self, data: st.DataObject, job: JobState, out: str) -> bytes:
        holder = self._by_address(job.job.provider)
        signer = self._actor(data, holder) if holder is not None else self.stranger
        attempt = job.job.attempt + (data.draw(st.integers(0, 5)) == 5)
        return sign_result(signer, self.chain_id, self.escrow, job.job_id, attempt, out)

    def _output(self, job: JobState) -> str:
        if job.job.provider == self.cheater.address:
            return BAD
        # an honest provider of a replicated job sometimes gets another output: ties
        return OTHER if job.job.replicas and job.job.attempt % 5 == 4 else GOOD

    # ------------------------------------------------------------------ rules
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One action, drawn by weight (ACTIONS). One hypothesis rule rather than one per
        action: hypothesis disables a random subset of a machine's rules per run (swarm
        testing), which left runs that could only collect fees or withdraw."""
        name = data.draw(st.sampled_from(ACTIONS))
        if name in NEEDS_JOBS and not self.jobs:
            name = "create"
        getattr(self, name)(data)

    def create(self, data: st.DataObject) -> None:
        bounty = data.draw(st.sampled_from(BOUNTIES))
        spec = data.draw(st.sampled_from(SPECS))
        duration = data.draw(st.sampled_from(DURATIONS))
        self.salts += 1
        salt = self.salts.to_bytes(32, "big")
        flags = data.draw(st.sampled_from(SINGLE_FLAGS))
        who = data.draw(st.sampled_from([*self.submitters, *self.submitters, self.stranger]))
        mediator = data.draw(st.sampled_from([self.mediator, self.mediator, who]))
        collateral = bounty * data.draw(st.sampled_from([1, 1, 1, 2]))
        value = 2 * bounty if flags == FLAG_SPOT else bounty
        wrong = self._wrong(
            data, "duration", "mediator", "collateral", "flags", "salt", "spot", "value", "operator"
        )
        if wrong == "duration":
            duration = 30  # under minDuration
        elif wrong == "mediator":
            mediator = data.draw(st.sampled_from([self.operator, self.stranger]))
        elif wrong == "collateral":
            collateral = bounty - 1
        elif wrong == "flags":
            flags = 2
        elif wrong == "salt":
            salt = data.draw(st.integers(1, self.salts)).to_bytes(32, "big")  # maybe a used id
        elif wrong == "spot":  # spot with on-verify, or a spot job funded without its deposit
            flags, value = data.draw(
                st.sampled_from([(FLAG_SPOT | 1, 2 * bounty), (FLAG_SPOT, bounty)])
            )
        elif wrong == "value" and flags == FLAG_SPOT:
            value += 1  # not twice a bounty
        expected = self.stranger if wrong == "operator" else self.operator  # not the one in office
        self._send(
            who,
            "createJob",
            salt,
            spec,
            self.now + duration,
            expected.address,
            mediator.address,
            collateral,
            flags,
            0,
            value=value,
        )

    def create_token(self, data: st.DataObject, replicas: int = 0) -> None:
        """Fund a job (or with ``replicas``, a replicated one) in tUSD with `createJobWith`,
        sometimes wrongly (terms, amount, an unlisted token, ETH as the token)."""
        k = replicas
        bounty = data.draw(st.sampled_from(T_BOUNTIES))
        duration = data.draw(st.sampled_from(DURATIONS))
        self.salts += 1
        salt = self.salts.to_bytes(32, "big")
        who = data.draw(st.sampled_from([*self.submitters, *self.submitters, self.stranger]))
        mediator = data.draw(st.sampled_from([self.mediator, self.mediator, who]))
        collateral = bounty * data.draw(st.sampled_from([1, 1, 1, 2]))
        flags = data.draw(st.sampled_from(SINGLE_FLAGS)) if not k else 0
        token, amount = self.usd, bounty * max(k, 1) * (2 if flags == FLAG_SPOT else 1)
        wrong = self._wrong(data, "amount", "collateral", "flags", "token", "duration", "funds")
        if wrong == "amount":
            # under the floor, or not divisible (by the seats, or by 2 for a spot job)
            amount = T_MIN - 1 if not k and flags != FLAG_SPOT else amount + 1
        elif wrong == "collateral":
            collateral = bounty - 1
        elif wrong == "flags":
            flags = data.draw(st.sampled_from([2, FLAG_SPOT | 1, FLAG_SPOT if k else 2]))
        elif wrong == "token":
            token = data.draw(st.sampled_from([ETH, self.stranger.address]))
        elif wrong == "duration":
            duration = 30
        elif wrong == "funds":
            amount = T_FUNDS * 2 // max(k, 1) * max(k, 1)  # more than the submitter holds
        self._send(
            who,
            "createJobWith",
            token,
            amount,
            salt,
            data.draw(st.sampled_from(SPECS)),
            self.now + duration,
            self.operator.address,
            mediator.address,
            collateral,
            flags,
            k,
        )

    def create_token_group(self, data: st.DataObject) -> None:
        self.create_token(data, data.draw(st.sampled_from([2, 3, 3])))

    def create_group(self, data: st.DataObject) -> None:
        """Fund a replicated job (k seats), sometimes wrongly (k, divisibility, flags)."""
        k = data.draw(st.sampled_from([2, 3, 3]))
        share = data.draw(st.sampled_from(BOUNTIES))
        duration = data.draw(st.sampled_from(DURATIONS))
        self.salts += 1
        salt = self.salts.to_bytes(32, "big")
        who = data.draw(st.sampled_from([*self.submitters, self.stranger]))
        mediator = data.draw(st.sampled_from([self.mediator, self.mediator, who]))
        value, flags = share * k, 0
        wrong = self._wrong(data, "replicas", "value", "flags", "collateral")
        if wrong == "replicas":
            k = data.draw(st.sampled_from([1, 6]))
        elif wrong == "value":
            value += 1
        elif wrong == "flags":
            flags = FLAG_ON_VERIFY
        collateral = share - 1 if wrong == "collateral" else share
        self._send(
            who,
            "createJob",
            salt,
            data.draw(st.sampled_from(SPECS)),
            self.now + duration,
            self.operator.address,
            mediator.address,
            collateral,
            flags,
            k,
            value=value,
        )

    def resolve_group(self, data: st.DataObject) -> None:
        """Anyone resolves a replicated job, with its seats' structs (sometimes out of order or
        one short); the contract decides whether it may."""
        if not self.groups:
            self.create_group(data)
            return
        group = data.draw(st.sampled_from(sorted(self.groups)))
        seats = [self.jobs[i].job.as_tuple() for i in self.groups[group]]
        wrong = self._wrong(data, "order", "short")
        if wrong == "order":
            seats.reverse()
        elif wrong == "short":
            seats = seats[:-1]
        self._send(self._actor(data), "resolve", group, seats)

    def assign(self, data: st.DataObject) -> None:
        job = self._job(data, Status.FUNDED, Status.ASSIGNED)
        provider = data.draw(st.sampled_from(self.providers))
        if self._wrong(data, "provider"):
            provider = data.draw(
                st.sampled_from([self.late, self.stranger, self.operator, self.mediator,
                                 self.submitters[0], self.treasury])
            )  # fmt: skip
        hold = data.draw(st.sampled_from(HOLDS))
        sig = self._acceptance(data, job, provider, hold)
        who = self.operator if not self._wrong(data, "sender") else self._actor(data)
        self._assign(who, job, provider, hold, sig)

    def unassign(self, data: st.DataObject) -> None:
        job = self._job(data, Status.ASSIGNED)
        likely = data.draw(st.sampled_from([self.operator, self._by_address(job.job.provider)]))
        self._send(self._actor(data, likely), "unassign", job.job_id, job.job.as_tuple())

    def submit(self, data: st.DataObject) -> None:
        job = self._job(data, Status.ASSIGNED)
        who = self._actor(data, self._by_address(job.job.provider))
        self._send(who, "submitResult", job.job_id, job.job.as_tuple(), self._output(job))

    def relay(self, data: st.DataObject) -> None:
        settle = data.draw(st.booleans())
        job = self._job(data, Status.ASSIGNED)
        out = self._output(job)
        sig = self._result_sig(data, job, out)
        fn = "settle" if settle else "submitResultFor"
        who = self._actor(data, self.operator)
        self._send(who, fn, job.job_id, job.job.as_tuple(), out, sig)

    def release(self, data: st.DataObject) -> None:
        job = self._job(data, Status.SUBMITTED)
        likely = data.draw(st.sampled_from([self._by_address(job.job.submitter), self.operator]))
        self._send(self._actor(data, likely), "release", job.job_id, job.job.as_tuple())

    def finalize(self, data: st.DataObject) -> None:
        job = self._job(data, Status.SUBMITTED, Status.DISPUTED)
        self._send(self._actor(data), "finalize", job.job_id, job.job.as_tuple())

    def dispute(self, data: st.DataObject) -> None:
        job = self._job(data, Status.SUBMITTED)
        likely = [self._by_address(job.job.submitter)]
        if _spot(job.job) or data.draw(st.integers(0, 3)) == 3:  # a check (or a mediator trying)
            likely.append(self._by_address(job.job.mediator))
        who = self._actor(data, data.draw(st.sampled_from(likely)))
        deposit = self._eth_deposit(job)  # a token job's deposit is pulled in the token
        if data.draw(st.integers(0, 7)) == 7:  # the wrong ETH: one wei short, or the floor
            # (the old flat deposit) for a bounty above it, or any ETH with a token or spot job
            deposit = FLOOR if deposit != FLOOR else deposit - 1
        self._send(who, "dispute", job.job_id, job.job.as_tuple(), value=deposit)

    @staticmethod
    def _eth_deposit(job: JobState) -> int:
        """The ETH to send with `dispute`: the deposit of an ETH job, nothing for a token job (it
        is pulled in the token) or a spot job (it was locked at funding)."""
        return _deposit_of(job.job) if job.job.token == ETH and not _spot(job.job) else 0

    def rule_on(self, data: st.DataObject) -> None:
        job = self._job(data, Status.DISPUTED, Status.SUBMITTED)
        who = self._actor(data, self._by_address(job.job.mediator))
        # the mediator re-runs: the cheater's output is wrong, the others' right (mostly)
        upheld = (
            job.output_cid != BAD if data.draw(st.integers(0, 5)) != 5 else data.draw(st.booleans())
        )
        self._rule(who, job, upheld)

    def give_back(self, data: st.DataObject) -> None:
        fn = data.draw(st.sampled_from(["cancel", "refund"]))
        job = self._job(data, Status.FUNDED, Status.ASSIGNED)
        who = self._actor(data, self._by_address(job.job.submitter))
        self._send(who, fn, job.job_id, job.job.as_tuple())

    def _group(self, data: st.DataObject) -> tuple[bytes, list[JobState]] | None:
        """A replicated job and its seats' states, in order; None when there is none yet."""
        if not self.groups:
            self.create_group(data)
            return None
        group = data.draw(st.sampled_from(sorted(self.groups)))
        return group, [self.jobs[i] for i in self.groups[group]]

    def mediator_seats(self, data: st.DataObject) -> None:
        """The mediator (sometimes another key) rules any seat at any time: with a majority, a
        seat still running, after the mediation window, or in the single job form."""
        drawn = self._group(data)
        if drawn is None:
            return
        group, seats = drawn
        i = data.draw(st.integers(0, len(seats) - 1))
        who = self._actor(data, self._by_address(seats[i].job.mediator))
        upheld = data.draw(st.booleans())
        if data.draw(st.integers(0, 4)) == 4:  # the single-job form on a seat
            self._send(who, "rule", seats[i].job_id, [seats[i].job.as_tuple()], 0, upheld)
        else:
            self._send(who, "rule", group, [s.job.as_tuple() for s in seats], i, upheld)

    def submitter_seats(self, data: st.DataObject) -> None:
        """The submitter takes its bounty back: cancels a seat alone (never), or cancels the
        group with `resolve` (only while every seat is Funded); sometimes another key tries."""
        drawn = self._group(data)
        if drawn is None:
            return
        group, seats = drawn
        who = self._actor(data, self._by_address(seats[0].job.submitter))
        if data.draw(st.booleans()):
            seat = data.draw(st.sampled_from(seats))
            self._send(who, "cancel", seat.job_id, seat.job.as_tuple())
        else:
            self._send(who, "resolve", group, [s.job.as_tuple() for s in seats])

    def double_seat(self, data: st.DataObject) -> None:
        """The operator gives one wallet a second seat of a group, with that wallet's own
        acceptance (a wallet that wants two votes): never."""
        drawn = self._group(data)
        if drawn is None:
            return
        group, seats = drawn
        taken = self.seat_holders.get(group, {})
        open_seats = [s for s in seats if s.status in (Status.FUNDED, Status.ASSIGNED)]
        if not taken or not open_seats:
            return
        wallet = data.draw(st.sampled_from(sorted(taken)))
        seat = data.draw(st.sampled_from(open_seats))
        provider = self._by_address(wallet)
        assert provider is not None
        hold = data.draw(st.sampled_from(HOLDS))
        sig = sign_acceptance(
            provider, self.chain_id, self.escrow, seat.job_id, seat.job.attempt + 1, seat.job, hold
        )
        self._assign(self.operator, seat, provider, hold, sig)

    def take_back(self, data: st.DataObject) -> None:
        """The operator takes an assigned job back (unassign, or reassign to another willing
        provider), most often one whose provider signed for a long run and is still in it."""
        held = [j for j in self.jobs.values() if j.status is Status.ASSIGNED]
        if not held:
            self.assign(data)
            return
        young = [j for j in held if self.now < j.job.hold_until]
        early = bool(young) and data.draw(st.integers(0, 3)) != 0
        job = data.draw(st.sampled_from(young if early else held))
        if data.draw(st.booleans()):
            self._send(self.operator, "unassign", job.job_id, job.job.as_tuple())
            return
        others = [p for p in self.providers if p.address != job.job.provider]
        provider = data.draw(st.sampled_from(others))
        sig = sign_acceptance(
            provider, self.chain_id, self.escrow, job.job_id, job.job.attempt + 1, job.job, 0
        )
        self._assign(self.operator, job, provider, 0, sig)

    def progress(self, data: st.DataObject) -> None:
        """The natural next step of an open job by the right key (so runs get deep: results,
        disputes, rulings, payouts); the other actions try everything else."""
        jobs = [j for j in self.jobs.values() if j.status in OPEN]
        if not jobs:
            self.create(data)
            return
        job = data.draw(st.sampled_from(jobs))
        jid, tup = job.job_id, job.job.as_tuple()
        if job.status in (Status.FUNDED, Status.ASSIGNED) and self.now >= job.job.deadline:
            self._send(self.stranger, "refund", jid, tup)
        elif job.status is Status.FUNDED:
            provider = data.draw(st.sampled_from(self.providers))
            if job.job.replicas:  # an honest operator gives each seat its own wallet
                group, seat = assign_target(job)
                taken = self.seat_holders.get(group, {})
                free = [p for p in self.providers if taken.get(p.address, seat) == seat]
                if free:
                    provider = data.draw(st.sampled_from(free))
            hold = data.draw(st.sampled_from(HOLDS))
            sig = sign_acceptance(
                provider, self.chain_id, self.escrow, jid, job.job.attempt + 1, job.job, hold
            )
            self.seen_acceptances.append((provider.address, sig))
            self._assign(self.operator, job, provider, hold, sig)
        elif job.status is Status.ASSIGNED:
            holder = self._by_address(job.job.provider)
            assert holder is not None
            out = self._output(job)
            sig = sign_result(holder, self.chain_id, self.escrow, jid, job.job.attempt, out)
            how = data.draw(st.sampled_from(["settle", "submitResultFor", "submitResult"]))
            if how == "settle" and job.job.on_verify:
                self._send(self.operator, "settle", jid, tup, out, sig)
            elif how == "submitResult":
                self._send(holder, "submitResult", jid, tup, out)
            else:
                self._send(self.stranger, "submitResultFor", jid, tup, out, sig)
        elif job.status is Status.SUBMITTED and job.job.replicas:
            group = job.salt
            seats = [self.jobs[i] for i in self.groups[group]]
            how = data.draw(st.sampled_from(["resolve", "resolve", "resolve", "rule", "release"]))
            if how == "rule":
                mediator = self._by_address(job.job.mediator)
                assert mediator is not None
                self._rule(mediator, job, job.output_cid == GOOD)
            elif how == "release":
                submitter = self._by_address(job.job.submitter)
                assert submitter is not None
                self._send(submitter, "release", jid, tup)
            else:
                waiting = any(s.status in (Status.FUNDED, Status.ASSIGNED) for s in seats)
                if waiting and data.draw(st.integers(0, 3)) == 3:
                    self._sleep_to(max(self.now, job.job.deadline + 1))
                self._send(self._actor(data), "resolve", group, [s.job.as_tuple() for s in seats])
        elif job.status is Status.SUBMITTED:
            ways = ["dispute", "release", "rule", "finalize"]
            how = data.draw(st.sampled_from(ways + ["dispute"] * (2 * _spot(job.job))))
            submitter = self._by_address(job.job.submitter)
            mediator = self._by_address(job.job.mediator)
            assert submitter is not None and mediator is not None
            if how == "dispute":
                # a spot job's check is opened by its mediator (sometimes its submitter)
                opener = mediator if _spot(job.job) and data.draw(st.integers(0, 3)) else submitter
                self._send(opener, "dispute", jid, tup, value=self._eth_deposit(job))
            elif how == "release":
                self._send(submitter, "release", jid, tup)
            elif how == "rule":
                self._rule(mediator, job, job.output_cid != BAD)
            else:
                if self.now < job.job.since + CHALLENGE:
                    self._sleep_to(job.job.since + CHALLENGE)
                self._send(self._actor(data), "finalize", jid, tup)
        else:  # DISPUTED
            mediator = self._by_address(job.job.mediator)
            assert mediator is not None
            if data.draw(st.booleans()):
                self._rule(mediator, job, job.output_cid != BAD)
            else:
                if self.now < job.job.disputed_at + MEDIATION_WINDOW:
                    self._sleep_to(job.job.disputed_at + MEDIATION_WINDOW)
                self._send(self._actor(data), "finalize", jid, tup)

    def malicious_operator(self, data: st.DataObject) -> None:
        fn = data.draw(st.sampled_from(JOB_FUNCTIONS))
        """The operator tries any job function on any job, with what it has at hand."""
        job = data.draw(st.sampled_from(list(self.jobs.values())))
        extra: tuple[Any, ...] = ()
        value = 0
        if fn == "assign":
            target = data.draw(st.sampled_from([self.operator, *self.providers, self.late]))
            hold = data.draw(st.sampled_from(HOLDS))
            if data.draw(st.booleans()) and self.seen_acceptances:
                seen: tuple[str, bytes] = data.draw(st.sampled_from(self.seen_acceptances))
                sig = seen[1]  # a provider's acceptance, replayed
            else:  # one the operator signs itself
                sig = sign_acceptance(
                    self.operator, self.chain_id, self.escrow, job.job_id, job.job.attempt + 1,
                    job.job, hold,
                )  # fmt: skip
            self._assign(self.operator, job, target, hold, sig)
            return
        elif fn in ("submitResultFor", "settle"):
            out = data.draw(st.sampled_from([GOOD, BAD]))
            signer = data.draw(st.sampled_from([self.operator, self.stranger]))
            extra = (out, sign_result(signer, self.chain_id, self.escrow, job.job_id,
                                      job.job.attempt, out))  # fmt: skip
        elif fn == "submitResult":
            extra = (BAD,)
        elif fn == "rule":
            self._rule(self.operator, job, data.draw(st.booleans()))
            return
        elif fn == "dispute":
            value = self._eth_deposit(job)
        self._send(self.operator, fn, job.job_id, job.job.as_tuple(), *extra, value=value)

    def withdraw(self, data: st.DataObject) -> None:
        to_other = data.draw(st.booleans())
        who = data.draw(st.sampled_from(self.everyone))
        if data.draw(st.booleans()):
            owed = [
                x for x in self.everyone
                if self.credited[x.address, self.usd] > self.withdrawn[x.address, self.usd]
            ]  # fmt: skip
            if owed and data.draw(st.integers(0, 3)) != 3:
                who = data.draw(st.sampled_from(owed))
            to = data.draw(st.sampled_from(self.everyone)).address if to_other else who.address
            token = self.usd if data.draw(st.integers(0, 7)) != 7 else ETH  # ETH: refused
            self._send(who, "withdrawToken", token, to)
        elif to_other:
            self._send(who, "withdrawTo", data.draw(st.sampled_from(self.everyone)).address)
        else:
            self._send(who, "withdraw")

    def registry(self, data: st.DataObject) -> None:
        amount = data.draw(st.sampled_from([1, 10**16, 5 * 10**16, 10**17, 10**18]))
        who = data.draw(st.sampled_from([*self.providers, self.late, self.stranger]))
        op = data.draw(
            st.sampled_from(["register", "stake", "request", "complete", "token", "token"])
        )
        if op == "token":
            op = data.draw(st.sampled_from(["stakeToken", "requestUnstakeToken"]))
            if op == "stakeToken" or data.draw(st.booleans()):
                self._send(who, op, self.usd, amount // 10**10)
            else:
                self._send(who, "completeUnstakeToken", self.usd)
            return
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

    def collect_fees(self, data: st.DataObject) -> None:
        who = data.draw(st.sampled_from(self.everyone))
        if data.draw(st.booleans()):
            self._send(who, "collectTokenFees", self.usd)
        else:
            self._send(who, "collectFees")

    def sleep(self, data: st.DataObject) -> None:
        self._sleep_to(self.now + data.draw(st.sampled_from(SLEEPS)))

    def _sleep_to(self, when: int) -> None:
        """One empty block at ``when`` (the next transaction is mined a second later)."""
        EscrowMachine.steps += 1
        self.clean = False
        self.now = when
        self.rpc.call("evm_mine", {"timestamp": self.now})

    def teardown(self) -> None:
        if not hasattr(self, "snapshot"):
            return
        try:
            if self.clean:  # not after a failure: that would hide the first error
                self._check_jobs(list(self.jobs))  # the whole job table, once per run
        finally:
            self.rpc.call("evm_revert", self.snapshot)

    # ------------------------------------------------------------------ invariants
    def _job_calls(self, jid: bytes) -> list[tuple[str, list[Any]]]:
        """``statusOf`` and ``isCurrent`` of one job (its folded struct), as batch entries."""
        status = self.codec.encode("statusOf", jid)
        current = self.codec.encode("isCurrent", jid, self.jobs[jid].job.as_tuple())
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
        32-byte words: ABI-coding the calls each step cost more than the node answering them.
        """
        if not hasattr(self, "escrow"):
            return
        touched = [jid for jid in self.touched if jid in self.jobs]
        self.touched = set()
        calls = self.views + [call for jid in touched for call in self._job_calls(jid)]
        out = self.rpc.batch(calls)
        n = len(self.addrs)
        eth_fees, token_fees = _words(out[1], 1)[0], _words(out[2 + 2 * n], 1)[0]
        eth_balances = [_words(raw, 1)[0] for raw in out[2 : 2 + n]]
        token_balances = [_words(raw, 1)[0] for raw in out[3 + 2 * n : 3 + 3 * n]]
        # Provider: stake, locked, unstakeAt, registered, unstakePending
        eth_infos = [_words(raw, 5) for raw in out[2 + n : 2 + 2 * n]]
        token_infos = [_words(raw, 5) for raw in out[3 + 3 * n : 3 + 4 * n]]
        (token_held,) = _words(out[3 + 4 * n], 1)
        self._check_currency(ETH, int(out[0], 16), eth_fees, eth_balances, eth_infos)
        self._check_currency(self.usd, token_held, token_fees, token_balances, token_infos)
        rest = out[4 + 4 * n :]
        for k, jid in enumerate(touched):
            self._check_job(jid, rest[2 * k], rest[2 * k + 1])
        self.clean = True

    def _check_currency(
        self, cur: str, held: int, fees: int, balances: list[int], infos: list[list[int]]
    ) -> None:
        """Solvency and the model's money in one currency (ETH: the zero address)."""
        what = "wei" if cur == ETH else "tUSD units"
        jobs = [j for j in self.jobs.values() if j.job.token == cur]
        escrowed = sum(j.job.bounty * (2 if _spot(j.job) else 1) for j in jobs if j.status in OPEN)
        disputed = [j for j in jobs if j.status is Status.DISPUTED and not _spot(j.job)]
        deposits = sum(_deposit_of(j.job) for j in disputed)
        staked = sum(i[0] for i in infos)
        pending = sum(i[4] for i in infos)
        assert held == escrowed + sum(balances) + staked + pending + fees + deposits, (
            f"escrow is not solvent: holds {held} {what}, owes {escrowed} in open bounties + "
            f"{sum(balances)} withdrawable + {staked} staked + {pending} unstaking + "
            f"{fees} fees + {deposits} dispute deposits (open spot jobs count twice their bounty)"
        )
        assert fees == self.fees[cur], f"fees in {cur}: {fees}, the events say {self.fees[cur]}"
        locked: dict[str, int] = defaultdict(int)
        for j in jobs:
            if j.status in HOLDING:
                locked[j.job.provider] += j.job.collateral
        for a, bal, info in zip(self.addrs, balances, infos, strict=True):
            key = (a, cur)
            assert self.withdrawn[key] <= self.credited[key], f"{key} withdrew more than credited"
            assert bal == self.credited[key] - self.withdrawn[key], (
                f"balance of {key} is {bal}, events say {self.credited[key] - self.withdrawn[key]}"
            )
            assert info[0] == self.stakes[key], (
                f"stake of {key} is {info[0]}, events: {self.stakes[key]}"
            )
            assert info[4] == self.pending[key], (
                f"unstaking of {key}: {info[4]}, events: {self.pending[key]}"
            )
            assert info[1] == locked[a], (
                f"{key} has {info[1]} locked, the jobs it holds need {locked[a]}"
            )
            assert info[1] <= info[0], f"{key} has more locked than staked"


def _words(raw: str, count: int) -> list[int]:
    """A static ABI return value of exactly ``count`` 32-byte words, as integers."""
    assert len(raw) == 2 + 64 * count, f"expected {count} words, got {raw!r}"
    return [int(raw[2 + 64 * i : 66 + 64 * i], 16) for i in range(count)]


def test_escrow_invariants_hold_under_random_use(project: Any) -> None:
    # Its own plain anvil: the one Ape manages runs with step tracing, ~7x slower per call.
    # No history: every read is at the head, and keeping past states made each 1,000 steps
    # slower than the last.
    contract_type = project.JobEscrow.contract_type
    abi = [a.model_dump(mode="json", by_alias=True) for a in contract_type.abi]
    token_type = project.TestUSD.contract_type
    token_abi = [a.model_dump(mode="json", by_alias=True) for a in token_type.abi]
    keys = dev_accounts(N_ACCOUNTS)
    with Anvil(accounts=N_ACCOUNTS, prune_history=True) as anvil:
        rpc = Rpc(anvil.url)
        # Each block one second after the last, whatever the wall clock says (sleeps jump).
        rpc.call("anvil_setBlockTimestampInterval", 1)
        EscrowMachine.rpc = rpc
        EscrowMachine.codec = Codec(abi, [Account.from_key(k).address for k in keys])
        EscrowMachine.bytecode = str(contract_type.deployment_bytecode.bytecode)
        EscrowMachine.token_codec = Codec(token_abi, [Account.from_key(k).address for k in keys])
        EscrowMachine.token_bytecode = str(token_type.deployment_bytecode.bytecode)
        EscrowMachine.keys = keys
        EscrowMachine.chain_id = int(rpc.call("eth_chainId"), 16)
        EscrowMachine.steps = EscrowMachine.refused = EscrowMachine.examples = 0
        EscrowMachine.accepted = Counter()
        EscrowMachine.reasons = Counter()
        EscrowMachine.paid_by = Counter()
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
        + "; paid or slashed by: "
        + ", ".join(f"{k} {n}" for k, n in sorted(EscrowMachine.paid_by.items()))
    )
    print("refused: " + ", ".join(f"{k} {n}" for k, n in EscrowMachine.reasons.most_common()))
    # the run reached the interesting paths, not only refusals
    for fn in (
        "assign", "settle", "release", "finalize", "dispute", "rule", "refund",
        "createJob", "resolve", "createJobWith", "stakeToken", "withdrawToken",
        "collectTokenFees", "unassign",
    ):  # fmt: skip
        assert EscrowMachine.accepted[fn] > 0 or TARGET_STEPS < 1000, f"no {fn} was accepted"
