"""The cost report as one self-contained HTML page: matplotlib charts embedded as base64 PNGs, plus tables.

The page leads with the monthly projection at the rate the ledger observed, then the comparison with stock
NATS routing (the whole cross-zone bill both ways; one meaning, the same in the headline and in the queue
routing table). Charts: the zone-pair matrix, cross-zone cost over time (buckets follow the ledger's span),
and the top subjects by cost; a chart with nothing to show says why instead of drawing empty axes. Figures
use significant digits and scaling units (`zonebus.pipeline.units`). Uses matplotlib's object API (no
pyplot), so no display or global state is involved.
"""

from __future__ import annotations

import base64
import html
import io
from datetime import UTC, datetime, timedelta
from typing import Any

import matplotlib.dates as mdates
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from zonebus.pipeline import transforms as T
from zonebus.pipeline.units import byte_unit, count, duration, money, percent, sig, size, when
from zonebus.pipeline.wording import saving_sentence, transfers_sentence

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
p.lead { font-size: 1.15em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.kpi { display: inline-block; margin: 0 2em 1em 0; vertical-align: top; }
.kpi b { display: block; font-size: 1.4em; } .kpi small { display: block; color: #666; }
.note { color: #555; font-size: 0.9em; }
p.empty { color: #555; font-style: italic; padding: 1em; border: 1px dashed #ccc; }
img { max-width: 100%; }
"""
ACTUAL_COLOR = "#4878a8"
STOCK_COLOR = "#d9822b"


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def empty_chart(why: str) -> str:
    """A chart with nothing to draw is a sentence saying why (`_figure` shows it as text, not as axes)."""
    return why


def _figure(alt: str, chart: str) -> str:
    """An <img> for a chart, or the sentence of an empty one."""
    if chart.startswith("data:"):
        return f"<img alt='{html.escape(alt)}' src='{chart}'>"
    return f"<p class='empty'>{html.escape(chart)}</p>"


def _money_axis(currency: str) -> FuncFormatter:
    return FuncFormatter(lambda v, _pos: money(v, currency) if v else "0")


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
    image = ax.imshow(grid, cmap="Blues", vmin=0)
    ax.set_xticks(range(n), labels=zones, rotation=30, ha="right")
    ax.set_yticks(range(n), labels=zones)
    ax.set_xlabel("to zone")
    ax.set_ylabel("from zone")
    ax.set_title(f"{unit} per zone pair (off-diagonal = cross-zone)")
    top = max((v for row in grid for v in row), default=0.0)
    for i in range(n):
        for j in range(n):
            color = "white" if top and grid[i][j] > top / 2 else "black"
            ax.text(j, i, sig(grid[i][j]), ha="center", va="center", color=color, fontsize=9,
                    fontweight="bold" if i != j else "normal")
    fig.colorbar(image, ax=ax, label=unit)
    return _png(fig)


def _utc(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC).replace(tzinfo=None)


def cost_over_time_chart(buckets: list[dict[str, Any]], queue_buckets: list[dict[str, Any]], bucket_s: float,
                         currency: str) -> str:
    """Cross-zone cost per time bucket, and the same under stock NATS routing."""
    title = f"Cross-zone cost per {duration(bucket_s)} (UTC)"
    if len(buckets) == 1:
        title = f"Cross-zone cost (all traffic fell in one {duration(bucket_s)} ledger window)"
    extra = {q[T.BUCKET]: (q[T.STOCK_COST] or 0.0) - (q[T.COST] or 0.0) for q in queue_buckets}
    xs = [b[T.BUCKET] for b in buckets]
    actual = [b[T.COST] or 0.0 for b in buckets]
    stock = [c + extra.get(x, 0.0) for x, c in zip(xs, actual, strict=True)]
    if not any(actual) and not any(v > 0 for v in stock):
        why = "Nothing crossed zones: no cross-zone cost in this ledger"
        if xs:
            why += f" ({duration(xs[-1] + bucket_s - xs[0])} of traffic)"
        return empty_chart(why + ".")
    fig = Figure(figsize=(9, 3.2))
    ax = fig.subplots()
    times = [_utc(x) for x in xs]
    width = timedelta(seconds=bucket_s)
    ax.bar(times, actual, width=width * 0.85, align="edge", color=ACTUAL_COLOR, label="this ledger")
    if queue_buckets:
        mid = [t + width / 2 for t in times]
        ax.plot(mid, stock, marker="o", ms=4, color=STOCK_COLOR, linestyle="--", label="with stock NATS routing")
    ax.set_xlim(times[0] - width / 2, times[-1] + width * 1.5)
    ax.set_ylim(bottom=0, top=max(max(actual), max(stock)) * 1.3)  # room for the legend above the bars
    locator = mdates.AutoDateLocator(minticks=3, maxticks=10)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.yaxis.set_major_formatter(_money_axis(currency))
    ax.set_ylabel(f"cost per {duration(bucket_s)}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9, ncol=2)
    return _png(fig)


def top_subjects_chart(top: list[dict[str, Any]], currency: str) -> str:
    rows = [r for r in top[:15] if r[T.COST]]
    if not rows:
        return empty_chart("Nothing crossed zones: no subject has a cross-zone cost.")
    rows.reverse()
    fig = Figure(figsize=(9, 0.8 + 0.35 * len(rows)))
    ax = fig.subplots()
    ax.barh(range(len(rows)), [r[T.COST] for r in rows], color=ACTUAL_COLOR)
    ax.set_yticks(range(len(rows)), labels=[f"{r['subject_prefix']} ({r['account']})" for r in rows])
    ax.xaxis.set_major_formatter(_money_axis(currency))
    ax.set_xlabel("cross-zone cost")
    ax.set_title("Top subjects by cross-zone cost")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def _table(headers: list[str], rows: list[list[Any]], left: int = 0) -> str:
    def cell(tag: str, i: int, v: Any) -> str:
        cls = ' class="l"' if i < left else ""
        return f"<{tag}{cls}>{html.escape(str(v))}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _when(iso: str) -> str:
    return when(datetime.fromisoformat(iso).timestamp())


def _kpi(label: str, value: str, note: str = "") -> str:
    small = f"<small>{html.escape(note)}</small>" if note else ""
    return f"<div class='kpi'>{html.escape(label)}<b>{html.escape(value)}</b>{small}</div>"


def render_report(
    summary: dict[str, Any],
    pairs: list[dict[str, Any]],
    buckets: list[dict[str, Any]],
    queue_buckets: list[dict[str, Any]],
    top: list[dict[str, Any]],
) -> str:
    cur = summary["prices"]["currency"]
    m = summary["monthly"]
    observed = summary["observed"]
    seconds = observed["seconds"]
    over = f"over {duration(seconds)}"
    prices = summary["prices"]
    lead = (
        f"Cross-zone traffic costs <b>{html.escape(money(m['cost_usd'], cur))} per month</b> at the rate this "
        f"ledger observed ({html.escape(duration(seconds))} of traffic from {html.escape(_when(observed['start']))} "
        f"to {html.escape(_when(observed['end']))}). With stock NATS queue routing it would cost "
        f"<b>{html.escape(money(m['stock_routing_cost_usd'], cur))} per month</b>: "
        f"{html.escape(saving_sentence(summary))}."
    )
    kpis = [
        _kpi("cross-zone cost per month", money(m["cost_usd"], cur), f"{money(summary['cost_usd'], cur)} {over}"),
        _kpi("with stock NATS routing", money(m["stock_routing_cost_usd"], cur),
             f"{money(summary['stock_routing_cost_usd'], cur)} {over}"),
        _kpi("saved per month", money(m["saved_usd"], cur) if summary["saving_is_significant"] else "none",
             f"{money(summary['saved_usd'], cur)} {over}, noise ±{money(summary['saved_noise_usd'], cur)}"),
        _kpi("crossed zones", f"{size(summary['cross_zone_bytes'])} of {size(summary['total_bytes'])}",
             f"{percent(summary['cross_zone_bytes'], summary['total_bytes'])} of the bytes on links"),
    ]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>zonebus cost report</title>",
        f"<style>{CSS}</style></head><body><h1>zonebus cross-zone cost report</h1>",
        f"<p class='lead'>{lead}</p>",
        "".join(kpis),
        f"<p>{html.escape(transfers_sentence(summary))}. Monthly figures are the ledger's cost divided by its "
        "span, times a 30-day month.</p>",
        f"<p class='note'>Ledger <code>{html.escape(str(summary['ledger']))}</code>, {summary['ledger_rows']:,} rows. "
        f"Prices: {html.escape(prices['provider'] or prices['source'])}, "
        f"{html.escape(money(prices['cross_zone_per_gb_each_side'], cur))}/GB x {prices['sides_charged']} "
        "side(s).</p>",
    ]
    if pairs:
        parts += ["<h2>Zone pairs</h2>", _figure("zone-pair matrix", zone_matrix_chart(pairs))]
        parts.append(_table(
            ["from zone", "to zone", "link", "message transfers", "bytes", "cross-zone bytes", "cost"],
            [[p["src_zone"], p["dst_zone"], p["link_kind"], f"{p['msgs']:,}", size(p["bytes"]),
              size(p[T.CROSS_BYTES]), money(p[T.COST], cur)] for p in pairs], left=3))
    timeline = cost_over_time_chart(buckets, queue_buckets, observed["timeline_bucket_seconds"], cur)
    parts += ["<h2>Cost over time</h2>", _figure("cost over time", timeline)]
    parts += ["<h2>Top subjects</h2>", _figure("top subjects", top_subjects_chart(top, cur))]
    if top:
        parts.append(_table(
            ["account", "subject prefix", "message transfers", "bytes", "cross-zone bytes", "cost"],
            [[r["account"], r["subject_prefix"], f"{r['msgs']:,}", size(r["bytes"]), size(r[T.CROSS_BYTES]),
              money(r[T.COST], cur)] for r in top], left=2))
    q = summary["queue_routing"]
    stock = q["stock_routing"]
    if not q["msgs"]:
        parts += ["<h2>Queue routing</h2>", "<p class='empty'>No queue group deliveries in this ledger: queue "
                  "routing makes no difference to its cost.</p>", "</body></html>"]
        return "\n".join(parts)
    parts += [
        "<h2>Queue routing: this ledger and stock NATS routing</h2>",
        "<p>Stock NATS routing gives each message of a queue group to one member drawn at random anywhere in "
        "the cluster, weighted by member count. A route carries a message once however many subscribers and "
        "queue groups behind it want it, so a queue choice adds a cross-zone copy only when that route does "
        "not carry the message anyway. The stock routing row is an estimate from this ledger's queue "
        "decisions and route copies; the rest of the traffic is the same in both rows, so the last columns "
        "are the whole cross-zone bill of the headline.</p>",
        _table(["", "queue deliveries", "delivered across zones", "cross-zone bytes the choices added",
                "their cost", "whole cross-zone bill", "per month"], [
            ["this ledger", f"{q['msgs']:,}", f"{q['cross_zone_msgs']:,}", size(q["added_cross_zone_bytes"]),
             money(q["cost_usd"], cur), money(summary["cost_usd"], cur), money(m["cost_usd"], cur)],
            ["stock NATS routing (estimate)", f"{q['msgs']:,}", count(round(stock["cross_zone_msgs"], 1)),
             size(stock["added_cross_zone_bytes"]), money(stock["cost_usd"], cur),
             money(summary["stock_routing_cost_usd"], cur), money(m["stock_routing_cost_usd"], cur)],
        ], left=1),
        "</body></html>",
    ]
    return "\n".join(parts)


def durable_queue_section(summary: dict[str, Any]) -> str:
    """The durable queue groups' section: deliveries and forwards by zone pair ("" when there were none)."""
    d = summary.get("durable_queue")
    if not d or not d["by_zone_pair"]:
        return ""
    cur = summary["prices"]["currency"]
    rows = [[h["queue"], h["hop"].replace("_", " "), h["src_zone"], h["dst_zone"], "yes" if h["cross_zone"] else "",
             f"{h['msgs']:,}", size(h["bytes"]), money(h["cost_usd"], cur)] for h in d["by_zone_pair"]]
    return "\n".join([
        "<h2>Durable queue groups</h2>",
        f"<p>{d['deliveries']:,} deliveries, {d['cross_zone_deliveries']:,} of them to a member in another zone "
        "than the message was published in. A message published on a server other than its group's primary "
        "is forwarded to the primary (to primary), and from it to the chosen member's server (to member server): "
        f"{d['cross_zone_forwards']:,} forwards crossed zones ({html.escape(size(d['cross_zone_forward_bytes']))}, "
        f"{html.escape(money(d['forward_cost_usd'], cur))}). Those bytes are route traffic, already in the bill "
        "above.</p>",
        _table(["group", "hop", "from zone", "to zone", "cross-zone", "messages", "bytes", "cost"], rows, left=5),
    ])


def with_durable_queue(summary: dict[str, Any], page: str) -> str:
    """`page` with the durable queue groups' section before its end."""
    section = durable_queue_section(summary)
    end = page.rfind("</body></html>")
    if not section or end < 0:
        return page
    return page[:end] + section + "\n" + page[end:]
