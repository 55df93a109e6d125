"""What a provider's wallet earned, read from the chain alone (``gridmarket-agent earnings``),
and its withdrawal (``gridmarket-agent withdraw``), per currency: ETH and each ERC-20 token a
job was paid in or the deployment lists (escrow version 4). A job's amounts are in its own
token (``JobEarning.token``/``symbol``); the flat totals of :class:`Earnings` are ETH's, as
before, and :attr:`Earnings.tokens` holds the same totals for each listed token.

The jobs are those ever assigned to the wallet (``JobAssigned`` events naming it), each folded
from its own events (:meth:`gridmarket.chain.EscrowClient.job_state`):

* **earned**: ``JobReleased`` payouts to the wallet (bounty less the platform fee), per job and
  per UTC day of the release block;
* **pending**: results of the wallet's that are Submitted or Disputed, not yet final (what they
  will pay if nobody objects, or the mediator upholds them);
* **slashed**: collateral the wallet lost by mediators' rulings (``ProviderSlashed``);
* the registry entry (``providerOf``; ``stakeOf(wallet, token)`` for a token): stake, the part
  locked by the jobs it holds, free stake (``freeCollateralIn``), unstaking; and the
  withdrawable balance (``balanceOf``; ``balanceOfToken`` for a token: payouts, completed
  unstakes), which ``withdraw`` (``withdrawToken`` for a token) sends out.

``unstake`` (``gridmarket-agent unstake``) takes free stake out in two steps:
:func:`request_unstake` (``requestUnstake`` / ``requestUnstakeToken``: out of the stake at once,
pending for ``unstakeDelay``) and :func:`complete_unstake` (``completeUnstake`` /
``completeUnstakeToken``: the pending amount into the withdrawable balance). Both check what
the contract would refuse before sending anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from agent.onchain import address_topic, event_topic
from gridmarket.escrow import ZERO_ADDRESS, Status
from gridmarket.token import ETH, ETH_TOKEN, Token, TokenClient, tokens_of
from gridmarket.wire import checksum

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from gridmarket.chain import EscrowClient

__all__ = [
    "Earnings",
    "JobEarning",
    "TokenEarnings",
    "UnstakeCompletion",
    "UnstakeError",
    "UnstakeRequest",
    "Withdrawal",
    "complete_unstake",
    "earnings",
    "eth",
    "request_unstake",
    "token_named",
    "withdraw",
]

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
    token: str = ZERO_ADDRESS
    """What the job is paid in (the zero address: ETH); every ``_wei`` amount of the job is in
    this token's smallest units."""
    symbol: str = ETH


