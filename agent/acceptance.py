"""Whether this node takes a job on the terms the scheduler offers, and its signed acceptance.

Escrow version 2 assigns a job only with the provider's EIP-712 ``Acceptance`` of its terms
(:func:`gridmarket.eip712.sign_acceptance`): the price, the deadline, the collateral locked from
the node's stake while it holds the job, the mediator who may rule its result wrong (and so take
that collateral) and the payment flags. :class:`AcceptancePolicy` checks an offered
:class:`~gridmarket.wire.Assignment` against the node's settings before it signs anything:

* the offer must be self-consistent (its terms' bounty and deadline are the offer's), for the
  escrow and chain the scheduler registered the node with, and not past its deadline;
* the collateral must not exceed ``max_collateral_wei`` (no cap by default) nor, when the node
  can read the chain, its free stake (``freeCollateralOf``: ``assign`` would revert anyway);
* the mediator (who can slash the collateral):

  - never the node itself nor the job's operator (the contract refuses those too);
  - the job's own submitter ("self-mediated": the submitter could rule against any result and
    keep the collateral) only with ``accept_self_mediated``. The submitter is read from the
    chain (the job's ``JobCreated``) when the node has an RPC URL;
  - ``accepted_mediators``, when set, is the whole list of mediators the node accepts;
  - otherwise any *listed* mediator: the one listed in the deployment file the node knows
    (``params.mediator``), or one the escrow's ``isListedMediator`` view confirms (with an
    RPC URL). A node with neither an RPC URL nor a matching deployment mediator cannot tell a
    listed mediator from a self-mediating submitter: it accepts, logging that it could not
    check (set ``rpc_url``, or list the mediators you trust, to close that gap).

A chain that does not answer while a check needs it declines the offer (the scheduler offers
the job again, or to another node): a node that configured an RPC URL asked for the checks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gridmarket.eip712 import sign_acceptance
from gridmarket.escrow import Job
from gridmarket.wire import AcceptRequest, Assignment, JobTerms, checksum

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from gridmarket.chain import EscrowClient

__all__ = [
    "AcceptancePolicy",
    "ChainFacts",
    "Decision",
    "EscrowFacts",
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

    def free_collateral_of(self, provider: str) -> int: ...


class EscrowFacts:
    """:class:`ChainFacts` from a deployed escrow (views and the job's events)."""

    def __init__(self, client: EscrowClient) -> None:
        self.client = client

    def submitter_of(self, job_id: bytes) -> str:
        return checksum(self.client.job_state(job_id).job.submitter)

    def is_listed_mediator(self, mediator: str) -> bool:
        return bool(self.client.call("isListedMediator", checksum(mediator)))

    def free_collateral_of(self, provider: str) -> int:
        return int(self.client.call("freeCollateralOf", checksum(provider)))


def terms_job(terms: JobTerms) -> Job:
    """The job struct the acceptance covers (only its terms are signed; the submitter is not)."""
    return terms.as_job()


def acceptance_request(account: LocalAccount, assignment: Assignment) -> AcceptRequest:
    """The node's signed acceptance of ``assignment`` (its attempt, its terms)."""
    signature = sign_acceptance(
        account,
        assignment.chain_id,
        checksum(assignment.escrow),
        bytes.fromhex(assignment.job_id.removeprefix("0x")),
        assignment.attempt,
        terms_job(assignment.terms),
    )
    return AcceptRequest(attempt=assignment.attempt, signature="0x" + signature.hex())


class AcceptancePolicy:
    """The node's rules for taking a job (module docstring); :meth:`decide` one offer.

    ``expected`` returns the ``(chain_id, escrow)`` the node registered with (the scheduler's
    ``/v1/info``), or None when unknown; ``chain`` reads the chain when the node has an RPC URL.
    """

    def __init__(
        self,
        wallet: str,
        *,
        accepted_mediators: Sequence[str] = (),
        accept_self_mediated: bool = False,
        max_collateral_wei: int | None = None,
        deployment_mediator: str | None = None,
        chain: ChainFacts | None = None,
        expected: Callable[[], tuple[int, str] | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.wallet = checksum(wallet)
        self.accepted_mediators = frozenset(checksum(m) for m in accepted_mediators)
        self.accept_self_mediated = accept_self_mediated
        self.max_collateral_wei = max_collateral_wei
        zero = deployment_mediator is None or int(deployment_mediator, 16) == 0
        self.deployment_mediator = None if zero else checksum(str(deployment_mediator))
        self.chain = chain
        self.expected = expected
        self.clock = clock

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
        if terms.deadline <= self.clock():
            return Decision(False, f"the deadline {terms.deadline} has passed")
        mediator = checksum(terms.mediator)
        if mediator == self.wallet:
            return Decision(False, "this node is the job's mediator")
        if mediator == checksum(terms.operator):
            return Decision(False, "the job's mediator is its operator")
        cap = self.max_collateral_wei
        if cap is not None and terms.collateral_wei > cap:
            return Decision(
                False, f"collateral {terms.collateral_wei} wei is over the cap of {cap} wei"
            )
        verdict = self._mediator(offer, mediator)
        if not verdict.accept:
            return verdict
        if self.chain is not None:
            free = self.chain.free_collateral_of(self.wallet)
            if terms.collateral_wei > free:
                return Decision(
                    False,
                    f"collateral {terms.collateral_wei} wei is more than the free stake "
                    f"({free} wei)",
                )
        return verdict

    def _mediator(self, offer: Assignment, mediator: str) -> Decision:
        if self.chain is not None:
            job_id = bytes.fromhex(offer.job_id.removeprefix("0x"))
            if checksum(self.chain.submitter_of(job_id)) == mediator:
                if self.accept_self_mediated:
                    return Decision(True, "self-mediated job (accept_self_mediated)")
                return Decision(False, f"the mediator {mediator} is the job's submitter")
        if self.accepted_mediators:
            if mediator in self.accepted_mediators:
                return Decision(True, f"mediator {mediator} is in accepted_mediators")
            return Decision(False, f"mediator {mediator} is not in accepted_mediators")
        if mediator == self.deployment_mediator:
            return Decision(True, f"mediator {mediator} is the deployment's")
        if self.chain is not None:
            if self.chain.is_listed_mediator(mediator):
                return Decision(True, f"mediator {mediator} is listed on-chain")
            return Decision(False, f"mediator {mediator} is not listed on-chain")
        log.warning(
            "job %s: cannot check that mediator %s is a listed one (no rpc_url); accepting",
            offer.job_id[:10],
            mediator,
        )
        return Decision(True, f"mediator {mediator} unchecked (no rpc_url)")
