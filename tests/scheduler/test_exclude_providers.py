"""A job spec's ``exclude_providers`` (the mediator's re-run names the disputed provider and the
submitter there) keeps every node of those wallets from being matched to the job, in the store
the scheduler really uses (tests/e2e/test_rerun.py checks it on the whole grid)."""

from __future__ import annotations

from dataclasses import replace

from eth_utils.address import to_checksum_address

from gridmarket.cid import bytes_cid
from gridmarket.wire import JobSpec
from scheduler.dispatch import refused_wallets, requirements
from scheduler.store import Store

from .test_store import SPEC, WALLETS, created, jid


def test_the_wallets_a_spec_excludes_are_never_matched(store: Store) -> None:
    excluded = to_checksum_address(WALLETS[0])  # any letter case in the spec
    spec = JobSpec.model_validate({**SPEC.model_dump(mode="json"), "exclude_providers": [excluded]})
    # its own spec CID: specs are cached by CID for the whole process, and the other store
    # tests' jobs all name the plain SPEC's
    ev = created(1)
    ev = replace(ev, args={**ev.args, "specCid": bytes_cid(spec.to_bytes())})
    store.apply_chain_events([ev], through_block=10)
    assert store.set_spec(jid(1), spec) == "queued"
    job = store.job(jid(1))
    free = replace(job, spec=SPEC)  # the same job without the exclusion
    assert job.spec is not None and job.spec.exclude_providers == [excluded]
    assert refused_wallets(job) == {WALLETS[0].lower()}
    assert refused_wallets(free) == frozenset()

    def nodes_of(wallet: str) -> list[str]:
        return {WALLETS[0].lower(): ["n-excluded"], WALLETS[1].lower(): ["n-other"]}.get(wallet, [])

    assert requirements(job, nodes_of).excluded_node_ids == {"n-excluded"}
    assert requirements(free, nodes_of).excluded_node_ids == frozenset()