@dataclass(frozen=True)
class TokenEarnings:
    """The wallet's totals in one listed ERC-20 token, in its smallest units (the ``_wei``
    names are the wire's: ``gridmarket.wire.JobTerms`` says the same of a token job)."""

    symbol: str
    address: str
    decimals: int
    earned_wei: int
    pending_wei: int
    slashed_wei: int
    stake_wei: int
    locked_wei: int
    free_wei: int
    unstake_pending_wei: int
    unstake_at: int
    withdrawable_wei: int
    per_day: dict[str, int]
    jobs_per_day: dict[str, int]

    @property
    def token(self) -> Token:
        return Token(self.symbol, self.address, self.decimals)

    def active(self, jobs: list[JobEarning]) -> bool:
        """Anything to show: a job paid in it, a stake, a balance or an unstake."""
        amounts = (self.stake_wei, self.withdrawable_wei, self.unstake_pending_wei)
        return any(amounts) or any(j.token == self.address for j in jobs)


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
    tokens: list[TokenEarnings] = field(default_factory=list)
    """The same totals in each ERC-20 token the deployment lists or a job was paid in."""

    def to_json(self) -> dict[str, Any]:
        """JSON for machines: amounts as decimal strings of smallest units (exact in any JSON
        reader); ``tokens`` by symbol."""

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
        tokens = {}
        for entry in body.pop("tokens"):
            entry["per_day_wei"] = {day: str(units) for day, units in entry.pop("per_day").items()}
            tokens[entry["symbol"]] = entry
        body["tokens"] = tokens
        return dict(body)

    def lines(self) -> list[str]:
        """Plain text for people and pipes: one record per line, full hashes, no wrapping. ETH
        first (as before tokens existed), then a block per token with anything in it."""
        out = [
            f"wallet        {self.wallet}",
            f"escrow        {self.escrow} (chain {self.chain_id}, block {self.block})",
        ]
        eth_jobs = [j for j in self.jobs if j.token == ZERO_ADDRESS]
        eth_totals = TokenEarnings(
            ETH,
            ZERO_ADDRESS,
            18,
            self.earned_wei,
            self.pending_wei,
            self.slashed_wei,
            self.stake_wei,
            self.locked_wei,
            self.free_wei,
            self.unstake_pending_wei,
            self.unstake_at,
            self.withdrawable_wei,
            self.per_day,
            self.jobs_per_day,
        )
        out.extend(_totals_lines(eth_totals, eth_jobs, registered=self.registered))
        shown = [t for t in self.tokens if t.active(self.jobs)]
        for totals in shown:
            out.append("")
            out.append(f"{totals.symbol} ({totals.address})")
            out.extend(_totals_lines(totals, [j for j in self.jobs if j.token == totals.address]))
        out.append("")
        out.append("per day (UTC)")
        days = [
            (day, ETH_TOKEN, units, self.jobs_per_day[day]) for day, units in self.per_day.items()
        ]
        for totals in shown:
            days += [
                (day, totals.token, units, totals.jobs_per_day[day])
                for day, units in totals.per_day.items()
            ]
        if not days:
            out.append("  nothing released yet")
        for day, token, units, count in sorted(days, key=lambda d: (d[0], d[1].address)):
            out.append(f"  {day}  {token.fmt(units)}  ({_n(count, 'job')})")
        out.append("")
        out.append("jobs")
        if not self.jobs:
            out.append("  none assigned to this wallet yet")
        symbols = {t.address: t.token for t in self.tokens}
        for job in self.jobs:
            fmt = symbols.get(job.token, ETH_TOKEN).fmt
            when = job.day or "-"
            extra = f"  slashed {fmt(job.slashed_wei)}" if job.slashed_wei else ""
            out.append(f"  {job.job_id}  {job.state:<8}  {when:<10}  {fmt(job.payout_wei)}{extra}")
        out.extend(f"note: {n}" for n in self.notes)
        return out


def _totals_lines(
    totals: TokenEarnings, jobs: list[JobEarning], *, registered: bool = True
) -> list[str]:
    """The earned ... withdrawable lines of one currency (its jobs only)."""
    fmt = totals.token.fmt
    count = {s: sum(1 for j in jobs if j.state == s) for s in ("released", "pending")}
    disputed = sum(1 for j in jobs if j.state == "disputed")
    running = sum(1 for j in jobs if j.state == "running")
    out = [
        f"earned        {fmt(totals.earned_wei)} ({_n(count['released'], 'job')})",
        f"pending       {fmt(totals.pending_wei)} "
        f"({_n(count['pending'], 'result')} in the challenge window, {disputed} disputed)",
        f"slashed       {fmt(totals.slashed_wei)}",
        f"stake         {fmt(totals.stake_wei)}" + ("" if registered else " (not registered)"),
        f"locked        {fmt(totals.locked_wei)} (collateral of {_n(running, 'running job')}"
        f" and {_n(count['pending'] + disputed, 'unfinished result')})",
        f"free stake    {fmt(totals.free_wei)}",
    ]
    if totals.unstake_pending_wei:
        when = datetime.fromtimestamp(totals.unstake_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
        out.append(f"unstaking     {fmt(totals.unstake_pending_wei)} (ready {when})")
    out.append(f"withdrawable  {fmt(totals.withdrawable_wei)}")
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

    listed = {t.address: t for t in tokens_of(client.deployment.tokens).values()}
    jobs: list[JobEarning] = []
    for jid in job_ids:
        state = client.job_state(jid)
        token = checksum(state.job.token or ZERO_ADDRESS)
        if token not in listed:
            listed[token] = _token_info(client, token)
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
                token=token,
                symbol=listed[token].symbol,
            )
        )
    registered = bool(client.call("providerOf", wallet)[3])
    totals = {a: _totals(client, wallet, t, jobs) for a, t in listed.items()}
    eth_totals = totals.pop(ZERO_ADDRESS)
    return Earnings(
        wallet=wallet,
        escrow=client.address,
        chain_id=client.deployment.chain_id,
        block=block,
        jobs=jobs,
        per_day=eth_totals.per_day,
        jobs_per_day=eth_totals.jobs_per_day,
        earned_wei=eth_totals.earned_wei,
        pending_wei=eth_totals.pending_wei,
        slashed_wei=eth_totals.slashed_wei,
        registered=registered,
        stake_wei=eth_totals.stake_wei,
        locked_wei=eth_totals.locked_wei,
        free_wei=eth_totals.free_wei,
        unstake_pending_wei=eth_totals.unstake_pending_wei,
        unstake_at=eth_totals.unstake_at,
        withdrawable_wei=eth_totals.withdrawable_wei,
        tokens=list(totals.values()),
    )


