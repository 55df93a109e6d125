"""A chain of the agent tests' own (anvil + a fresh escrow with a listed mediator and TestUSD
listed, minted to accounts 3..9), for tests that move the chain's clock, and the steps of a job
driven by hand: fund (in ETH or tUSD), accept, assign, submit, rule, finalize."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from agent.acceptance import terms_job
from devstack.anvil import Anvil, dev_accounts
from gridmarket import holds
from gridmarket.chain import Deployment, EscrowClient
from gridmarket.deploy import EscrowParams, deploy_escrow, deploy_test_token, list_token
from gridmarket.eip712 import sign_acceptance
from gridmarket.escrow import JobState, Terms
from gridmarket.lightchain import LightEscrowClient
from gridmarket.token import Token, TokenClient, tokens_of
from gridmarket.wire import JobLimits, JobTerms

TOKEN_GRANT = 100_000 * 10**6
"""TestUSD minted to each of accounts 3..9 (100,000 tUSD)."""
DEFAULT_HOLD_FOR = holds.hold_for(JobLimits().timeout_s)
"""The hold a scheduler offers for a spec with the default limits (600 s: 900 s)."""


@dataclass
class Chain:
    anvil: Anvil
    escrow: EscrowClient
    deployment_file: Path
    params: EscrowParams
    accounts: list[LocalAccount]
    token_address: str
    """TestUSD (tUSD, 6 decimals, EIP-2612), listed for bounties."""
    _light: LightEscrowClient | None = field(default=None, repr=False)

    @property
    def light(self) -> LightEscrowClient:
        """The escrow through the daemon's client (JSON-RPC, no web3): one per chain, as the
        daemon shares one between its duties."""
        if self._light is None:
            self._light = LightEscrowClient.connect(self.url, self.escrow.deployment)
        return self._light

    @property
    def tusd(self) -> Token:
        return tokens_of(self.escrow.deployment.tokens)["tUSD"]

    @property
    def erc20(self) -> TokenClient:
        return TokenClient(self.w3, self.token_address)

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

    def fund_token(self, bounty: int = 2 * 10**6, ttl: int = 7200, **terms: Any) -> JobState:
        """A job paid in tUSD (``bounty`` in its units), the deployment's other terms."""
        base = self.escrow.default_terms(bounty, self.submitter.address, token=self.token_address)
        return self.fund(bounty, replace(base, **terms), ttl)

    def self_mediated(self, bounty: int = 10**16) -> Terms:
        return Terms(mediator=self.submitter.address, collateral=self.min_collateral(bounty))

    def min_collateral(self, bounty: int) -> int:
        return self.escrow.min_collateral(bounty)

    def assign(
        self, state: JobState, provider: LocalAccount, hold_for: int = DEFAULT_HOLD_FOR
    ) -> JobState:
        """The provider's signed acceptance (of a hold of ``hold_for`` seconds), then the
        operator's ``assign`` (a seat: on its group, :func:`gridmarket.escrow.assign_target`)."""
        signature = sign_acceptance(
            provider,
            self.escrow.deployment.chain_id,
            self.escrow.address,
            state.job_id,
            state.job.attempt + 1,
            terms_job(job_terms(state, hold_for)),
            hold_for,
        )
        state, _ = self.escrow.assign(self.operator, state, provider.address, hold_for, signature)
        return state


def job_terms(state: JobState, hold_for: int = DEFAULT_HOLD_FOR) -> JobTerms:
    """The terms a scheduler offers for a job, from its on-chain state, with a hold of
    ``hold_for`` seconds (by default what it offers for the default 600 s timeout)."""
    job = state.job
    return JobTerms(
        hold_for=hold_for,
        bounty_wei=job.bounty,
        fee_bps=job.fee_bps,
        deadline=job.deadline,
        collateral_wei=job.collateral,
        mediator=job.mediator,
        flags=job.flags,
        operator=job.operator,
        token=job.token,
    )


@contextmanager
def own_chain(tmp: Path, *, prune_history: bool = False, **params: Any) -> Iterator[Chain]:
    """Anvil with the escrow deployed, the mediator (account 10) listed, TestUSD listed and
    :data:`TOKEN_GRANT` of it minted to accounts 3..9 (``prune_history``: anvil keeps no past
    states, as a node that is not an archive keeps few)."""
    anvil = Anvil(log_file=tmp / "anvil.log", prune_history=prune_history).start()
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
        token = deploy_test_token(w3, accounts[0])
        deployment = list_token(w3, accounts[0], deployment, token)
        minter = TokenClient(w3, token)
        for holder in accounts[3:10]:
            minter.send(accounts[0], "mint", holder.address, TOKEN_GRANT)
        deployment_file = tmp / "deployment.json"
        deployment.save(deployment_file)
        escrow = EscrowClient(w3, deployment)
        chain = Chain(anvil, escrow, deployment_file, escrow_params, accounts, token)
        try:
            yield chain
        finally:
            if chain._light is not None:
                chain._light.close()
    finally:
        anvil.stop()
