"""What sets the price of a GPU-hour? A least-squares fit over the GPU-hours dataset.

Reads ``/input/data.csv`` (examples/datasets/gpu-hours: ``tier,region,hours,price_gwei_per_hour``,
one row per sale) and fits, with numpy's least squares, the log-linear model

    log(price) = a[tier] + b[region] + noise,    b[reference region] = 0

so ``exp(a[tier])`` is the fitted price of a GPU-hour of that tier in the reference region (the
first region by name) and ``exp(b[region])`` is a region's price factor against it. Writes
``/output/result.json`` (the fitted prices and factors, R^2 and the residual spread on the log
scale, GPU-hours and revenue per tier) and ``/output/plot.svg`` (observed against fitted price per
sale, log axes, one colour per tier), an SVG written by hand: the image holds python3 and numpy
only. Same input, same bytes out: numbers are rounded to 6 significant digits, keys sorted.

Runs in the ``gridmarket/python-numpy:test`` image (devstack/images.py); elsewhere:

    python3 examples/python/hours_regression.py [INPUT_CSV [OUTPUT_DIR]]
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
from numpy.typing import NDArray

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def sig(x: float, digits: int = 6) -> float:
    """``x`` rounded to ``digits`` significant digits (stable JSON across BLAS builds)."""
    return float(f"{x:.{digits}g}")


def read_rows(path: Path) -> list[tuple[str, str, int, int]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        want = {"tier", "region", "hours", "price_gwei_per_hour"}
        if not want <= set(reader.fieldnames or ()):
            raise SystemExit(f"{path}: need columns {sorted(want)}, got {reader.fieldnames}")
        return [
            (r["tier"], r["region"], int(r["hours"]), int(r["price_gwei_per_hour"])) for r in reader
        ]


Points = tuple[list[str], NDArray[np.int_], NDArray[np.float64], NDArray[np.float64]]


def fit(rows: list[tuple[str, str, int, int]]) -> tuple[dict[str, object], Points]:
    """The fit's summary (result.json), and per sale (tiers, tier index, observed, fitted)."""
    tiers = sorted({r[0] for r in rows})
    regions = sorted({r[1] for r in rows})
    ref = regions[0]
    n, k = len(rows), len(tiers) + len(regions) - 1
    if n <= k:
        raise SystemExit(f"{n} rows cannot fit {k} coefficients")
    x = np.zeros((n, k))
    for i, (tier, region, _, _) in enumerate(rows):
        x[i, tiers.index(tier)] = 1.0
        if region != ref:
            x[i, len(tiers) + regions.index(region) - 1] = 1.0
    price = np.array([r[3] for r in rows], dtype=float)
    hours = np.array([r[2] for r in rows], dtype=float)
    y = np.log(price)
    coef, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    if rank < k:
        raise SystemExit(f"the design matrix has rank {rank} < {k}: some tier or region is aliased")
    fitted = x @ coef
    resid = y - fitted
    ss_res = float(resid @ resid)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    tier_of = np.array([tiers.index(r[0]) for r in rows])
    per_tier = {}
    for j, tier in enumerate(tiers):
        sel = tier_of == j
        per_tier[tier] = {
            "sales": int(sel.sum()),
            "gpu_hours": int(hours[sel].sum()),
            "revenue_gwei": int((hours[sel] * price[sel]).sum()),
            "fitted_price_gwei_per_hour": sig(math.exp(coef[j])),
        }
    summary: dict[str, object] = {
        "model": "log(price_gwei_per_hour) = a[tier] + b[region] (numpy.linalg.lstsq)",
        "rows": n,
        "coefficients": k,
        "reference_region": ref,
        "tiers": per_tier,
        "region_factor": {ref: 1.0}
        | {r: sig(math.exp(coef[len(tiers) + i])) for i, r in enumerate(regions[1:])},
        "r_squared_log": sig(1.0 - ss_res / ss_tot),
        "residual_std_log": sig(math.sqrt(ss_res / (n - k))),
    }
    return summary, (tiers, tier_of, price, np.exp(fitted))


