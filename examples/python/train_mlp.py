"""Train a small PyTorch MLP regression, checkpointing as it goes: GridMarket's training example.

The dataset is generated inside the script from a seed (``DATA_SEED``), so the job needs no
input: 4,096 points x in [-1, 1]^8 and y = sin(3 x0) + x1 x2 - 0.5 x3^2 + 0.3 cos(2 x4) + noise.
The model is an 8-64-64-1 MLP (Tanh) trained with Adam on minibatches of 128 drawn from its own
seeded generator, on CUDA when ``torch.cuda.is_available()``, else on the CPU.

Checkpointing (the contract in docs/submitter.md, "Writing a checkpointing job"): every
``CHECKPOINT_EVERY`` steps, at the end, and when SIGTERM stops it, the script writes
``state.pt`` (model, optimizer, step, the batch generator's and torch's RNG state, the loss
history so far) to ``$GRIDMARKET_CHECKPOINT_DIR`` (default ``/checkpoint``) under a temporary
name and renames it, then ``progress.json`` (``{"step", "total", "metrics": {"loss"}}``) the
same way, last. On start it resumes from ``state.pt`` when one is there (``resuming from step
N``), so a run killed at any moment continues from its last checkpoint and its loss curve goes on
exactly as an uninterrupted run's would. A checkpoint is another node's output: it is read
with ``torch.load(weights_only=True)`` (tensors and plain containers only, no pickled code),
size-capped and checked; one that does not fit is ignored with a message and training starts over.

At the end it writes to ``OUTPUT_DIR`` (default ``/output``): ``model.pt`` (the state dict),
``metrics.json``, ``loss.csv`` (step,loss for every recorded step, across resumes) and
``loss.svg`` (the loss curve, resumes marked; written by hand: no matplotlib in the image).

Environment: ``TRAIN_STEPS`` (default 3000), ``CHECKPOINT_EVERY`` (200), ``LOG_EVERY`` (100),
``STEP_SLEEP_S`` (0: a pause per step, to make a short run last), ``DATA_SEED`` (29),
``LEARNING_RATE`` (0.003), ``TRAIN_THREADS`` (1: CPU threads).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

STATE_FILE = "state.pt"
PROGRESS_FILE = "progress.json"
MAX_STATE_BYTES = 64 * 1024 * 1024  # a checkpoint of this model is ~60 KB plus the history
MAX_STEPS = 10_000_000
MAX_RESUMES = 10_000
MAX_HISTORY = 20_000  # loss values kept (one every ceil(total / MAX_HISTORY) steps)
FEATURES, HIDDEN, SAMPLES, BATCH = 8, 64, 4096, 128


def env_int(name: str, default: int, low: int, high: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        sys.exit(f"{name} must be a whole number, not {raw[:40]!r}")
    if not low <= value <= high:
        sys.exit(f"{name} must be between {low} and {high}, not {value}")
    return value


def env_float(name: str, default: float, low: float, high: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        sys.exit(f"{name} must be a number, not {raw[:40]!r}")
    if not (math.isfinite(value) and low <= value <= high):
        sys.exit(f"{name} must be between {low} and {high}, not {value}")
    return value


def make_dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(SAMPLES, FEATURES, generator=gen) * 2 - 1
    y = (
        torch.sin(3 * x[:, 0])
        + x[:, 1] * x[:, 2]
        - 0.5 * x[:, 3] ** 2
        + 0.3 * torch.cos(2 * x[:, 4])
        + 0.05 * torch.randn(SAMPLES, generator=gen)
    )
    return x, y.unsqueeze(1)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
        nn.Linear(HIDDEN, 1),
    )  # fmt: skip


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` under a temporary name, then rename it: a copy taken at any moment sees
    the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(ckpt: Path, state: dict[str, Any], step: int, total: int) -> None:
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    write_atomic(ckpt / STATE_FILE, buf.getvalue())
    history = state["history"]
    loss = float(history[-1]) if len(history) else None
    progress: dict[str, Any] = {"step": step, "total": total}
    if loss is not None and math.isfinite(loss):
        progress["metrics"] = {"loss": round(loss, 6)}
    write_atomic(ckpt / PROGRESS_FILE, json.dumps(progress).encode())  # last


def checked_groups(opt: torch.optim.Optimizer, text: str) -> list[dict[str, Any]]:
    """The optimizer's saved settings (JSON), if they have the keys and kinds of ``opt``'s."""
    fresh = opt.state_dict()["param_groups"]
    groups = json.loads(text)
    if not isinstance(groups, list) or len(groups) != len(fresh):
        raise ValueError(f"param_groups_json: not a list of {len(fresh)} group(s)")
    for group, like in zip(groups, fresh, strict=True):
        if not isinstance(group, dict) or set(group) != set(like):
            raise ValueError(f"param_groups_json: a group's keys are not {sorted(like)}")
        for key in ("lr", "eps", "weight_decay"):
            value = group[key]
            if not isinstance(value, int | float) or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"param_groups_json: {key} is not a number >= 0")
        betas = group["betas"]
        if not (isinstance(betas, list) and len(betas) == 2) or not all(
            isinstance(b, int | float) and 0 <= b < 1 for b in betas
        ):
            raise ValueError("param_groups_json: betas is not two numbers in [0, 1)")
        if group["params"] != like["params"]:
            raise ValueError(f"param_groups_json: params is not {like['params']}")
    return groups


def load_checkpoint(ckpt: Path, model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The saved state, loaded into ``model`` and ``opt``; ValueError saying what is wrong."""
    path = ckpt / STATE_FILE
    size = path.stat().st_size
    if size > MAX_STATE_BYTES:
        raise ValueError(f"{STATE_FILE} is {size} bytes, more than {MAX_STATE_BYTES}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or hostile file: any error pickle raises
        raise ValueError(f"{STATE_FILE} does not load: {str(exc)[:200]}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{STATE_FILE} is not a dict")
    step, every = state.get("step"), state.get("record_every")
    history, resumed = state.get("history"), state.get("resumed_at")
    if not isinstance(step, int) or not 0 <= step <= MAX_STEPS:
        raise ValueError(f"step: not a whole number from 0 to {MAX_STEPS}")
    if not isinstance(every, int) or not 1 <= every <= MAX_STEPS:
        raise ValueError(f"record_every: not a whole number from 1 to {MAX_STEPS}")
    if not isinstance(history, torch.Tensor) or history.dim() != 1:
        raise ValueError("history: not a 1-d tensor")
    if len(history) != step // every:
        raise ValueError(f"history: {len(history)} values for step {step} (one per {every})")
    if (
        not isinstance(resumed, list)
        or len(resumed) > MAX_RESUMES
        or not all(isinstance(s, int) and 0 <= s <= step for s in resumed)
    ):
        raise ValueError(f"resumed_at: not a list of at most {MAX_RESUMES} steps up to {step}")
    for key in ("batch_rng", "torch_rng"):
        value = state.get(key)
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
            raise ValueError(f"{key}: not a byte tensor")
        try:
            torch.Generator().set_state(value)  # a scratch generator: is it a valid state?
        except RuntimeError as exc:
            raise ValueError(f"{key}: not a generator state ({str(exc)[:120]})") from None
    try:
        model.load_state_dict(state["model"])
        saved = state["optimizer"]
        groups = saved["param_groups_json"]
        if not isinstance(groups, str) or len(groups) > 65536:
            raise ValueError("param_groups_json: not a string of at most 64 KiB")
        opt.load_state_dict({"state": saved["state"], "param_groups": checked_groups(opt, groups)})
    except (KeyError, RuntimeError, ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"model/optimizer: {str(exc)[:200]}") from None
    for param, moments in opt.state.items():  # Adam's moments must fit their parameter
        for key in ("exp_avg", "exp_avg_sq"):
            value = moments.get(key)
            if not isinstance(value, torch.Tensor) or value.shape != param.shape:
                raise ValueError(
                    f"optimizer.state.{key}: not a tensor of shape {tuple(param.shape)}"
                )
    return state


def svg_plot(steps: list[int], losses: list[float], resumed_at: list[int]) -> str:
    """The loss over the steps as a small SVG line chart, a log-scaled y axis, resumes dashed."""
    width, height, left, right, top, bottom = 640, 360, 64, 16, 28, 40
    finite = [(s, v) for s, v in zip(steps, losses, strict=True) if v > 0 and math.isfinite(v)]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">training loss (MSE, log scale) over '
        f"{steps[-1] if steps else 0} steps</text>",
    ]
    if finite:
        x0, x1 = 0, max(max(s for s, _ in finite), 1)
        lo = math.log10(min(v for _, v in finite))
        hi = math.log10(max(v for _, v in finite))
        lo, hi = math.floor(lo), max(math.ceil(hi), math.floor(lo) + 1)

        def px(s: float) -> float:
            return left + (s - x0) / (x1 - x0) * (width - left - right)

        def py(v: float) -> float:
            return top + (hi - math.log10(v)) / (hi - lo) * (height - top - bottom)

        for e in range(lo, hi + 1):
            y = py(10**e)
            parts.append(
                f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                f'stroke="#ddd"/><text x="{left - 6}" y="{y + 4:.1f}" '
                f'text-anchor="end">1e{e}</text>'
            )
        for i in range(5):
            s = round(x1 * i / 4)
            parts.append(
                f'<text x="{px(s):.1f}" y="{height - bottom + 16}" text-anchor="middle">{s}</text>'
            )
        parts.append(
            f'<text x="{(left + width - right) / 2:.0f}" y="{height - 6}" '
            'text-anchor="middle">step</text>'
        )
        for s in resumed_at:
            parts.append(
                f'<line x1="{px(s):.1f}" y1="{top}" x2="{px(s):.1f}" y2="{height - bottom}" '
                f'stroke="#c33" stroke-dasharray="4 3"/><text x="{px(s) + 3:.1f}" '
                f'y="{top + 10}" fill="#c33">resumed at {s}</text>'
            )
        stride = max(1, len(finite) // 2000)  # at most ~2,000 points in the line
        points = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in finite[::stride])
        parts.append(
            f'<polyline fill="none" stroke="#1f6feb" stroke-width="1.2" points="{points}"/>'
        )
    parts.append(
        f'<rect x="{left}" y="{top}" width="{width - left - right}" '
        f'height="{height - top - bottom}" fill="none" stroke="#888"/></svg>'
    )
    return "\n".join(parts) + "\n"


