"""Start the local grid and leave it running for a person to use; stop it again.

    make up      # python scripts/grid.py up   (returns once everything is ready)
    make down    # python scripts/grid.py down

``up`` starts the same stack as ``make demo`` (anvil + escrow, js-ipfs, dockerd when it can run,
the scheduler, the web front end when installed, three agents) in a background process, waits
until it is ready, and prints where everything is (also in ``.run/grid/grid.json``). ``down``
stops that process, which stops every part. Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORK = ROOT / ".run" / "grid"
STATE = WORK / "grid.json"
PIDFILE = WORK / "grid.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def serve(agents: int) -> int:
    """The background process: run the grid until SIGTERM."""
    from devstack.grid import run_grid

    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    with run_grid(WORK, agents=agents, on_step=lambda s: print(f"start: {s}", flush=True)) as grid:
        info = grid.describe()
        info["accounts"] = {
            "submitters": [a.address for a in grid.submitters],
            "providers": [a.address for a in grid.providers[: len(grid.agents)]],
            "note": "anvil dev accounts (well-known keys): for the devnet only",
        }
        STATE.write_text(json.dumps(info, indent=2))
        print("ready", flush=True)
        while not stop:
            time.sleep(0.5)
    STATE.unlink(missing_ok=True)
    return 0


def up(agents: int, timeout: float) -> int:
    if PIDFILE.exists() and _alive(int(PIDFILE.read_text())):
        print(f"the grid is already up (pid {PIDFILE.read_text()}): {STATE}")
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    STATE.unlink(missing_ok=True)
    log = (WORK / "grid.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, __file__, "serve", "--agents", str(agents)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=ROOT,
    )
    PIDFILE.write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if STATE.exists():
            print(STATE.read_text())
            print(f"the grid is up; logs under {WORK}; stop it with `make down`")
            return 0
        if proc.poll() is not None:
            print(f"the grid exited with {proc.returncode}; see {WORK / 'grid.log'}")
            return 1
        time.sleep(0.5)
    print(f"the grid was not ready in {timeout:.0f} s; see {WORK / 'grid.log'}")
    return 1


def down(timeout: float = 60) -> int:
    if not PIDFILE.exists():
        print("the grid is not running")
        return 0
    pid = int(PIDFILE.read_text())
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    PIDFILE.unlink(missing_ok=True)
    STATE.unlink(missing_ok=True)
    print("the grid is down")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("up", "serve"):
        p = sub.add_parser(name)
        p.add_argument("--agents", type=int, default=3)
        p.add_argument("--timeout", type=float, default=180)
    sub.add_parser("down")
    args = ap.parse_args()
    if args.cmd == "up":
        return up(args.agents, args.timeout)
    if args.cmd == "serve":
        return serve(args.agents)
    return down()


if __name__ == "__main__":
    sys.exit(main())
