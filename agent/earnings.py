"""What a provider's wallet earned, read from the chain alone (``gridmarket-agent earnings``),
and its withdrawal (``gridmarket-agent withdraw``). ETH only.

The jobs are those ever assigned to the wallet (``JobAssigned`` events naming it), each folded
from its own events (:meth:`gridmarket.chain.EscrowClient.job_state`):

* **earned**: ``JobReleased`` payouts to the wallet (bounty less the platform fee), per job and
  per UTC day of the release block;
* **pending**: results of the wallet's that are Submitted or Disputed, not yet final (what they
  will pay if nobody objects, or the mediator upholds them);
* **slashed**: collateral the wallet lost by mediators' rulings (``ProviderSlashed``);
* the registry entry (``providerOf``): stake, the part locked by the jobs it holds, free stake
  (``freeCollateralOf``), unstaking; and the withdrawable balance (``balanceOf``: payouts,
  completed unstakes), which ``withdraw`` sends out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from agent.onchain import address_topic, event_topic
from gridmarket.escrow import Status
from gridmarket.wire import checksum

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from gridmarket.chain import EscrowClient

__all__ = ["Earnings", "JobEarning", "Withdrawal", "earnings", "eth", "withdraw"]

WEI_PER_ETH = 10**18


def eth(wei: int) -> str:
    """Exact ETH, trailing zeros dropped: ``0.00975 ETH`` (no rounding: money adds up)."""
    text = format((Decimal(wei) / WEI_PER_ETH).normalize(), "f")
    return f"{text} ETH"


@dataclass(frozen=True)
class JobEarning:
    """One job the wallet was assigned. ``state``: ``released`` (paid to the wallet),
    ``pending`` (its result waits for the window), ``disputed`` (the mediator rules), ``running``
    (assigned, no result yet: its collateral is locked), ``lost`` (handed back, taken back,
    reassigned, refunded or ruled against)."""

    job_id: str
    state: str
    status: str
    bounty_wei: int
    fee_wei: int
    payout_wei: int
    """Paid (``released``), due if the result stands (``pending``/``disputed``), else 0."""
    collateral_wei: int
    slashed_wei: int
    attempt: int
    output_cid: str | None
    released_at: int | None
    day: str | None
    tx_hash: str | None
    """The release transaction."""


@dataclass(frozen=True)
class Earnings:
    wallet: str
    escrow: str
    chain_id: int
    block: int
    jobs: list[JobEarning]
    per_day: dict[str, int]
    jobs_per_day: dict[str, int]
    earned_wei: int
    pending_wei: int
    slashed_wei: int
    registered: bool
    stake_wei: int
    locked_wei: int
    free_wei: int
    unstake_pending_wei: int
    unstake_at: int
    withdrawable_wei: int
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON for machines: wei as decimal strings (exact in any JSON reader)."""

        def fix(value: Any, key: str = "") -> Any:
            if isinstance(value, dict):
                return {k: fix(v, k) for k, v in value.items()}
            if isinstance(value, list):
                return [fix(v) for v in value]
            if key.endswith("_wei") and isinstance(value, int):
                return str(value)
            return value

        body = fix(asdict(self))
        body["per_day_wei"] = {day: str(wei) for day, wei in self.per_day.items()}
        del body["per_day"]
        return dict(body)

    def lines(self) -> list[str]:
        """Plain text for people and pipes: one record per line, full hashes, no wrapping."""
        count = {s: sum(1 for j in self.jobs if j.state == s) for s in ("released", "pending")}
        disputed = sum(1 for j in self.jobs if j.state == "disputed")
        running = sum(1 for j in self.jobs if j.state == "running")
        out = [
            f"wallet        {self.wallet}",
            f"escrow        {self.escrow} (chain {self.chain_id}, block {self.block})",
            f"earned        {eth(self.earned_wei)} ({_n(count['released'], 'job')})",
            f"pending       {eth(self.pending_wei)} "
            f"({_n(count['pending'], 'result')} in the challenge window, {disputed} disputed)",
            f"slashed       {eth(self.slashed_wei)}",
            f"stake         {eth(self.stake_wei)}"
            + ("" if self.registered else " (not registered)"),
            f"locked        {eth(self.locked_wei)} (collateral of {_n(running, 'running job')}"
            f" and {_n(count['pending'] + disputed, 'unfinished result')})",
            f"free stake    {eth(self.free_wei)}",
        ]
        if self.unstake_pending_wei:
            when = datetime.fromtimestamp(self.unstake_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
            out.append(f"unstaking     {eth(self.unstake_pending_wei)} (ready {when})")
        out.append(f"withdrawable  {eth(self.withdrawable_wei)}")
        out.append("")
        out.append("per day (UTC)")
        if not self.per_day:
            out.append("  nothing released yet")
        for day, wei in sorted(self.per_day.items()):
            out.append(f"  {day}  {eth(wei)}  ({_n(self.jobs_per_day[day], 'job')})")
        out.append("")
        out.append("jobs")
        if not self.jobs:
            out.append("  none assigned to this wallet yet")
        for job in self.jobs:
            when = job.day or "-"
            extra = f"  slashed {eth(job.slashed_wei)}" if job.slashed_wei else ""
            out.append(f"  {job.job_id}  {job.state:<8}  {when:<10}  {eth(job.payout_wei)}{extra}")
        out.extend(f"note: {n}" for n in self.notes)
        return out


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def earnings(client: EscrowClient, wallet: str) -> Earnings:
    """The wallet's earnings, pending results, stake and balance, from the chain."""
    wallet = checksum(wallet)
    block = int(client.w3.eth.block_number)
    who = address_topic(wallet)
    start = client.deployment.block
    assigned = client.events(start, block, [event_topic(client, "JobAssigned"), None, who])
    released = client.events(start, block, [event_topic(client, "JobReleased"), None, who])
    slashed = client.events(start, block, [event_topic(client, "ProviderSlashed"), who])
    job_ids = list(dict.fromkeys(bytes(e.args["jobId"]) for e in assigned))
    paid = {bytes(e.args["jobId"]): e for e in released}
    lost: dict[bytes, int] = {}
    for event in slashed:
        jid = bytes(event.args["jobId"])
        lost[jid] = lost.get(jid, 0) + int(event.args["amount"])
    stamps: dict[int, int] = {}

    def stamp(number: int) -> int:
        if number not in stamps:
            stamps[number] = int(client.w3.eth.get_block(number)["timestamp"])
        return stamps[number]

    jobs: list[JobEarning] = []
    per_day: dict[str, int] = {}
    jobs_per_day: dict[str, int] = {}
    for jid in job_ids:
        state = client.job_state(jid)
        ours = checksum(state.job.provider) == wallet
        release = paid.get(jid)
        released_at = day = tx = None
        payout = 0
        if release is not None:
            kind = "released"
            payout = int(release.args["payout"])
            released_at = stamp(release.block)
            day = datetime.fromtimestamp(released_at, UTC).strftime("%Y-%m-%d")
            tx = release.tx_hash
            per_day[day] = per_day.get(day, 0) + payout
            jobs_per_day[day] = jobs_per_day.get(day, 0) + 1
        elif ours and state.status is Status.SUBMITTED:
            kind, payout = "pending", state.job.payout
        elif ours and state.status is Status.DISPUTED:
            kind, payout = "disputed", state.job.payout
        elif ours and state.status is Status.ASSIGNED:
            kind = "running"
        else:
            kind = "lost"
        jobs.append(
            JobEarning(
                job_id="0x" + jid.hex(),
                state=kind,
                status=state.status.name.lower(),
                bounty_wei=state.job.bounty,
                fee_wei=int(release.args["fee"]) if release is not None else state.job.fee,
                payout_wei=payout,
                collateral_wei=state.job.collateral,
                slashed_wei=lost.get(jid, 0),
                attempt=state.job.attempt,
                output_cid=state.output_cid,
                released_at=released_at,
                day=day,
                tx_hash=tx,
            )
        )
    stake, locked, unstake_at, registered, unstaking = client.call("providerOf", wallet)
    return Earnings(
        wallet=wallet,
        escrow=client.address,
        chain_id=client.deployment.chain_id,
        block=block,
        jobs=jobs,
        per_day=dict(sorted(per_day.items())),
        jobs_per_day=dict(sorted(jobs_per_day.items())),
        earned_wei=sum(j.payout_wei for j in jobs if j.state == "released"),
        pending_wei=sum(j.payout_wei for j in jobs if j.state in ("pending", "disputed")),
        slashed_wei=sum(lost.values()),
        registered=bool(registered),
        stake_wei=int(stake),
        locked_wei=int(locked),
        free_wei=int(client.call("freeCollateralOf", wallet)),
        unstake_pending_wei=int(unstaking),
        unstake_at=int(unstake_at),
        withdrawable_wei=int(client.call("balanceOf", wallet)),
    )


@dataclass(frozen=True)
class Withdrawal:
    """A withdrawal's effect: the escrow balance before and after, and the recipient's ETH."""

    tx_hash: str
    to: str
    amount_wei: int
    escrow_before_wei: int
    escrow_after_wei: int
    to_before_wei: int
    to_after_wei: int
    gas_wei: int
    """What the transaction cost the wallet (paid from its ETH, not the escrow balance)."""

    def lines(self) -> list[str]:
        held = f"{self.to} holds {eth(self.to_before_wei)} -> {eth(self.to_after_wei)}"
        if self.gas_wei:
            held += f" (after {eth(self.gas_wei)} of gas)"
        return [
            f"withdrew {eth(self.amount_wei)} to {self.to} (tx {self.tx_hash})",
            f"escrow balance  {eth(self.escrow_before_wei)} -> {eth(self.escrow_after_wei)}",
            held,
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            k: str(v) if k.endswith("_wei") else v
            for k, v in asdict(self).items()  # wei as strings
        }


class NothingToWithdrawError(ValueError):
    """The wallet's escrow balance is zero."""


def withdraw(client: EscrowClient, account: LocalAccount, to: str | None = None) -> Withdrawal:
    """Send the wallet's whole escrow balance to itself (``withdraw``) or ``to``
    (``withdrawTo``); :class:`NothingToWithdrawError` when there is nothing."""
    target = checksum(to) if to is not None else account.address
    before = int(client.call("balanceOf", account.address))
    if before == 0:
        raise NothingToWithdrawError(f"{account.address} has nothing to withdraw from the escrow")
    held = int(client.w3.eth.get_balance(target))  # type: ignore[arg-type]
    if to is None:
        sent = client.send(account, "withdraw")
    else:
        sent = client.send(account, "withdrawTo", target)
    receipt = client.w3.eth.get_transaction_receipt(sent.tx_hash)  # type: ignore[arg-type]
    gas = int(receipt["gasUsed"]) * int(receipt.get("effectiveGasPrice", 0))
    (event,) = [e for e in sent.events if e.name == "Withdrawn"]
    return Withdrawal(
        tx_hash=sent.tx_hash,
        to=target,
        amount_wei=int(event.args["amount"]),
        escrow_before_wei=before,
        escrow_after_wei=int(client.call("balanceOf", account.address)),
        to_before_wei=held,
        to_after_wei=int(client.w3.eth.get_balance(target)),  # type: ignore[arg-type]
        gas_wei=gas if target == account.address else 0,
    )
