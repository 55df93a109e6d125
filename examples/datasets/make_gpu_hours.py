"""Regenerate examples/datasets/gpu-hours/data.csv: a synthetic log of GPU-hours sold on a grid.

Synthetic, from a fixed seed, so the demo's outputs are the same on every machine: one row per
rented hour with the GPU tier, the region, the hours and the price paid in gwei per GPU-hour
(the tier's relative price times a region multiplier, with noise).

    python examples/datasets/make_gpu_hours.py
"""

from __future__ import annotations

import random
from pathlib import Path

from gridmarket.tiers import REGIONS, TIERS

OUT = Path(__file__).resolve().parent / "gpu-hours" / "data.csv"
TIER_KEYS = ["rtx-4090", "rtx-3090", "rtx-4070", "rtx-3060", "a100-80gb", "h100-sxm", "cpu"]


def main() -> None:
    rng = random.Random(20261122)  # noqa: S311 - reproducible sample data, not security
    keys = [k for k in TIER_KEYS if k in TIERS]
    rows = ["tier,region,hours,price_gwei_per_hour"]
    for _ in range(400):
        tier = TIERS[rng.choice(keys)]
        region = REGIONS[rng.choice(sorted(REGIONS))]
        hours = rng.randint(1, 12)
        price = 100_000 * tier.price_multiplier * region.multiplier * rng.uniform(0.85, 1.15)
        rows.append(f"{tier.key},{region.code},{hours},{round(price)}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(rows) + "\n")
    print(f"wrote {len(rows) - 1} rows to {OUT}")


if __name__ == "__main__":
    main()
