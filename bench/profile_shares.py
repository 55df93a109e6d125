"""Where a replica's time goes, from a py-spy profile in collapsed-stack form.

    BENCH_PROFILE_RAW=1 python bench/claims.py --jobs 1000 --no-peer --profile /tmp/prof
    python bench/profile_shares.py /tmp/prof/claims-sqlite-0.txt [--top 40] [--under FRAME]

Prints, for every frame (function and file, lines merged), the share of the sampled stacks that
pass through it (inclusive) and the share where it is the innermost frame (self). Shares of
nested frames overlap. ``--under FRAME`` keeps only the stacks through a frame whose text
contains FRAME and prints the frames called directly below it.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r" \(([^()]*):\d+\)$")


def _frame(f: str) -> str:
    """``func (file.py:123)`` -> ``func (file.py)``: one row per function, whatever line."""
    return _LINE.sub(r" (\1)", f.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("profile", type=Path, help="py-spy --format raw output")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--under", help="only stacks through this frame; print its direct callees")
    args = ap.parse_args()
    incl: Counter[str] = Counter()
    own: Counter[str] = Counter()
    below: Counter[str] = Counter()
    total = 0
    for line in args.profile.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")]
        if args.under:
            at = next((i for i, f in enumerate(frames) if args.under in f), None)
            if at is None:
                continue
            below[frames[at + 1] if at + 1 < len(frames) else "(itself)"] += int(n)
        total += int(n)
        for f in set(frames):
            incl[f] += int(n)
        own[frames[-1]] += int(n)
    if not total:
        where = f" under {args.under!r}" if args.under else ""
        raise SystemExit(f"no samples in {args.profile}{where}")
    print(f"{total} samples" + (f" through {args.under!r}" if args.under else ""))
    if args.under:
        print("\ncalled directly below it:")
        for f, n in below.most_common(args.top):
            print(f"{100 * n / total:6.1f}%  {f}")
    print("\ninclusive   self  frame")
    for f, n in incl.most_common(args.top):
        print(f"{100 * n / total:8.1f}% {100 * own[f] / total:6.1f}%  {f}")


if __name__ == "__main__":
    main()