def _totals(
    client: EscrowClient, wallet: str, token: Token, all_jobs: list[JobEarning]
) -> TokenEarnings:
    """The wallet's totals in ``token``: its jobs' payouts, its stake and balance in it."""
    jobs = [j for j in all_jobs if j.token == token.address]
    per_day: dict[str, int] = {}
    jobs_per_day: dict[str, int] = {}
    for job in jobs:
        if job.state == "released" and job.day is not None:
            per_day[job.day] = per_day.get(job.day, 0) + job.payout_wei
            jobs_per_day[job.day] = jobs_per_day.get(job.day, 0) + 1
    if token.is_eth:
        stake, locked, unstake_at, _, unstaking = client.call("providerOf", wallet)
    else:
        stake, locked, unstake_at, _, unstaking = client.call("stakeOf", wallet, token.address)
    return TokenEarnings(
        symbol=token.symbol,
        address=token.address,
        decimals=token.decimals,
        earned_wei=sum(j.payout_wei for j in jobs if j.state == "released"),
        pending_wei=sum(j.payout_wei for j in jobs if j.state in ("pending", "disputed")),
        slashed_wei=sum(j.slashed_wei for j in jobs),
        stake_wei=int(stake),
        locked_wei=int(locked),
        free_wei=(
            int(client.call("freeCollateralOf", wallet))
            if token.is_eth
            else client.free_collateral_of(wallet, token.address)
        ),
        unstake_pending_wei=int(unstaking),
        unstake_at=int(unstake_at),
        withdrawable_wei=client.balance_of(wallet, token.address),
        per_day=dict(sorted(per_day.items())),
        jobs_per_day=dict(sorted(jobs_per_day.items())),
    )


def _token_info(client: EscrowClient, address: str) -> Token:
    """A token the deployment file does not list (delisted, or listed after it was written):
    its symbol and decimals read from the token, else shown by address with 18 decimals."""
    if int(address, 16) == 0:
        return ETH_TOKEN
    try:
        functions = TokenClient(client.w3, address).contract.functions
        symbol = str(functions.symbol().call())
        decimals = int(functions.decimals().call())
    except Exception:  # not an ERC-20 with metadata: show the address
        return Token(address, address, 18)
    if not symbol.isprintable() or not 0 < len(symbol) <= 16 or not 0 <= decimals <= 36:
        return Token(address, address, decimals if 0 <= decimals <= 36 else 18)
    return Token(symbol, address, decimals)


def token_named(client: EscrowClient, name: str) -> Token:
    """The currency ``name`` names: ``ETH``, a symbol the deployment lists (any case) or a
    token address (listed or not: a balance may outlive a listing). ValueError otherwise."""
    listed = tokens_of(client.deployment.tokens)
    if name in listed:
        return listed[name]
    same = [t for symbol, t in listed.items() if symbol.lower() == name.lower()]
    if len(same) == 1:
        return same[0]
    if name.startswith("0x"):
        try:
            address = checksum(name)
        except ValueError as exc:
            raise ValueError(f"{name!r}: {exc}") from None
        known = {t.address: t for t in listed.values()}
        return known.get(address) or _token_info(client, address)
    names = ", ".join(listed)
    raise ValueError(f"{name!r} is not a token the deployment lists ({names}) nor an address")


