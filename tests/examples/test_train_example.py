"""The PyTorch training example (examples/python/train_mlp.py in ``gridmarket/python-torch:test``)
on a real dockerd, in the agent's sandbox (read-only root, no network, user 65534, a small
noexec /tmp, every capability dropped, the default limits): a run killed with SIGKILL after a few
checkpoints is resumed by a second run on the same checkpoint directory, and the loss curve of
the two runs together is exactly the one of a run that was never interrupted. A forged
checkpoint (a malicious pickle, a state that does not fit the model) is refused, and training
starts over."""

from __future__ import annotations

import csv
import json
import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.models.containers import Container
from docker.types import Mount, Ulimit

from agent.executors.base import Limits
from agent.executors.docker import FIXED_ENV
from devstack._process import ROOT, ServiceError
from devstack.torch_image import TORCH_IMAGE, TRAIN_SCRIPT_IN_IMAGE, ensure_torch_image
from frontend_api.jobfile import load_job_file
from gridmarket.checkpoints import CHECKPOINT_PATH, ENV_DIR, PROGRESS_FILE, parse_progress

JOB_FILE = ROOT / "examples" / "jobs" / "train-mlp.yaml"
NOBODY = 65534
STEPS, EVERY = 400, 50  # short: the whole test, image import included, takes ~30 s
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def torch_image(docker_client: docker.DockerClient) -> str:
    try:
        ensure_torch_image(docker_client)
    except ServiceError as exc:
        pytest.fail(f"cannot build {TORCH_IMAGE}: {exc}", pytrace=False)
    return TORCH_IMAGE


def job_dirs(base: Path) -> tuple[Path, Path]:
    """A checkpoint and an output directory the container's user can write, as the agent's."""
    dirs = base / "checkpoint", base / "output"
    for d in dirs:
        d.mkdir(parents=True)
        os.chown(d, NOBODY, NOBODY)
    return dirs


def start(
    client: docker.DockerClient,
    image: str,
    ckpt: Path,
    out: Path,
    command: list[str] | None = None,
    **env: str,
) -> Container:
    """The job file's command (or ``command``) in the sandbox flags of
    agent/executors/docker.py, with the job file's env updated by ``env``."""
    spec = load_job_file(JOB_FILE).spec
    assert spec["image"] == image and spec["checkpoint"]["interval_s"] >= 10
    limits = Limits(memory_bytes=spec["resources"]["ram_mib"] * 2**20)
    environment = {**FIXED_ENV, **spec["env"], ENV_DIR: CHECKPOINT_PATH}
    environment.update(TRAIN_STEPS=str(STEPS), CHECKPOINT_EVERY=str(EVERY), LOG_EVERY="50")
    environment.update(env)
    kwargs: dict[str, Any] = {
        "image": image,
        "command": command or spec["command"],
        "environment": environment,
        "user": f"{NOBODY}:{NOBODY}",
        "hostname": "job",
        "network_disabled": True,
        "network_mode": "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "ipc_mode": "private",
        "mem_limit": limits.memory_bytes,
        "memswap_limit": limits.memory_bytes,
        "nano_cpus": int(limits.cpus * 1e9),
        "pids_limit": limits.pids,
        "ulimits": [
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="nofile", soft=4096, hard=4096),
        ],
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,noexec,size={limits.tmp_bytes},mode=1777"},  # noqa: S108
        "mounts": [
            Mount("/output", str(out), type="bind", read_only=False),
            Mount(CHECKPOINT_PATH, str(ckpt), type="bind", read_only=False),
        ],
    }
    container = client.containers.create(**kwargs)
    container.start()
    return container


def finish(container: Container, timeout: float = 60) -> str:
    code = container.wait(timeout=timeout)["StatusCode"]
    logs = bytes(container.logs()).decode(errors="replace")
    container.remove(force=True)
    assert code == 0, logs
    return logs


def loss_rows(out: Path) -> list[tuple[int, float]]:
    with (out / "loss.csv").open() as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]


