"""One bench, two commits, run in turn: A B A B ... so both see the same machine.

This 2-core VM is noisy: the same bench run twice back to back can differ by 1.5x
(docs/platform.md), so a before/after figure is only honest when the two were measured side by
side. This script checks out each commit into a worktree of its own (``git worktree add``
under a temporary folder, with this checkout's ``.venv`` and ``node_modules`` linked in), then
runs the bench command in each, alternating, ``--rounds`` times, and prints the lines of the
bench's output that match ``--keep`` for each run, with the load average before it. The worktrees
are removed at the end.

    python bench/interleave.py --a e503158 --b HEAD --rounds 3 -- \\
        bench/claims.py --jobs 1000 --no-peer --db sqlite

It measures whatever the bench measures (each bench's docstring says which path); it adds
nothing but the alternation. The commits must both have the bench and take its arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _worktree(commit: str, where: Path) -> Path:
    sha = _git("rev-parse", "--verify", f"{commit}^{{commit}}")
    path = where / sha[:12]
    _git("worktree", "add", "--detach", "-q", str(path), sha)
    for shared in (".venv", "node_modules"):
        if (ROOT / shared).exists():
            (path / shared).symlink_to(ROOT / shared)
    return path


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--a", default="HEAD~1", help="the first commit (default HEAD~1)")
    ap.add_argument("--b", default="HEAD", help="the second commit (default HEAD)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each (default 3)")
    ap.add_argument(
        "--keep",
        default=r"^ours, |claims/s|^who ",
        help="regular expression of the output lines to print (default: the claims table)",
    )
    ap.add_argument("--timeout", type=float, default=1200, help="seconds a run may take")
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- then the bench and its arguments")
    args = ap.parse_args()
    bench = [a for a in args.bench if a != "--"]
    if not bench or args.rounds < 1:
        ap.error("give a bench after --, e.g. -- bench/claims.py --jobs 1000")
    keep = re.compile(args.keep)
    env_path = os.pathsep.join([str(ROOT / "node_modules/.bin"), str(ROOT / ".venv/bin")])
    with tempfile.TemporaryDirectory(prefix="interleave-") as tmp:
        trees: dict[str, Path] = {}
        try:
            for name, commit in (("A", args.a), ("B", args.b)):
                trees[name] = _worktree(commit, Path(tmp))
                print(f"{name} = {commit} ({trees[name].name})", flush=True)
            for r in range(1, args.rounds + 1):
                for name, tree in trees.items():
                    env = dict(os.environ)
                    env["PYTHONPATH"] = str(tree)
                    env["PATH"] = env_path + os.pathsep + env.get("PATH", "")
                    env.setdefault("SOLCX_BINARY_PATH", str(ROOT / "tools/solc"))
                    before = _load()
                    t0 = time.monotonic()
                    done = subprocess.run(
                        [sys.executable, *bench],
                        cwd=tree,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=args.timeout,
                        check=False,
                    )
                    took = time.monotonic() - t0
                    code = done.returncode
                    print(f"--- round {r}, {name}: load {before}, {took:.0f} s, exit {code}")
                    lines = [ln for ln in done.stdout.splitlines() if keep.search(ln)]
                    for ln in (
                        lines or done.stdout.splitlines()[-5:] + done.stderr.splitlines()[-5:]
                    ):
                        print(ln, flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    check=False,
                    capture_output=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