@dataclass(frozen=True)
class Withdrawal:
    """A withdrawal's effect: the escrow balance before and after, and the recipient's holding
    of the currency withdrawn (ETH, or the token: its smallest units)."""

    tx_hash: str
    to: str
    amount_wei: int
    escrow_before_wei: int
    escrow_after_wei: int
    to_before_wei: int
    to_after_wei: int
    gas_wei: int
    """What the transaction cost the wallet, when it is the recipient of ETH (paid from its
    ETH, not the escrow balance); 0 otherwise (the gas does not touch what is shown)."""
    token: str = ZERO_ADDRESS
    symbol: str = ETH
    decimals: int = 18

    def lines(self) -> list[str]:
        fmt = Token(self.symbol, self.token, self.decimals).fmt
        held = f"{self.to} holds {fmt(self.to_before_wei)} -> {fmt(self.to_after_wei)}"
        if self.gas_wei:
            held += f" (after {eth(self.gas_wei)} of gas)"
        return [
            f"withdrew {fmt(self.amount_wei)} to {self.to} (tx {self.tx_hash})",
            f"escrow balance  {fmt(self.escrow_before_wei)} -> {fmt(self.escrow_after_wei)}",
            held,
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            k: str(v) if k.endswith("_wei") else v
            for k, v in asdict(self).items()  # amounts as strings
        }


class NothingToWithdrawError(ValueError):
    """The wallet's escrow balance is zero."""


def withdraw(
    client: EscrowClient,
    account: LocalAccount,
    to: str | None = None,
    token: Token = ETH_TOKEN,
) -> Withdrawal:
    """Send the wallet's whole escrow balance in ``token`` to itself or ``to``: ETH with
    ``withdraw`` / ``withdrawTo``, a token with ``withdrawToken(token, to)``.
    :class:`NothingToWithdrawError` when there is nothing."""
    target = checksum(to) if to is not None else account.address
    before = client.balance_of(account.address, token.address)
    if before == 0:
        raise NothingToWithdrawError(
            f"{account.address} has nothing to withdraw from the escrow"
            + ("" if token.is_eth else f" in {token.symbol}")
        )
    if token.is_eth:
        held = int(client.w3.eth.get_balance(target))  # type: ignore[arg-type]
        if to is None:
            sent = client.send(account, "withdraw")
        else:
            sent = client.send(account, "withdrawTo", target)
    else:
        erc20 = TokenClient(client.w3, token.address)
        held = erc20.balance_of(target)
        sent = client.send(account, "withdrawToken", token.address, target)
    receipt = client.w3.eth.get_transaction_receipt(sent.tx_hash)  # type: ignore[arg-type]
    gas = int(receipt["gasUsed"]) * int(receipt.get("effectiveGasPrice", 0))
    (event,) = [e for e in sent.events if e.name == "Withdrawn"]
    after = (
        int(client.w3.eth.get_balance(target))  # type: ignore[arg-type]
        if token.is_eth
        else erc20.balance_of(target)
    )
    return Withdrawal(
        tx_hash=sent.tx_hash,
        to=target,
        amount_wei=int(event.args["amount"]),
        escrow_before_wei=before,
        escrow_after_wei=client.balance_of(account.address, token.address),
        to_before_wei=held,
        to_after_wei=after,
        gas_wei=gas if token.is_eth and target == account.address else 0,
        token=token.address,
        symbol=token.symbol,
        decimals=token.decimals,
    )


# --------------------------------------------------------------------------- unstake


class UnstakeError(ValueError):
    """What the contract would refuse (or a malformed amount), found before sending anything."""