def test_killed_run_resumes_from_its_checkpoint(
    docker_client: docker.DockerClient, torch_image: str, tmp_path: Path
) -> None:
    ckpt, out = job_dirs(tmp_path / "killed")
    # run 1: slowed down (~10 ms a step) and killed with SIGKILL once 3 checkpoints are written
    first = start(docker_client, torch_image, ckpt, out, STEP_SLEEP_S="0.01")
    deadline = time.monotonic() + 45
    step = 0
    while time.monotonic() < deadline:
        progress_file = ckpt / PROGRESS_FILE
        if progress_file.is_file():
            progress, why = parse_progress(progress_file.read_bytes())
            assert progress is not None, why
            step = progress.step
            if step >= 3 * EVERY:
                break
        first.reload()
        assert first.status in ("created", "running"), first.logs().decode(errors="replace")
        time.sleep(0.05)
    first.kill(signal="SIGKILL")
    assert first.wait(timeout=30)["StatusCode"] == 137
    first_logs = first.logs().decode(errors="replace")
    first.remove(force=True)
    assert "device: cpu" in first_logs
    assert 3 * EVERY <= step < STEPS, (step, first_logs)
    assert list(out.iterdir()) == []  # killed before the end: no output yet
    # what the agent would have copied: progress.json names the step state.pt holds
    progress, _ = parse_progress((ckpt / PROGRESS_FILE).read_bytes())
    assert progress is not None and progress.total == STEPS and progress.step % EVERY == 0
    assert set(progress.metrics) == {"loss"}
    assert (ckpt / "state.pt").stat().st_size < 1024**2
    saved = progress.step

    # run 2: the same checkpoint directory, no pause
    logs = finish(start(docker_client, torch_image, ckpt, out))
    assert f"resuming from step {saved}\n" in logs
    printed = [
        int(line.split()[1].split("/")[0]) for line in logs.splitlines() if line.startswith("step ")
    ]
    assert printed and printed[0] == saved + 50 and printed[-1] == STEPS, logs  # no restart at 0
    assert f"step {STEPS}/{STEPS} loss " in logs

    names = sorted(p.name for p in out.iterdir())
    assert names == ["loss.csv", "loss.svg", "metrics.json", "model.pt"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == STEPS and metrics["device"] == "cpu"
    assert metrics["resumes"] == 1 and metrics["resumed_at"] == [saved]
    assert (out / "model.pt").read_bytes()[:2] == b"PK"  # torch.save's zip format
    rows = loss_rows(out)
    assert [s for s, _ in rows] == list(range(1, STEPS + 1))  # every step, no gap
    assert metrics["final_loss"] == pytest.approx(rows[-1][1], rel=1e-6)
    assert rows[-1][1] < rows[0][1] / 5  # it learned
    svg = ET.parse(out / "loss.svg").getroot()  # noqa: S314 - our own job's output
    assert svg.tag == f"{SVG}svg"
    assert len(svg.findall(f"{SVG}polyline")) == 1
    assert any(f"resumed at {saved}" == (t.text or "") for t in svg.iter(f"{SVG}text"))
    progress, _ = parse_progress((ckpt / PROGRESS_FILE).read_bytes())
    assert progress is not None and progress.step == STEPS  # the final checkpoint

    # an uninterrupted run on a fresh checkpoint directory: the same curve, value for value
    ref_ckpt, ref_out = job_dirs(tmp_path / "uninterrupted")
    ref_logs = finish(start(docker_client, torch_image, ref_ckpt, ref_out))
    assert "resuming" not in ref_logs
    assert loss_rows(ref_out) == rows
    assert json.loads((ref_out / "metrics.json").read_text())["resumes"] == 0
    # the killed run's own log lines agree with the curve up to the kill
    for line in first_logs.splitlines():
        if line.startswith("step "):
            n, value = int(line.split()[1].split("/")[0]), float(line.split()[3])
            assert rows[n - 1][1] == pytest.approx(value, abs=1e-4)


def test_sigterm_writes_a_checkpoint_and_stops(
    docker_client: docker.DockerClient, torch_image: str, tmp_path: Path
) -> None:
    """How the agent stops a run early (time limit, drain): SIGTERM, then a grace. The script
    (PID 1, which ignores SIGTERM without a handler) saves its state at the step it reached."""
    ckpt, out = job_dirs(tmp_path / "stopped")
    container = start(docker_client, torch_image, ckpt, out, STEP_SLEEP_S="0.01")
    deadline = time.monotonic() + 30
    while not (ckpt / PROGRESS_FILE).is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    container.stop(timeout=10)  # SIGTERM, SIGKILL 10 s later
    assert container.wait(timeout=30)["StatusCode"] == 128 + 15
    logs = bytes(container.logs()).decode(errors="replace")
    container.remove(force=True)
    progress, why = parse_progress((ckpt / PROGRESS_FILE).read_bytes())
    assert progress is not None, why
    assert EVERY <= progress.step < STEPS
    assert f"stopped by signal 15 at step {progress.step}; checkpoint written" in logs, logs
    assert list(out.iterdir()) == []


# Writes /checkpoint/state.pt as the script would after one step, then breaks it with {BREAK}:
# a checkpoint that unpickles fine and would crash (or silently corrupt) training if it were
# taken as is.
FORGE = """
import json, sys, torch
sys.path.insert(0, "/opt/gridmarket")
import train_mlp as t
model = t.make_model()
opt = torch.optim.Adam(model.parameters(), lr=0.003)
model(torch.ones(1, t.FEATURES)).sum().backward()
opt.step()
state, rng = opt.state_dict(), torch.Generator().get_state()
{BREAK}
torch.save({
    "step": 1, "total": 100, "record_every": 1, "model": model.state_dict(),
    "optimizer": {"state": state["state"], "param_groups_json": json.dumps(state["param_groups"])},
    "batch_rng": rng, "torch_rng": torch.get_rng_state(),
    "history": torch.tensor([1.0], dtype=torch.float64), "resumed_at": [],
}, "/checkpoint/state.pt")
"""
BREAKS = {
    "shapes": 'state["state"][0]["exp_avg"] = torch.zeros(3)',  # Adam's moment, wrong shape
    "rng": "rng = torch.zeros(3, dtype=torch.uint8)",  # not a generator's state
}


@pytest.mark.parametrize(
    ("forged", "why"),
    [
        ("pickle", "state.pt does not load"),  # no code runs: weights_only refuses the global
        ("shapes", "optimizer.state.exp_avg: not a tensor of shape (64, 8)"),
        ("rng", "batch_rng: not a generator state"),
    ],
)
def test_a_broken_checkpoint_is_ignored(
    docker_client: docker.DockerClient, torch_image: str, tmp_path: Path, forged: str, why: str
) -> None:
    """A checkpoint is another node's output: a state.pt that is a malicious pickle, or one that
    loads but does not fit the model, is refused with the reason and training starts over."""
    ckpt, out = job_dirs(tmp_path / "broken")
    if forged == "pickle":
        (ckpt / "state.pt").write_bytes(b"\x80\x04cos\nsystem\n(S'touch /tmp/pwned'\ntR.")
    else:
        forge = FORGE.replace("{BREAK}", BREAKS[forged])
        finish(start(docker_client, torch_image, ckpt, out, ["python3", "-c", forge]))
    (ckpt / PROGRESS_FILE).write_text('{"step": 300, "total": 400}')
    logs = finish(start(docker_client, torch_image, ckpt, out, TRAIN_STEPS="100"))
    assert f"ignoring the checkpoint in /checkpoint: {why}" in logs, logs
    assert "resuming" not in logs
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 100 and metrics["resumes"] == 0
    assert TRAIN_SCRIPT_IN_IMAGE in load_job_file(JOB_FILE).spec["command"]
