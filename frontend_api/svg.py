"""Charts drawn on the server as inline SVG: no JavaScript, no chart library, prints well.

Every function returns :class:`markupsafe.Markup` built from numbers and escaped labels only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from markupsafe import Markup, escape

from .format import eth
from .records import Bucket

if TYPE_CHECKING:
    from .currency import Currency

STATUS_COLORS = {
    "busy": "#2563eb",
    "online": "#16a34a",
    "offline": "#9ca3af",
    "excluded": "#dc2626",
}
"""Node colours on the fleet grid (``busy`` is online with a job running)."""


def _label_time(ts: int, width: int) -> str:
    dt = datetime.fromtimestamp(ts, UTC)
    return dt.strftime("%H:%M" if width < 86400 else "%b %d")


def totals_chart(
    buckets: Sequence[Bucket],
    *,
    width: int = 760,
    height: int = 240,
    currency: Currency | None = None,
) -> Markup:
    """Payouts per time bucket (bars: provider share, fee stacked on top) and the running total
    paid to providers (line, right-hand scale), all in one ``currency`` (default ETH)."""
    money: Callable[[int], str] = currency.fmt if currency is not None else eth
    if not buckets:
        return Markup(  # noqa: S704 - numbers and escape()d labels only
            f'<svg class="chart" viewBox="0 0 {width} 60" role="img" '
            'aria-label="no payouts yet"><text x="12" y="34" class="muted">'
            "No payouts yet.</text></svg>"
        )
    left, right, top, bottom = 84, 84, 30, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max(b.amount + b.fee for b in buckets) or 1
    total = buckets[-1].cumulative_amount or 1
    n = len(buckets)
    slot = plot_w / n
    bar_w = min(36.0, max(2.0, slot * 0.7))
    parts: list[str] = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="payouts over time{escape(" in " + currency.symbol) if currency else ""}">'
    ]
    for frac in (0, 0.5, 1):
        y = top + plot_h * (1 - frac)
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="axis">'
            f"{escape(money(int(peak * frac)))}</text>"
        )
        parts.append(
            f'<text x="{left + plot_w + 6}" y="{y + 4:.1f}" class="axis line-axis">'
            f"{escape(money(int(total * frac)))}</text>"
        )
    step = [f"M{left},{top + plot_h:.1f}"]  # running total: a step at each bucket's centre
    for i, b in enumerate(buckets):
        x = left + i * slot + (slot - bar_w) / 2
        h_amount = plot_h * b.amount / peak
        h_fee = plot_h * b.fee / peak
        y_amount = top + plot_h - h_amount
        title = (
            f"{_label_time(b.start, b.width)}: {b.count} payout(s), {money(b.amount)} to "
            f"providers, {money(b.fee)} fees"
        )
        if b.count:
            parts.append(
                f'<rect x="{x:.1f}" y="{y_amount:.1f}" width="{bar_w:.1f}" '
                f'height="{h_amount:.1f}" class="bar"><title>{escape(title)}</title></rect>'
            )
            parts.append(
                f'<rect x="{x:.1f}" y="{y_amount - h_fee:.1f}" width="{bar_w:.1f}" '
                f'height="{h_fee:.1f}" class="bar-fee"><title>{escape(title)}</title></rect>'
            )
        cx = left + i * slot + slot / 2
        cy = top + plot_h * (1 - b.cumulative_amount / total)
        step.append(f"H{cx:.1f}V{cy:.1f}")
    step.append(f"H{left + plot_w}")
    parts.append(f'<path d="{"".join(step)}" class="line"/>')
    every = max(1, n // 6)
    for i in range(0, n, every):
        cx = left + i * slot + slot / 2
        parts.append(
            f'<text x="{cx:.1f}" y="{height - 6}" text-anchor="middle" class="axis">'
            f"{escape(_label_time(buckets[i].start, buckets[i].width))}</text>"
        )
    parts.append(
        f'<g class="legend" transform="translate({left},12)">'
        '<rect x="0" y="-8" width="10" height="8" class="bar"/>'
        '<text x="14" y="0">to providers</text>'
        '<rect x="100" y="-8" width="10" height="8" class="bar-fee"/>'
        '<text x="114" y="0">fees</text>'
        '<line x1="160" x2="176" y1="-4" y2="-4" class="line"/>'
        '<text x="180" y="0">total paid (right scale)</text></g>'
    )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - numbers and escape()d labels only


def node_state(node: dict[str, Any]) -> str:
    """``busy``, ``online``, ``offline`` or ``excluded`` (see :data:`STATUS_COLORS`)."""
    if node.get("status") != "online":
        return "offline"
    if node.get("excluded"):
        return "excluded"
    return "busy" if int(node.get("running") or 0) > 0 else "online"


def fleet_grid(nodes: Sequence[dict[str, Any]], *, cell: int = 14, max_width: int = 760) -> Markup:
    """The grid as a picture: one row per GPU tier, one column per region, one square per node
    coloured by its state; hover a square for the node."""
    if not nodes:
        return Markup(  # noqa: S704 - numbers and escape()d labels only
            f'<svg class="chart" viewBox="0 0 {max_width} 60" role="img" '
            'aria-label="no nodes"><text x="12" y="34" class="muted">'
            "No node has registered yet.</text></svg>"
        )
    tiers = sorted({str(n.get("tier")) for n in nodes}, key=lambda t: (t != "cpu", t))
    regions = sorted({str(n.get("region")) for n in nodes})
    per_cell: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for n in nodes:
        per_cell.setdefault((str(n.get("tier")), str(n.get("region"))), []).append(n)
    label_w, head_h, gap = 130, 26, 4
    cols_per_cell = max(1, min(8, max(len(v) for v in per_cell.values())))
    col_w = max(70, cols_per_cell * (cell + gap) + 12)
    rows_per_tier = {
        t: max(
            1,
            max(
                (len(per_cell.get((t, r), [])) + cols_per_cell - 1) // cols_per_cell
                for r in regions
            ),
        )
        for t in tiers
    }
    width = max(label_w + col_w * len(regions) + 10, 380)
    height = head_h + sum(rows_per_tier[t] * (cell + gap) + 12 for t in tiers) + 28
    parts = [
        f'<svg class="chart fleet" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" '
        'aria-label="nodes by tier, region and status">'
    ]
    for j, region in enumerate(regions):
        x = label_w + j * col_w + 6
        parts.append(f'<text x="{x}" y="16" class="axis head">{escape(region)}</text>')
    y = head_h
    for tier in tiers:
        band = rows_per_tier[tier] * (cell + gap) + 12
        parts.append(f'<line x1="0" x2="{width}" y1="{y}" y2="{y}" class="grid"/>')
        parts.append(f'<text x="4" y="{y + 6 + cell - 2}" class="axis head">{escape(tier)}</text>')
        for j, region in enumerate(regions):
            for k, node in enumerate(per_cell.get((tier, region), [])):
                cx = label_w + j * col_w + 6 + (k % cols_per_cell) * (cell + gap)
                cy = y + 6 + (k // cols_per_cell) * (cell + gap)
                state = node_state(node)
                title = (
                    f"{node.get('name')} ({node.get('node_id')}): {state}, "
                    f"{node.get('running', 0)}/{node.get('slots', 1)} slots, "
                    f"reputation {node.get('reputation')}"
                )
                parts.append(
                    f'<a href="/address/{escape(str(node.get("wallet")))}">'
                    f'<rect x="{cx}" y="{cy}" width="{cell}" height="{cell}" rx="3" '
                    f'fill="{STATUS_COLORS[state]}" class="node node-{state}">'
                    f"<title>{escape(title)}</title></rect></a>"
                )
        y += band
    lx = 4
    for state, colour in STATUS_COLORS.items():
        parts.append(
            f'<rect x="{lx}" y="{height - 18}" width="10" height="10" rx="2" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="{height - 9}" class="axis">{state}</text>'
        )
        lx += 90
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - numbers and escape()d labels only


def hbars(
    items: Sequence[tuple[str, int]], *, width: int = 360, bar_h: int = 16, unit: str = ""
) -> Markup:
    """Horizontal bars, one per (label, value), longest first as given."""
    if not items:
        return Markup("")
    peak = max(v for _, v in items) or 1
    label_w, gap = 110, 6
    height = len(items) * (bar_h + gap) + gap
    parts = [
        f'<svg class="chart bars" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img">'
    ]
    for i, (label, value) in enumerate(items):
        y = gap + i * (bar_h + gap)
        w = (width - label_w - 50) * value / peak
        parts.append(
            f'<text x="{label_w - 6}" y="{y + bar_h - 4}" text-anchor="end" class="axis">'
            f"{escape(label)}</text>"
            f'<rect x="{label_w}" y="{y}" width="{max(w, 1):.1f}" height="{bar_h}" rx="2" '
            f'class="bar"/>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + bar_h - 4}" class="axis">'
            f"{value}{escape(unit)}</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - numbers and escape()d labels only
