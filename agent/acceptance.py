"""Whether this node takes a job on the terms the scheduler offers, and its signed acceptance.

Escrow version 2 assigns a job only with the provider's EIP-712 ``Acceptance`` of its terms
(:func:`gridmarket.eip712.sign_acceptance`): the price, the deadline, the collateral locked from
the node's stake while it holds the job, the mediator who may rule its result wrong (and so take
that collateral), the payment flags, and (version 5) ``holdFor``, the seconds nobody but the
node can take the job back (``holdUntil``). :class:`AcceptancePolicy` checks an offered
:class:`~gridmarket.wire.Assignment` against the node's settings before it signs anything:

* the offer must be self-consistent (its terms' bounty and deadline are the offer's), for the
  escrow and chain the scheduler registered the node with, and not past its deadline;
* the hold (``terms.hold_for``) must cover the run: the spec's ``limits.timeout_s`` and
  :data:`gridmarket.holds.HOLD_MARGIN_S` to post the result, or reach the deadline
  (:func:`gridmarket.holds.hold_problem`). A shorter hold would let the operator take the job
  back, and give it to another node, while this one is still running it;
* the price: what the job pays per GPU-hour (per job-hour without GPUs,
  :func:`gridmarket.wire.offered_price_wei_per_hour`: its bounty over its timeout) in the job's
  own token (``terms.token``; the zero address is ETH) must meet the node's floor in that token:
  ``price_floor_wei_per_hour`` for ETH, ``price_floors`` (token address -> smallest units per
  hour) for a listed ERC-20. A token the node has no floor for is never taken;
* the collateral must not exceed ``max_collateral_wei`` (no cap by default; ETH jobs only: it
  is in wei) nor, when the node can read the chain, its free stake in the job's token
  (``freeCollateralIn(wallet, token)``: ``assign`` would revert anyway);
* the mediator (who can slash the collateral):

  - never the node itself nor the job's operator (the contract refuses those too);
  - the job's own submitter ("self-mediated": the contract allows it, and the submitter could
    then rule an honest result wrong and keep the collateral) only with ``accept_self_mediated``
    (default off), or when that submitter is a mediator the node accepts anyway (by the rules
    below): that is a mediator's re-run of a disputed job (docs/mediator.md), and a mediator
    the node trusts to rule on other people's jobs gains nothing over the provider by also
    funding one. The submitter is read from the chain (the job's ``JobCreated``) when the node
    has an RPC URL;
  - ``accepted_mediators``, when set, is the whole allow-list of mediators the node accepts;
  - otherwise (the default) the deployment's *listed* mediators: the one listed in the
    deployment file the node knows (``params.mediator``), or one the escrow's
    ``isListedMediator`` view confirms (with an RPC URL). A node with neither an RPC URL nor a
    matching deployment mediator cannot tell a listed mediator from a self-mediating submitter:
    it accepts, logging that it could not check (set ``rpc_url``, or list the mediators you
    trust, to close that gap).

  Each refusal names the rule it applies and the setting that changes it. (The contract also
  lets a mediator's own sybil wallet be a job's provider: that is the submitter's risk, not the
  provider's, and nothing a provider's policy can see; docs/agent.md.)

The job's ``flags`` are signed as offered and never refused by themselves: an on-verify job,
and a spot-checked job (``FLAG_SPOT``: its mediator may re-run any attempt, drawn from a seed
sealed to it, and the collateral it asks is higher, ``gridmarket.spot.min_collateral``), are
taken on the same rules; the collateral limits above are what bound a spot job.

A chain that does not answer while a check needs it declines the offer (the scheduler offers
the job again, or to another node): a node that configured an RPC URL asked for the checks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gridmarket.eip712 import sign_acceptance
from gridmarket.escrow import ZERO_ADDRESS, Job, JobState
from gridmarket.holds import HOLD_MARGIN_S, hold_problem
from gridmarket.wire import (
    AcceptRequest,
    Assignment,
    JobTerms,
    checksum,
    offered_price_wei_per_hour,
)

if TYPE_CHECKING:
    from gridmarket.ethsig import Signer
    from gridmarket.token import Token

__all__ = [
    "AcceptancePolicy",
    "ChainFacts",
    "Decision",
    "EscrowFacts",
    "EscrowViews",
    "acceptance_request",
    "terms_job",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """Take the offer or not, and why (logged; a declined offer is handed back)."""

    accept: bool
    reason: str


class ChainFacts(Protocol):
    """What the policy reads from the chain (:class:`EscrowFacts` on a real escrow)."""

    def submitter_of(self, job_id: bytes) -> str: ...

    def is_listed_mediator(self, mediator: str) -> bool: ...

    def free_collateral_of(self, provider: str, token: str = ZERO_ADDRESS) -> int: ...


class EscrowViews(Protocol):
    """The three reads :class:`EscrowFacts` needs, which both escrow clients have:
    :class:`gridmarket.chain.EscrowClient` (web3) and
    :class:`gridmarket.lightchain.LightEscrowClient` (the agent's, without web3)."""

    def job_state(self, job_id: bytes) -> JobState: ...

    def call(self, fn_name: str, *args: Any) -> Any: ...

    def free_collateral_of(self, provider: str, token: str = ZERO_ADDRESS) -> int: ...


class EscrowFacts:
    """:class:`ChainFacts` from a deployed escrow (views and the job's events), over either
    escrow client (:class:`EscrowViews`)."""

    def __init__(self, client: EscrowViews) -> None:
        self.client = client

    def submitter_of(self, job_id: bytes) -> str:
        return checksum(self.client.job_state(job_id).job.submitter)

    def is_listed_mediator(self, mediator: str) -> bool:
        return bool(self.client.call("isListedMediator", checksum(mediator)))

    def free_collateral_of(self, provider: str, token: str = ZERO_ADDRESS) -> int:
        return self.client.free_collateral_of(checksum(provider), checksum(token))


def terms_job(terms: JobTerms) -> Job:
    """The job struct the acceptance covers (only its terms are signed; the submitter is not)."""
    return terms.as_job()


def acceptance_request(account: Signer, assignment: Assignment) -> AcceptRequest:
    """The node's signed acceptance of ``assignment`` (its attempt, its terms, the hold it
    is given: ``terms.hold_for``)."""
    signature = sign_acceptance(
        account,
        assignment.chain_id,
        checksum(assignment.escrow),
        bytes.fromhex(assignment.job_id.removeprefix("0x")),
        assignment.attempt,
        terms_job(assignment.terms),
        assignment.terms.hold_for,
    )
    return AcceptRequest(attempt=assignment.attempt, signature="0x" + signature.hex())


class AcceptancePolicy:
    """The node's rules for taking a job (module docstring); :meth:`decide` one offer.

    ``expected`` returns the ``(chain_id, escrow)`` the node registered with (the scheduler's
    ``/v1/info``), or None when unknown; ``chain`` reads the chain when the node has an RPC URL.
    ``token_floors`` maps each token the node takes to its floor (smallest units per hour);
    ``token_of`` names a token address for the reasons (symbol and units).
    """

    def __init__(
        self,
        wallet: str,
        *,
        accepted_mediators: Sequence[str] = (),
        accept_self_mediated: bool = False,
        max_collateral_wei: int | None = None,
        price_floor_wei_per_hour: int = 0,
        token_floors: Mapping[str, int] | None = None,
        token_of: Callable[[str], Token] | None = None,
        deployment_mediator: str | None = None,
        chain: ChainFacts | None = None,
        expected: Callable[[], tuple[int, str] | None] | None = None,
        clock: Callable[[], float] = time.time,
        hold_margin_s: int = HOLD_MARGIN_S,
    ) -> None:
        self.wallet = checksum(wallet)
        self.price_floor_wei_per_hour = price_floor_wei_per_hour
        self.token_floors = {checksum(k): v for k, v in (token_floors or {}).items()}
        self.token_of = token_of
        self.accepted_mediators = frozenset(checksum(m) for m in accepted_mediators)
        self.accept_self_mediated = accept_self_mediated
        self.max_collateral_wei = max_collateral_wei
        zero = deployment_mediator is None or int(deployment_mediator, 16) == 0
        self.deployment_mediator = None if zero else checksum(str(deployment_mediator))
        self.chain = chain
        self.expected = expected
        self.clock = clock
        self.hold_margin_s = hold_margin_s

    def decide(self, assignment: Assignment) -> Decision:
        """Whether to accept ``assignment``; never raises (a failed check declines)."""
        try:
            return self._decide(assignment)
        except Exception as exc:  # the chain unreachable, an RPC error: decline, say why
            text = str(exc).strip().splitlines()
            return Decision(False, f"cannot check the terms: {text[0] if text else exc!r}")

    def _decide(self, offer: Assignment) -> Decision:
        terms = offer.terms
        if terms.bounty_wei != offer.bounty_wei or terms.deadline != offer.deadline:
            return Decision(False, "the offer's terms disagree with its bounty or deadline")
        expected = self.expected() if self.expected is not None else None
        if expected is not None:
            chain_id, escrow = expected
            if offer.chain_id != chain_id or checksum(offer.escrow) != checksum(escrow):
                return Decision(
                    False,
                    f"offer for escrow {offer.escrow} on chain {offer.chain_id}, "
                    f"not the scheduler's {escrow} on chain {chain_id}",
                )
        now = self.clock()
        if terms.deadline <= now:
            return Decision(False, f"the deadline {terms.deadline} has passed")
        problem = hold_problem(
            terms.hold_for,
            offer.spec.limits.timeout_s,
            int(now),
            terms.deadline,
            self.hold_margin_s,
        )
        if problem is not None:
            return Decision(False, problem)
        token = checksum(terms.token)
        is_eth = token == ZERO_ADDRESS
        price = self._price(offer, token)
        if not price.accept:
            return price
        mediator = checksum(terms.mediator)
        if mediator == self.wallet:
            return Decision(False, "this node is the job's mediator")
        if mediator == checksum(terms.operator):
            return Decision(False, "the job's mediator is its operator")
        cap = self.max_collateral_wei
        if is_eth and cap is not None and terms.collateral_wei > cap:
            return Decision(
                False, f"collateral {terms.collateral_wei} wei is over the cap of {cap} wei"
            )
        verdict = self._mediator(offer, mediator)
        if not verdict.accept:
            return verdict
        if self.chain is not None:
            free = self.chain.free_collateral_of(self.wallet, token)
            if terms.collateral_wei > free and is_eth:
                return Decision(
                    False,
                    f"collateral {terms.collateral_wei} wei is more than the free stake "
                    f"({free} wei)",
                )
            if terms.collateral_wei > free:
                fmt, symbol = self._fmt(token), self._symbol(token)
                return Decision(
                    False,
                    f"collateral {fmt(terms.collateral_wei)} is more than the free stake in "
                    f"{symbol} ({fmt(free)})",
                )
        return verdict

    def _price(self, offer: Assignment, token: str) -> Decision:
        """The job's price per hour in its token against the node's floor in that token."""
        rate = offered_price_wei_per_hour(offer.terms.bounty_wei, offer.spec)
        if token == ZERO_ADDRESS:
            floor = self.price_floor_wei_per_hour
            if rate < floor:
                return Decision(
                    False,
                    f"pays {rate} wei per hour, under the floor of {floor} wei per hour",
                )
            return Decision(True, "price")
        symbol = self._symbol(token)
        token_floor = self.token_floors.get(token)
        if token_floor is None:
            return Decision(False, f"no floor for {symbol} (price_floors): not taking {symbol}")
        if rate < token_floor:
            fmt = self._fmt(token)
            return Decision(
                False,
                f"pays {fmt(rate)} per hour, under the floor of {fmt(token_floor)} per hour",
            )
        return Decision(True, "price")

    def _symbol(self, token: str) -> str:
        return self.token_of(token).symbol if self.token_of is not None else token

    def _fmt(self, token: str) -> Callable[[int], str]:
        if self.token_of is not None:
            return self.token_of(token).fmt
        return lambda units: f"{units} units of {token}"

    def _trusted(self, mediator: str) -> Decision | None:
        """Whether the node accepts ``mediator`` to rule on its results (``accepted_mediators``,
        else the deployment's, else listed on-chain); None when it cannot tell (no list, not
        the deployment's, no RPC URL)."""
        if self.accepted_mediators:
            if mediator in self.accepted_mediators:
                return Decision(True, f"mediator {mediator} is in accepted_mediators")
            return Decision(
                False,
                f"mediator {mediator} is not in accepted_mediators "
                "(the only mediators this node accepts)",
            )
        if mediator == self.deployment_mediator:
            return Decision(True, f"mediator {mediator} is the deployment's")
        if self.chain is not None:
            if self.chain.is_listed_mediator(mediator):
                return Decision(True, f"mediator {mediator} is listed on-chain")
            return Decision(
                False,
                f"mediator {mediator} is not listed on-chain (by default this node accepts "
                "only the deployment's listed mediators; accepted_mediators lists others)",
            )
        return None

    def _mediator(self, offer: Assignment, mediator: str) -> Decision:
        if self.chain is not None:
            job_id = bytes.fromhex(offer.job_id.removeprefix("0x"))
            if checksum(self.chain.submitter_of(job_id)) == mediator:
                if self.accept_self_mediated:
                    return Decision(True, "self-mediated job (accept_self_mediated)")
                trusted = self._trusted(mediator)
                if trusted is not None and trusted.accept:
                    return Decision(
                        True,
                        f"the mediator's own job (a re-run of a dispute): {trusted.reason}",
                    )
                return Decision(
                    False,
                    f"the mediator {mediator} is the job's submitter, who could rule an honest "
                    "result wrong and take the collateral: refused unless accept_self_mediated "
                    "is set or the submitter is a mediator this node accepts",
                )
        trusted = self._trusted(mediator)
        if trusted is not None:
            return trusted
        log.warning(
            "job %s: cannot check that mediator %s is a listed one (no rpc_url); accepting",
            offer.job_id[:10],
            mediator,
        )
        return Decision(True, f"mediator {mediator} unchecked (no rpc_url)")