def _utc(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _in(seconds: int) -> str:
    """``in 7 days``, ``in 6 days 23 hours``, ``in 5 hours 3 minutes``, ``in 40 seconds``."""
    seconds = max(seconds, 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        parts = [_n(days, "day")] + ([_n(hours, "hour")] if hours else [])
    elif hours:
        parts = [_n(hours, "hour")] + ([_n(minutes, "minute")] if minutes else [])
    elif minutes:
        parts = [_n(minutes, "minute")]
    else:
        parts = [_n(secs, "second")]
    return "in " + " ".join(parts)


def _as_json(value: Any) -> dict[str, Any]:
    return {k: str(v) if k.endswith("_wei") else v for k, v in asdict(value).items()}


@dataclass(frozen=True)
class _Entry:
    """The wallet's registry entry in one currency (``providerOf`` / ``stakeOf``)."""

    stake: int
    locked: int
    unstake_at: int
    pending: int

    @property
    def free(self) -> int:
        return self.stake - self.locked


def _entry(client: EscrowClient, wallet: str, token: Token) -> _Entry:
    if token.is_eth:
        stake, locked, unstake_at, _, pending = client.call("providerOf", wallet)
    else:
        stake, locked, unstake_at, _, pending = client.call("stakeOf", wallet, token.address)
    return _Entry(int(stake), int(locked), int(unstake_at), int(pending))


def _command(token: Token, *words: str) -> str:
    tail = "" if token.is_eth else f" --token {token.symbol}"
    return "gridmarket-agent " + " ".join(words) + tail


@dataclass(frozen=True)
class UnstakeRequest:
    """A sent ``requestUnstake`` (``requestUnstakeToken``): the stake before and after, the
    whole pending unstake (an earlier one included: a new request restarts its delay) and
    when ``completeUnstake`` can move it (``available_at``, unix seconds; ``now``: the
    request's block)."""

    tx_hash: str
    wallet: str
    amount_wei: int
    stake_before_wei: int
    stake_after_wei: int
    locked_wei: int
    pending_wei: int
    available_at: int
    now: int
    min_stake_wei: int
    """The escrow's ``minStake`` (ETH): below it the node gets no work."""
    token: str = ZERO_ADDRESS
    symbol: str = ETH
    decimals: int = 18

    @property
    def below_min_stake(self) -> bool:
        return self.token == ZERO_ADDRESS and self.stake_after_wei < self.min_stake_wei

    def warnings(self) -> list[str]:
        if not self.below_min_stake:
            return []
        return [
            f"warning: the ETH stake left, {eth(self.stake_after_wei)}, is below the escrow's "
            f"minStake of {eth(self.min_stake_wei)}: this node is no longer eligible for work"
        ]

    def lines(self) -> list[str]:
        currency = Token(self.symbol, self.token, self.decimals)
        fmt = currency.fmt
        earlier = self.pending_wei - self.amount_wei
        pending = f"unstaking     {fmt(self.pending_wei)}"
        if earlier:
            pending += f" (with {fmt(earlier)} requested earlier: its delay restarted)"
        free = self.stake_after_wei - self.locked_wei
        return [
            f"requested unstake of {fmt(self.amount_wei)} (tx {self.tx_hash})",
            f"stake         {fmt(self.stake_before_wei)} -> {fmt(self.stake_after_wei)} "
            f"({fmt(self.locked_wei)} locked, {fmt(free)} free)",
            pending,
            f"ready         {_utc(self.available_at)} ({_in(self.available_at - self.now)})",
            f"then run `{_command(currency, 'unstake', '--complete')}` and "
            f"`{_command(currency, 'withdraw')}`",
        ]

    def to_json(self) -> dict[str, Any]:
        body = _as_json(self)
        body["below_min_stake"] = self.below_min_stake
        body["available_at_utc"] = _utc(self.available_at)
        return body


def _unstake_amount(amount: str, token: Token, entry: _Entry) -> int:
    """``amount`` (in ``token``'s units, or ``all``) checked against the free stake."""
    numbers = (
        f"stake {token.fmt(entry.stake)}, {token.fmt(entry.locked)} locked by jobs, "
        f"{token.fmt(entry.free)} free"
    )
    if amount.strip().lower() == "all":
        if entry.free <= 0:
            raise UnstakeError(f"no free stake in {token.symbol} to unstake ({numbers})")
        return entry.free
    try:
        units = token.to_units(amount.strip())
    except ValueError as exc:
        raise UnstakeError(f"AMOUNT {exc} (a positive number, or 'all')") from None
    if units == 0:
        raise UnstakeError(f"AMOUNT {amount!r} must be more than 0 {token.symbol}")
    if units > entry.free:
        wanted = token.fmt(units)
        raise UnstakeError(f"cannot unstake {wanted}: more than the free stake ({numbers})")
    return units


def request_unstake(
    client: EscrowClient, account: LocalAccount, amount: str, token: Token = ETH_TOKEN
) -> UnstakeRequest:
    """Take ``amount`` (``token``'s units, ``"all"``: the whole free stake) out of the
    wallet's stake: ``requestUnstake(amount)`` or ``requestUnstakeToken(token, amount)``.
    :class:`UnstakeError`, with nothing sent, when the wallet is not registered or the amount
    is malformed, not positive or more than the free stake (stake less locked)."""
    wallet = account.address
    if not bool(client.call("providerOf", wallet)[3]):
        raise UnstakeError(f"{wallet} is not a registered provider: it has no stake to unstake")
    before = _entry(client, wallet, token)
    units = _unstake_amount(amount, token, before)
    if token.is_eth:
        sent = client.send(account, "requestUnstake", units)
    else:
        sent = client.send(account, "requestUnstakeToken", token.address, units)
    (event,) = [e for e in sent.events if e.name == "UnstakeRequested"]
    receipt = client.w3.eth.get_transaction_receipt(sent.tx_hash)  # type: ignore[arg-type]
    now = int(client.w3.eth.get_block(receipt["blockNumber"])["timestamp"])
    after = _entry(client, wallet, token)
    return UnstakeRequest(
        tx_hash=sent.tx_hash,
        wallet=wallet,
        amount_wei=int(event.args["amount"]),
        stake_before_wei=before.stake,
        stake_after_wei=after.stake,
        locked_wei=after.locked,
        pending_wei=after.pending,
        available_at=int(event.args["availableAt"]),
        now=now,
        min_stake_wei=int(client.call("minStake")),
        token=token.address,
        symbol=token.symbol,
        decimals=token.decimals,
    )


@dataclass(frozen=True)
class UnstakeCompletion:
    """A sent ``completeUnstake`` (``completeUnstakeToken``): the amount moved from the
    pending unstake to the withdrawable balance, that balance before and after."""

    tx_hash: str
    wallet: str
    amount_wei: int
    stake_wei: int
    withdrawable_before_wei: int
    withdrawable_after_wei: int
    token: str = ZERO_ADDRESS
    symbol: str = ETH
    decimals: int = 18

    def lines(self) -> list[str]:
        currency = Token(self.symbol, self.token, self.decimals)
        fmt = currency.fmt
        return [
            f"moved {fmt(self.amount_wei)} of unstaked stake to the withdrawable balance "
            f"(tx {self.tx_hash})",
            f"withdrawable  {fmt(self.withdrawable_before_wei)} -> "
            f"{fmt(self.withdrawable_after_wei)}",
            f"stake         {fmt(self.stake_wei)}",
            f"send it out with `{_command(currency, 'withdraw')}`",
        ]

    def to_json(self) -> dict[str, Any]:
        return _as_json(self)


def complete_unstake(
    client: EscrowClient, account: LocalAccount, token: Token = ETH_TOKEN
) -> UnstakeCompletion:
    """Move the wallet's pending unstake in ``token`` to its withdrawable balance
    (``completeUnstake`` / ``completeUnstakeToken``). :class:`UnstakeError`, with nothing
    sent, when nothing is pending or its delay has not passed (the error says when)."""
    wallet = account.address
    entry = _entry(client, wallet, token)
    if entry.pending == 0:
        raise UnstakeError(
            f"{wallet} has no unstake pending in {token.symbol}: request one first "
            f"(`{_command(token, 'unstake', 'AMOUNT')}`)"
        )
    now = int(client.w3.eth.get_block("latest")["timestamp"])
    if now < entry.unstake_at:
        raise UnstakeError(
            f"the unstake of {token.fmt(entry.pending)} is not ready: it can be completed at "
            f"{_utc(entry.unstake_at)} ({_in(entry.unstake_at - now)}); nothing sent"
        )
    before = client.balance_of(wallet, token.address)
    if token.is_eth:
        sent = client.send(account, "completeUnstake")
    else:
        sent = client.send(account, "completeUnstakeToken", token.address)
    (event,) = [e for e in sent.events if e.name == "Unstaked"]
    return UnstakeCompletion(
        tx_hash=sent.tx_hash,
        wallet=wallet,
        amount_wei=int(event.args["amount"]),
        stake_wei=int(event.args["totalStake"]),
        withdrawable_before_wei=before,
        withdrawable_after_wei=client.balance_of(wallet, token.address),
        token=token.address,
        symbol=token.symbol,
        decimals=token.decimals,
    )