def el(tag: str, text: str | None = None, **attrs: object) -> str:
    """One SVG element; ``stroke_dasharray=...`` is written ``stroke-dasharray="..."``."""
    parts = [tag]
    for key, value in attrs.items():
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        parts.append(f'{key.rstrip("_").replace("_", "-")}="{escape(shown, {chr(34): "&quot;"})}"')
    head = " ".join(parts)
    return f"<{head}/>" if text is None else f"<{head}>{escape(text)}</{tag}>"


def svg_plot(
    tiers: list[str],
    tier_of: NDArray[np.int_],
    observed: NDArray[np.float64],
    fitted: NDArray[np.float64],
) -> str:
    """Observed against fitted price (log-log scatter, the y = x line, a legend) as SVG text."""
    w, h, left, right, top, bottom = 640, 480, 70, 150, 40, 50
    lo = math.floor(math.log10(min(observed.min(), fitted.min())) * 4) / 4
    hi = math.ceil(math.log10(max(observed.max(), fitted.max())) * 4) / 4

    def px(v: float) -> float:
        return left + (math.log10(v) - lo) / (hi - lo) * (w - left - right)

    def py(v: float) -> float:
        return h - bottom - (math.log10(v) - lo) / (hi - lo) * (h - top - bottom)

    x0, x1, y0, y1 = left, w - right, h - bottom, top
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
        el("rect", width=w, height=h, fill="white"),
        el(
            "text",
            "Price per GPU-hour: observed vs fitted (tier + region model, log axes)",
            x=w // 2,
            y=20,
            text_anchor="middle",
            font_size=14,
        ),
        el("rect", x=x0, y=y1, width=x1 - x0, height=y0 - y1, fill="none", stroke="#333"),
    ]
    decade = math.floor(lo)
    while decade <= hi:
        for m in (1, 2, 5):
            v = m * 10.0**decade
            if lo <= math.log10(v) <= hi:
                label = f"{v:,.0f}"
                out.append(el("line", x1=px(v), y1=y0, x2=px(v), y2=y1, stroke="#eee"))
                out.append(el("line", x1=x0, y1=py(v), x2=x1, y2=py(v), stroke="#eee"))
                out.append(el("text", label, x=px(v), y=y0 + 15, text_anchor="middle"))
                out.append(el("text", label, x=x0 - 5, y=py(v) + 4, text_anchor="end"))
        decade += 1
    a, b = 10.0**lo, 10.0**hi
    out.append(el("line", x1=px(a), y1=py(a), x2=px(b), y2=py(b), stroke="#999",
                  stroke_dasharray="4 3"))  # fmt: skip
    for t, f, o in zip(tier_of.tolist(), fitted.tolist(), observed.tolist(), strict=True):
        colour = COLOURS[t % len(COLOURS)]
        out.append(el("circle", cx=px(f), cy=py(o), r=2.5, fill=colour, fill_opacity=0.7))
    out.append(el("text", "fitted (gwei)", x=(x0 + x1) // 2, y=h - 12, text_anchor="middle"))
    mid = (y0 + y1) // 2
    out.append(el("text", "observed (gwei)", x=16, y=mid, text_anchor="middle",
                  transform=f"rotate(-90 16 {mid})"))  # fmt: skip
    for j, tier in enumerate(tiers):
        y = top + 10 + 18 * j
        out.append(el("circle", cx=x1 + 18, cy=y, r=4, fill=COLOURS[j % len(COLOURS)]))
        out.append(el("text", tier, x=x1 + 28, y=y + 4))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    src = Path(argv[1]) if len(argv) > 1 else Path("/input/data.csv")
    dst = Path(argv[2]) if len(argv) > 2 else Path("/output")
    result, points = fit(read_rows(src))
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    (dst / "plot.svg").write_text(svg_plot(*points))
    print(
        f"{result['rows']} rows, R^2 (log) {result['r_squared_log']}, "
        f"residual std (log) {result['residual_std_log']}; wrote {dst}/result.json, {dst}/plot.svg"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
