"""A chain of the agent tests' own (anvil + a fresh escrow with a listed mediator), for tests
that move the chain's clock, and the steps of a job driven by hand: fund, accept, assign,
submit, rule, finalize."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from agent.acceptance import terms_job
from devstack.anvil import Anvil, dev_accounts
from gridmarket.chain import Deployment, EscrowClient
from gridmarket.deploy import EscrowParams, deploy_escrow
from gridmarket.eip712 import sign_acceptance
from gridmarket.escrow import JobState, Terms
from gridmarket.wire import JobTerms


@dataclass
class Chain:
    anvil: Anvil
    escrow: EscrowClient
    deployment_file: Path
    params: EscrowParams
    accounts: list[LocalAccount]

    @property
    def url(self) -> str:
        return self.anvil.url

    @property
    def w3(self) -> Web3:
        return self.escrow.w3

    @property
    def operator(self) -> LocalAccount:
        return self.accounts[1]

    @property
    def submitter(self) -> LocalAccount:
        return self.accounts[3]

    @property
    def mediator(self) -> LocalAccount:
        return self.accounts[10]

    def rpc(self, method: str, *params: Any) -> Any:
        return self.w3.provider.make_request(method, list(params))  # type: ignore[arg-type]

    def now(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def warp(self, seconds: int) -> None:
        """Move the chain's clock forward (and mine a block at the new time)."""
        self.rpc("evm_increaseTime", seconds)
        self.rpc("evm_mine")

    def stake(self, provider: LocalAccount, wei: int) -> None:
        self.escrow.send(provider, "registerProvider", "bafkreiagentprovider", value=wei)

    def fund(self, bounty: int = 10**16, terms: Terms | None = None, ttl: int = 7200) -> JobState:
        spec_cid = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
        state, _ = self.escrow.create_job(
            self.submitter, os.urandom(32), spec_cid, self.now() + ttl, bounty, terms
        )
        return state

    def self_mediated(self, bounty: int = 10**16) -> Terms:
        return Terms(mediator=self.submitter.address, collateral=self.min_collateral(bounty))

    def min_collateral(self, bounty: int) -> int:
        return int(self.escrow.call("minCollateral", bounty))

    def assign(self, state: JobState, provider: LocalAccount) -> JobState:
        """The provider's signed acceptance, then the operator's ``assign``."""
        signature = sign_acceptance(
            provider,
            self.escrow.deployment.chain_id,
            self.escrow.address,
            state.job_id,
            state.job.attempt + 1,
            terms_job(job_terms(state)),
        )
        state, _ = self.escrow.call_job(self.operator, "assign", state, provider.address, signature)
        return state


def job_terms(state: JobState) -> JobTerms:
    """The terms a scheduler offers for a job, from its on-chain state."""
    job = state.job
    return JobTerms(
        bounty_wei=job.bounty,
        fee_bps=job.fee_bps,
        deadline=job.deadline,
        collateral_wei=job.collateral,
        mediator=job.mediator,
        flags=job.flags,
        operator=job.operator,
    )


@contextmanager
def own_chain(tmp: Path, **params: Any) -> Iterator[Chain]:
    """Anvil with the escrow deployed, the mediator (account 10) listed."""
    anvil = Anvil(log_file=tmp / "anvil.log").start()
    try:
        w3 = Web3(Web3.HTTPProvider(anvil.url))
        accounts = [Account.from_key(k) for k in dev_accounts(11)]
        escrow_params = EscrowParams(
            operator=accounts[1].address,
            treasury=accounts[2].address,
            mediator=accounts[10].address,
            **params,
        )
        deployment: Deployment = deploy_escrow(w3, accounts[0], escrow_params)
        deployment_file = tmp / "deployment.json"
        deployment.save(deployment_file)
        yield Chain(anvil, EscrowClient(w3, deployment), deployment_file, escrow_params, accounts)
    finally:
        anvil.stop()
