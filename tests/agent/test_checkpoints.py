"""A checkpointing job on the real dockerd and js-ipfs daemon: /checkpoint copied on its interval
and once more when the run is stopped (SIGTERM first: the job saves), each copy added to IPFS,
signed and reported; a resumed attempt finds the checkpoint it was given in /checkpoint; one
that cannot be fetched starts over and says so; what the job leaves in /checkpoint is hostile
(links, half-written files, too many bytes)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount

from agent.checkpointing import CheckpointTooLargeError, copy_tree, prepare_mount
from agent.runner import JobRunner
from agent.storage.ipfs import AgentIpfsStore
from gridmarket.checkpoints import (
    CheckpointPolicy,
    CheckpointRef,
    CheckpointReport,
    Progress,
    recover_checkpoint_signer,
)
from gridmarket.cid import path_cid
from gridmarket.wire import RunReason
from tests.agent.test_runner import CHAIN_ID, ESCROW, assignment, docker_spec

MiB = 1024 * 1024

# Counts steps in /checkpoint/step (resuming from it), writes progress.json by rename, and saves
# "saved" on SIGTERM before it exits: the contract docs/submitter.md gives a checkpointing job.
LOOP = r"""
set -e
cd /checkpoint
step=0
[ -f step ] && step=$(cat step) && echo "resuming from step $step"
trap 'echo saved > note.tmp; mv note.tmp note; exit 143' TERM
while [ "$step" -lt "$STEPS" ]; do
  step=$((step + 1))
  echo $step > step.tmp && mv step.tmp step
  printf '{"step": %d, "total": %d, "metrics": {"loss": 0.5}}' $step $STEPS > p.tmp
  mv p.tmp progress.json
  echo "step $step"
  sleep 0.2
done
echo $step > /output/steps
"""


def checkpointing(image: str, steps: int, interval_s: int = 10, max_bytes: int = MiB):  # type: ignore[no-untyped-def]
    return docker_spec(
        image,
        LOOP,
        env={"STEPS": str(steps)},
        checkpoint=CheckpointPolicy(interval_s=interval_s, max_bytes=max_bytes),
    )


def test_interval_and_final_checkpoints_are_added_signed_and_reported(
    runner: JobRunner, account: LocalAccount, test_image: str, storage: AgentIpfsStore,
    tmp_path: Path,
) -> None:  # fmt: skip
    job = assignment(checkpointing(test_image, steps=1000))
    reports: list[CheckpointReport] = []
    notes: list[str] = []
    cancel = threading.Event()
    threading.Timer(13, cancel.set).start()  # one interval (10 s), then stop the run
    report = runner.run(job, cancel, on_checkpoint=reports.append, on_note=notes.append)

    assert report.reason is RunReason.CANCELLED
    assert [r.seq for r in reports] == list(range(1, len(reports) + 1)) and len(reports) >= 2
    assert [r.final for r in reports] == [False] * (len(reports) - 1) + [True]
    final = reports[-1]
    back = tmp_path / "back"
    storage.fetch(final.cid, back, max_bytes=MiB)
    assert path_cid(back) == final.cid and final.size == sum(
        p.stat().st_size for p in back.rglob("*") if p.is_file()
    )
    assert (back / "note").read_text() == "saved\n"  # SIGTERM came first, with its grace
    assert not any(p.name.endswith(".tmp") for p in back.iterdir())
    step = int((back / "step").read_text())
    assert final.progress == Progress(step=step, total=1000, metrics={"loss": 0.5})
    assert reports[0].progress is not None and reports[0].progress.step < step
    for r in reports:
        signer = recover_checkpoint_signer(
            bytes.fromhex(r.signature[2:]), CHAIN_ID, ESCROW, bytes.fromhex(job.job_id[2:]),
            job.attempt, r.seq, r.cid, r.size,
        )  # fmt: skip
        assert signer == account.address
    assert notes == []


def test_a_resumed_attempt_starts_from_its_checkpoint(
    runner: JobRunner, test_image: str, storage: AgentIpfsStore, tmp_path: Path
) -> None:
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "step").write_text("7\n")
    (saved / "progress.json").write_text('{"step": 7, "total": 9}')
    cid = storage.add_dir(saved)
    ref = CheckpointRef(
        cid=cid, size=25, attempt=1, seq=3, wallet="0x" + "ab" * 20,
        signature="0x" + "11" * 65, progress=Progress(step=7, total=9),
    )  # fmt: skip
    job = assignment(checkpointing(test_image, steps=9), attempt=2).model_copy(
        update={"resume": ref}
    )
    notes: list[str] = []
    out: list[bytes] = []
    report = runner.run(job, on_note=notes.append, on_output=lambda _s, b: out.append(b))

    assert report.reason is RunReason.SUCCEEDED, report
    assert b"resuming from step 7" in b"".join(out)
    assert b"step 8\nstep 9\n" in b"".join(out) and b"step 1\n" not in b"".join(out)
    assert notes == [f"[resuming from checkpoint {cid} (attempt 1, step 7)]"]


def test_a_checkpoint_that_cannot_be_had_starts_over_and_says_so(
    runner: JobRunner, test_image: str, storage: AgentIpfsStore, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "step").write_text(os.urandom(8).hex())
    cid = path_cid(gone)  # a real CID nobody has
    ref = CheckpointRef(
        cid=cid, size=16, attempt=1, seq=1, wallet="0x" + "ab" * 20, signature="0x" + "11" * 65
    )
    job = assignment(checkpointing(test_image, steps=2), attempt=2).model_copy(
        update={"resume": ref}
    )
    notes: list[str] = []
    started = time.monotonic()
    report = runner.run(job, on_note=notes.append)

    assert report.reason is RunReason.SUCCEEDED, report
    assert time.monotonic() - started < 60
    assert len(notes) == 1 and notes[0].startswith(f"[checkpoint {cid} could not be fetched")
    assert notes[0].endswith("starting from the beginning]")


def test_a_checkpoint_larger_than_its_seed_size_is_refused(
    runner: JobRunner, test_image: str, storage: AgentIpfsStore, tmp_path: Path
) -> None:
    """The scheduler's ref names the size it kept: a CID with more behind it is not fetched."""
    big = tmp_path / "big"
    big.mkdir()
    (big / "blob").write_bytes(os.urandom(64 * 1024))
    cid = storage.add_dir(big)
    ref = CheckpointRef(
        cid=cid, size=1024, attempt=1, seq=1, wallet="0x" + "ab" * 20, signature="0x" + "11" * 65
    )
    job = assignment(checkpointing(test_image, steps=1), attempt=2).model_copy(
        update={"resume": ref}
    )
    notes: list[str] = []
    report = runner.run(job, on_note=notes.append)
    assert report.reason is RunReason.SUCCEEDED
    assert "could not be fetched" in notes[0]


