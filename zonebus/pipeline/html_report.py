"""The cost report as one self-contained HTML page: matplotlib charts embedded as base64 PNGs, plus tables.

Charts: the zone-pair matrix (GB from zone to zone), cost over time (actual vs random queue routing), and the
top subjects by cost. Uses matplotlib's object API (no pyplot), so no display or global state is involved.
"""

from __future__ import annotations

import base64
import html
import io
from datetime import datetime, timedelta
from typing import Any

from matplotlib.figure import Figure

from zonebus.pipeline import transforms as T

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.kpi { display: inline-block; margin: 0 2em 1em 0; } .kpi b { display: block; font-size: 1.4em; }
img { max-width: 100%; }
"""


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def byte_unit(largest: float) -> tuple[float, str]:
    """A divisor and unit name that keep `largest` readable."""
    for div, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if largest >= div:
            return div, name
    return 1.0, "bytes"


def zone_matrix_chart(pairs: list[dict[str, Any]]) -> str:
    zones = sorted({p["src_zone"] for p in pairs} | {p["dst_zone"] for p in pairs})
    index = {z: i for i, z in enumerate(zones)}
    n = len(zones)
    grid = [[0.0] * n for _ in range(n)]
    for p in pairs:
        grid[index[p["src_zone"]]][index[p["dst_zone"]]] += p["bytes"]
    div, unit = byte_unit(max((v for row in grid for v in row), default=0.0))
    grid = [[v / div for v in row] for row in grid]
    fig = Figure(figsize=(1.6 + 1.3 * n, 1.2 + 1.1 * n))
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="Blues")
    ax.set_xticks(range(n), labels=zones, rotation=30, ha="right")
    ax.set_yticks(range(n), labels=zones)
    ax.set_xlabel("to zone")
    ax.set_ylabel("from zone")
    ax.set_title(f"{unit} per zone pair (off-diagonal = cross-zone)")
    top = max((v for row in grid for v in row), default=0.0)
    for i in range(n):
        for j in range(n):
            color = "white" if top and grid[i][j] > top / 2 else "black"
            ax.text(j, i, f"{grid[i][j]:.3g}", ha="center", va="center", color=color, fontsize=9)
    fig.colorbar(image, ax=ax, label=unit)
    return _png(fig)


def cost_over_time_chart(hours: list[dict[str, Any]], queue_hours: list[dict[str, Any]], per_hour_random:
                         dict[datetime, float]) -> str:
    fig = Figure(figsize=(9, 3.2))
    ax = fig.subplots()
    xs = [h[T.HOUR] for h in hours]
    actual = [h[T.COST] for h in hours]
    ax.bar(xs, actual, width=timedelta(minutes=50), align="edge", color="#4878a8", label="actual")
    if queue_hours:
        counter = [c + per_hour_random.get(x, 0.0) for x, c in zip(xs, actual, strict=True)]
        mid = [x + timedelta(minutes=25) for x in xs]
        ax.plot(mid, counter, marker="o", ms=4, color="#d9822b", linestyle="--", label="random queue routing")
    if xs:
        ax.set_xlim(min(xs) - timedelta(minutes=30), max(xs) + timedelta(minutes=90))
    ax.set_ylabel("cross-zone cost per hour")
    ax.set_title("Cost over time (UTC hours)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.autofmt_xdate()
    return _png(fig)


def top_subjects_chart(top: list[dict[str, Any]]) -> str:
    rows = list(reversed(top[:15]))
    fig = Figure(figsize=(9, 0.8 + 0.35 * max(1, len(rows))))
    ax = fig.subplots()
    by_cost = any(r[T.COST] for r in rows)
    values = [r[T.COST] if by_cost else r[T.CROSS_BYTES] / 1e9 for r in rows]
    labels = [f"{r['subject_prefix']} ({r['account']})" for r in rows]
    ax.barh(range(len(rows)), values, color="#4878a8")
    ax.set_yticks(range(len(rows)), labels=labels)
    ax.set_xlabel("cross-zone cost" if by_cost else "cross-zone GB")
    ax.set_title("Top subjects")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def _table(headers: list[str], rows: list[list[Any]], left: int = 0) -> str:
    def cell(tag: str, i: int, v: Any) -> str:
        cls = ' class="l"' if i < left else ""
        return f"<{tag}{cls}>{html.escape(str(v))}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_report(
    summary: dict[str, Any],
    pairs: list[dict[str, Any]],
    hours: list[dict[str, Any]],
    queue_hours: list[dict[str, Any]],
    top: list[dict[str, Any]],
) -> str:
    cur = html.escape(summary["prices"]["currency"])
    per_byte = summary["prices"]["cross_zone_per_gb_each_side"] * summary["prices"]["sides_charged"] / (
        summary["prices"]["bytes_per_gb"]
    )
    per_hour_random = {
        q[T.HOUR]: (q[T.RANDOM_CROSS_BYTES] - q[T.CROSS_BYTES]) * per_byte for q in queue_hours
    }
    kpis = [
        ("total", f"{summary['total_bytes'] / 1e9:.4f} GB"),
        ("cross-zone", f"{summary['cross_zone_bytes'] / 1e9:.4f} GB ({summary['cross_zone_fraction']:.1%})"),
        ("cost", f"{summary['cost_usd']:.4f} {cur}"),
        ("random queue routing", f"{summary['counterfactual_cost_usd']:.4f} {cur}"),
        ("saved", f"{summary['saved_usd']:.4f} {cur}"),
    ]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>zonebus cost report</title>",
        f"<style>{CSS}</style></head><body><h1>zonebus cross-zone cost report</h1>",
        f"<p>Ledger <code>{html.escape(str(summary['ledger']))}</code>, {summary['ledger_rows']:,} rows, "
        f"{html.escape(str(summary['first_hour']))} to {html.escape(str(summary['last_hour']))} (UTC). "
        f"Prices: {html.escape(summary['prices']['provider'] or summary['prices']['source'])}, "
        f"{summary['prices']['cross_zone_per_gb_each_side']} {cur}/GB x {summary['prices']['sides_charged']} "
        "side(s).</p>",
        "".join(f"<div class='kpi'>{html.escape(k)}<b>{v}</b></div>" for k, v in kpis),
    ]
    if pairs:
        parts += ["<h2>Zone pairs</h2>", f"<img alt='zone-pair matrix' src='{zone_matrix_chart(pairs)}'>"]
        parts.append(_table(
            ["from zone", "to zone", "link", "messages", "bytes", "cross-zone bytes", f"cost {cur}"],
            [[p["src_zone"], p["dst_zone"], p["link_kind"], f"{p['msgs']:,}", f"{p['bytes']:,}",
              f"{p[T.CROSS_BYTES]:,}", f"{p[T.COST]:.6f}"] for p in pairs], left=3))
    if hours:
        parts += ["<h2>Cost over time</h2>",
                  f"<img alt='cost over time' src='{cost_over_time_chart(hours, queue_hours, per_hour_random)}'>"]
    if top:
        parts += ["<h2>Top subjects</h2>", f"<img alt='top subjects' src='{top_subjects_chart(top)}'>"]
        parts.append(_table(
            ["account", "subject prefix", "messages", "bytes", "cross-zone bytes", f"cost {cur}"],
            [[r["account"], r["subject_prefix"], f"{r['msgs']:,}", f"{r['bytes']:,}", f"{r[T.CROSS_BYTES]:,}",
              f"{r[T.COST]:.6f}"] for r in top], left=2))
    q = summary["queue_routing"]
    parts += [
        "<h2>Queue routing</h2>",
        "<p>Random routing (stock NATS, weighted by member count) would have sent a message outside the "
        "publisher's zone with probability weight_outside / (weight_in_zone + weight_outside).</p>",
        _table(["", "messages", "cross-zone messages", "cross-zone bytes", f"cost {cur}"], [
            ["actual", f"{q['msgs']:,}", f"{q['cross_zone_msgs']:,}", f"{q['cross_zone_bytes']:,}",
             f"{q['cost_usd']:.6f}"],
            ["random routing", f"{q['msgs']:,}", f"{q['random_cross_zone_msgs']:,.1f}",
             f"{q['random_cross_zone_bytes']:,.0f}", f"{q['random_cost_usd']:.6f}"],
        ], left=1),
        "</body></html>",
    ]
    return "\n".join(parts)
