"""The checkpoint wire (gridmarket/checkpoints.py): the spec's policy, the job's hostile progress
file read forgivingly, the node's signature over a checkpoint, and specs without a policy
keeping the bytes (and the CID) they had before the field existed."""

from __future__ import annotations

import json

import pytest
from eth_account import Account
from pydantic import ValidationError

from gridmarket.checkpoints import (
    MAX_METRICS,
    MAX_PROGRESS_BYTES,
    CheckpointPolicy,
    CheckpointReport,
    Progress,
    parse_progress,
    recover_checkpoint_signer,
    sign_checkpoint,
)
from gridmarket.wire import ExecutorKind, JobSpec

CID = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
ESCROW = "0x" + "42" * 20


def test_a_progress_file_is_read_forgivingly() -> None:
    ok = b'{"step": 120, "total": 1000, "metrics": {"loss": 0.31, "acc": 1}}'
    assert parse_progress(ok) == (
        Progress(step=120, total=1000, metrics={"acc": 1.0, "loss": 0.31}),
        None,
    )
    assert parse_progress(b'{"step": 3.0}')[0] == Progress(step=3)
    # a total below the step, a bool, a string: dropped; the step stays
    assert parse_progress(b'{"step": 5, "total": 2}')[0] == Progress(step=5)
    junk = b'{"loss": "low", "ok": true, "%s": 1.0, "bad name": 1, "big": 1e400, "n": null}' % (
        b"x" * 40
    )
    parsed = parse_progress(b'{"step": 1, "metrics": ' + junk + b"}")[0]
    assert parsed == Progress(step=1)
    many = {f"m{i:02d}": float(i) for i in range(40)}
    kept = parse_progress(json.dumps({"step": 1, "metrics": many}).encode())[0]
    assert kept is not None and len(kept.metrics) == MAX_METRICS and "m00" in kept.metrics


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"total": 3}', "has no step"),
        (b'{"step": -1}', "has no step"),
        (b'{"step": true}', "has no step"),
        (b'{"step": 1e30}', "has no step"),
        (b'{"step": NaN}', "not JSON"),
        (b'{"step": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "bytes, more than"),
        (b"[" * 2000 + b"]" * 2000, "not JSON"),
        (b'{"step": 1, "pad": "' + b"x" * MAX_PROGRESS_BYTES + b'"}', "bytes, more than"),
    ],
    ids=lambda v: f"{len(v)}B" if isinstance(v, bytes) else v,
)
def test_a_bad_progress_file_is_ignored_with_the_reason(data: bytes, why: str) -> None:
    progress, problem = parse_progress(data)
    assert progress is None and problem is not None and why in problem


def test_the_policy_is_bounded_and_docker_only() -> None:
    with pytest.raises(ValidationError, match="interval_s"):
        CheckpointPolicy(interval_s=1)
    with pytest.raises(ValidationError, match="max_bytes"):
        CheckpointPolicy(max_bytes=2**40)
    with pytest.raises(ValidationError, match="only docker jobs can checkpoint"):
        JobSpec(executor=ExecutorKind.WASM, module_cid=CID, checkpoint=CheckpointPolicy())


def test_a_spec_without_a_policy_keeps_its_bytes() -> None:
    plain = JobSpec(executor=ExecutorKind.DOCKER, image="busybox:1")
    assert b"checkpoint" not in plain.to_bytes()
    with_policy = plain.model_copy(update={"checkpoint": CheckpointPolicy(interval_s=60)})
    assert b'"checkpoint":{"interval_s":60,' in with_policy.to_bytes()
    assert JobSpec.from_bytes(with_policy.to_bytes()) == with_policy


def test_a_checkpoint_signature_names_its_node_and_every_field() -> None:
    node = Account.from_key("0x" + "07" * 32)
    job = bytes.fromhex("ab" * 32)
    sig = sign_checkpoint(node, 31337, ESCROW, job, 2, 5, CID, 1234)
    assert recover_checkpoint_signer(sig, 31337, ESCROW, job, 2, 5, CID, 1234) == node.address
    for changed in [(3, 5, 1234), (2, 6, 1234), (2, 5, 1235)]:
        attempt, seq, size = changed
        other = recover_checkpoint_signer(sig, 31337, ESCROW, job, attempt, seq, CID, size)
        assert other != node.address
    report = CheckpointReport(
        attempt=2, seq=5, cid=CID, size=1234, files=1, taken_at=1.0, signature="0x" + sig.hex()
    )
    assert report.progress is None and not report.final
    with pytest.raises(ValidationError, match="not a valid CID"):
        report.model_validate({**report.model_dump(), "cid": "Qm-not-a-cid"})