def test_the_copy_leaves_out_links_devices_and_half_written_files(tmp_path: Path) -> None:
    live = tmp_path / "live"
    (live / "sub").mkdir(parents=True)
    (live / "sub" / "w.bin").write_bytes(b"w" * 100)
    (live / "model.pt.tmp").write_bytes(b"half")
    (live / "link").symlink_to("/etc/passwd")
    (live / "dirlink").symlink_to(tmp_path)
    os.mkfifo(live / "fifo")
    dest = tmp_path / "dest"
    assert copy_tree(live, dest, max_bytes=1000) == (100, 2)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["sub", "sub/w.bin"]
    with pytest.raises(CheckpointTooLargeError, match="cap of bytes"):
        copy_tree(live, tmp_path / "small", max_bytes=99)
    for i in range(5):
        (live / f"f{i}").write_bytes(b"")
    with pytest.raises(CheckpointTooLargeError, match="more than 4 files"):
        copy_tree(live, tmp_path / "few", max_bytes=1000, max_files=4)


def test_a_comparable_job_is_not_resumed_from_another_nodes_checkpoint(
    account: LocalAccount, storage: AgentIpfsStore, tmp_path: Path
) -> None:
    """The mediator re-runs a comparable job from the beginning (a dispute, a spot check): an
    honest node that resumed from a poisoned checkpoint would differ and be slashed for it."""
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "step").write_text("7\n")
    cid = storage.add_dir(saved)
    ref = CheckpointRef(
        cid=cid, size=2, attempt=1, seq=1, wallet="0x" + "ab" * 20, signature="0x" + "11" * 65
    )
    pinned = "registry.example/job@sha256:" + "ab" * 32
    spec = docker_spec(pinned, "true", deterministic=True, checkpoint=CheckpointPolicy())
    job = assignment(spec, attempt=2).model_copy(update={"resume": ref})
    notes: list[str] = []
    fetched: list[int] = []
    mount = prepare_mount(
        job, account, storage, tmp_path / "job", fetch=lambda fn: fetched.append(fn()) or 0,
        note=notes.append,
    )  # fmt: skip
    assert mount.seed is None and fetched == []
    assert notes == [
        f"[not resuming from checkpoint {cid}: this job's result can be re-run from the "
        "beginning by the mediator, so it starts from the beginning]"
    ]
