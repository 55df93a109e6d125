"""Results submitted on-chain by the node itself (``submit_on_chain``): ``submitResult`` from
the provider's wallet, so the result stands even if no scheduler relays it. The scheduler still
verifies it (it sees ``ResultSubmitted``) and releases or rejects it; after the challenge window
the provider may ``claim`` its pay without anyone's help."""

from __future__ import annotations

import logging
from pathlib import Path

from eth_account.signers.local import LocalAccount

from gridmarket.chain import ChainError, Deployment, EscrowClient
from gridmarket.escrow import Status
from gridmarket.wire import ResultReport, RunReason, checksum

log = logging.getLogger(__name__)


class OnChainSubmitter:
    """Submits succeeded results from the provider's wallet; idempotent per job and attempt."""

    def __init__(self, rpc_url: str, deployment: Path, account: LocalAccount) -> None:
        self.account = account
        self.client = EscrowClient.connect(rpc_url, Deployment.load(deployment))

    def submit(self, job_id: str, report: ResultReport) -> str | None:
        """The tx hash of ``submitResult``, or None when there is nothing (more) to send.

        Raises ChainError for a refusal (not assigned to this wallet, deadline passed, ...) and
        the RPC's errors when the chain is unreachable (the caller retries those).
        """
        if report.reason is not RunReason.SUCCEEDED or report.output_cid is None:
            return None
        jid = bytes.fromhex(job_id.removeprefix("0x"))
        state = self.client.job_state(jid)
        if state.status is not Status.ASSIGNED:
            if state.output_cid == report.output_cid:
                return None  # sent already (a retry after an unknown outcome)
            raise ChainError(f"job {job_id} is {state.status.name}, not ASSIGNED", "NotAssigned")
        if (
            checksum(state.job.provider) != self.account.address
            or state.job.attempt != report.attempt
        ):
            raise ChainError(
                f"job {job_id} attempt {state.job.attempt} is assigned to {state.job.provider}",
                "NotOurs",
            )
        sent = self.client.send(
            self.account, "submitResult", jid, state.job.as_tuple(), report.output_cid
        )
        log.info("job %s: result submitted on-chain in %s", job_id[:10], sent.tx_hash)
        return sent.tx_hash
