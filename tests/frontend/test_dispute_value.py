"""The submitter CLI's own figures for a dispute (``dispute_value``: the ETH it sends and the
deposit): `depositOf` the job struct the prepared call passes, its bounty at least the escrow's
floor for an ETH job, read from the call and not from the front end's word; nothing sent for a
token job (pulled) or a spot job (locked at funding). No chain: the calls are built here."""

from __future__ import annotations

import pytest
from eth_abi.abi import encode
from eth_utils.crypto import keccak

from frontend_api.submitter_client import JOB_TUPLE, CliError, dispute_value, job_call_signature
from gridmarket.escrow import FLAG_SPOT, ZERO_ADDRESS, Job, deposit_of

FLOOR = 10**15
INFO = {"params": {"dispute_deposit": str(FLOOR)}}
SUBMITTER = "0x" + "11" * 20
TOKEN = "0x" + "22" * 20


def dispute_tx(job: Job) -> dict[str, str]:
    selector = keccak(text=job_call_signature("dispute"))[:4]
    data = selector + encode(["bytes32", JOB_TUPLE], [b"\x01" * 32, job.as_tuple()])
    return {"data": "0x" + data.hex()}


@pytest.mark.parametrize(
    ("bounty", "deposit"),
    [(2 * 10**16, 2 * 10**16), (FLOOR, FLOOR), (FLOOR // 2, FLOOR)],
    ids=["above-the-floor", "at-the-floor", "under-the-floor"],
)
def test_an_eth_disputes_value_is_the_bounty_at_least_the_floor(bounty: int, deposit: int) -> None:
    job = Job(submitter=SUBMITTER, bounty=bounty)
    value, deposited = dispute_value(dispute_tx(job), INFO)
    assert value == deposited == deposit == deposit_of(bounty, ZERO_ADDRESS, FLOOR)


def test_a_token_jobs_deposit_has_no_floor() -> None:
    assert deposit_of(5, TOKEN, FLOOR) == 5
    assert dispute_value(dispute_tx(Job(submitter=SUBMITTER, bounty=5, token=TOKEN)), INFO) == (
        0,
        5,
    )


@pytest.mark.parametrize("bounty", [FLOOR // 2, 2 * 10**16], ids=["under-the-floor", "above"])
def test_a_spot_jobs_dispute_sends_nothing_its_deposit_is_the_bounty(bounty: int) -> None:
    job = Job(submitter=SUBMITTER, bounty=bounty, flags=FLAG_SPOT)
    assert dispute_value(dispute_tx(job), INFO) == (0, bounty)


def test_a_call_that_does_not_decode_is_refused() -> None:
    with pytest.raises(CliError, match="not a dispute"):
        dispute_value({"data": "0x" + "00" * 10}, INFO)