def main() -> int:
    total = env_int("TRAIN_STEPS", 3000, 1, MAX_STEPS)
    every = env_int("CHECKPOINT_EVERY", 200, 1, MAX_STEPS)
    log_every = env_int("LOG_EVERY", 100, 1, MAX_STEPS)
    pause = env_float("STEP_SLEEP_S", 0.0, 0.0, 60.0)
    seed = env_int("DATA_SEED", 29, 0, 2**31 - 1)
    lr = env_float("LEARNING_RATE", 0.003, 1e-6, 1.0)
    torch.set_num_threads(env_int("TRAIN_THREADS", 1, 1, 256))
    ckpt = Path(os.environ.get("GRIDMARKET_CHECKPOINT_DIR") or "/checkpoint")
    out = Path(os.environ.get("OUTPUT_DIR") or "/output")

    stop = {"signal": 0}

    def on_term(signum: int, _frame: object) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_term)  # PID 1 in a container: no handler, no SIGTERM

    if torch.cuda.is_available():
        device = torch.device("cuda")
        print(f"device: cuda ({torch.cuda.get_device_name(0)})", flush=True)
    else:
        device = torch.device("cpu")
        print(f"device: cpu ({torch.get_num_threads()} thread(s))", flush=True)

    torch.manual_seed(seed)
    x_all, y_all = make_dataset(seed)
    x_all, y_all = x_all.to(device), y_all.to(device)
    model = make_model().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    batches = torch.Generator().manual_seed(seed + 1)
    record_every = max(1, math.ceil(total / MAX_HISTORY))
    history: list[float] = []
    resumed_at: list[int] = []
    step = 0

    if (ckpt / STATE_FILE).is_file():
        try:
            state = load_checkpoint(ckpt, model, opt)
        except (OSError, ValueError) as exc:
            print(f"ignoring the checkpoint in {ckpt}: {exc}; starting from step 0", flush=True)
            torch.manual_seed(seed)  # the same start as a run that never had a checkpoint
            model = make_model().to(device)
            opt = torch.optim.Adam(model.parameters(), lr=lr)
        else:
            step, record_every = state["step"], state["record_every"]
            history = [float(v) for v in state["history"]]
            resumed_at = [*state["resumed_at"], step]
            batches.set_state(state["batch_rng"])
            torch.set_rng_state(state["torch_rng"])
            print(f"resuming from step {step}", flush=True)

    def snapshot() -> dict[str, Any]:
        return {
            "step": step,
            "total": total,
            "record_every": record_every,
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            # torch 1.13's weights-only loader reads no Python floats (the learning rate...):
            # the optimizer's settings travel as JSON, its tensors as tensors
            "optimizer": {
                "state": opt.state_dict()["state"],
                "param_groups_json": json.dumps(opt.state_dict()["param_groups"]),
            },
            "batch_rng": batches.get_state(),
            "torch_rng": torch.get_rng_state(),
            "history": torch.tensor(history, dtype=torch.float64),
            "resumed_at": resumed_at,
        }

    can_checkpoint = ckpt.is_dir() and os.access(ckpt, os.W_OK)
    if not can_checkpoint:
        print(f"{ckpt} is not a writable directory: not checkpointing", flush=True)
    loss_fn = nn.MSELoss()
    started = time.monotonic()
    while step < total and not stop["signal"]:
        idx = torch.randint(0, SAMPLES, (BATCH,), generator=batches).to(device)
        loss = loss_fn(model(x_all[idx]), y_all[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % record_every == 0:
            history.append(loss.item())
        if step % log_every == 0 or step == total:
            print(f"step {step}/{total} loss {loss.item():.4f}", flush=True)
        if can_checkpoint and step % every == 0 and step < total:
            save_checkpoint(ckpt, snapshot(), step, total)
        if pause:
            time.sleep(pause)
    if can_checkpoint:
        save_checkpoint(ckpt, snapshot(), step, total)
    if stop["signal"]:
        print(f"stopped by signal {stop['signal']} at step {step}; checkpoint written", flush=True)
        return 128 + stop["signal"]

    with torch.no_grad():
        full_loss = loss_fn(model(x_all), y_all).item()
    out.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, out / "model.pt")
    steps = [(i + 1) * record_every for i in range(len(history))]
    (out / "loss.csv").write_text(
        "step,loss\n" + "".join(f"{s},{v:.8g}\n" for s, v in zip(steps, history, strict=True))
    )
    (out / "loss.svg").write_text(svg_plot(steps, history, resumed_at))
    metrics = {
        "steps": step,
        "final_loss": history[-1] if history else None,
        "full_dataset_loss": full_loss,
        "device": device.type,
        "resumes": len(resumed_at),
        "resumed_at": resumed_at,
        "samples": SAMPLES,
        "seconds_this_run": round(time.monotonic() - started, 3),
        "torch": torch.__version__,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"done: {step} steps, loss {full_loss:.4f} on the whole dataset", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
