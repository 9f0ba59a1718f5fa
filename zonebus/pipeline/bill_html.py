"""The cost report's "whole bill" section as HTML: a chart of the bill's parts against nats-server R3 with route
compression, and tables of storage requests by kind and purpose (figures from `zonebus.pipeline.bill`)."""

from __future__ import annotations

import html
from typing import Any

from matplotlib.figure import Figure

from zonebus.pipeline.html_report import _figure, _money_axis, _png, _table, empty_chart
from zonebus.pipeline.units import money, size

PART_LABELS = (("transfer", "cross-zone transfer", "#4878a8"), ("storage_requests", "storage requests", "#6aa84f"),
               ("storage_per_gb", "storage per-GB charges", "#b4a7d6"), ("storage_bytes", "storage bytes kept",
                                                                          "#f1c232"))
R3_COLOR = "#d9822b"


def bill_chart(bill: dict[str, Any], currency: str) -> str:
    """Two stacked bars per month: zonebus's whole bill by part, and nats-server R3 compressed."""
    m = bill["monthly"]
    r3 = bill.get("nats_r3")
    if not m["total_usd"] and not (r3 and r3["monthly_cost_usd"]):
        return empty_chart("The whole bill is zero: nothing crossed zones and no storage request was counted.")
    fig = Figure(figsize=(9, 2.6))
    ax = fig.subplots()
    left = 0.0
    for key, label, color in PART_LABELS:
        ax.barh(1, m[key], left=left, color=color, label=label)
        left += m[key]
    labels = ["zonebus (this ledger)"]
    if r3:
        ax.barh(0, r3["monthly_cost_usd"], color=R3_COLOR, label="nats-server R3, compressed routes")
        labels.insert(0, "nats-server R3 (model)")
        ax.set_yticks([0, 1], labels=labels)
    else:
        ax.set_yticks([1], labels=labels)
    ax.xaxis.set_major_formatter(_money_axis(currency))
    ax.set_xlabel("per month at the observed rate")
    ax.set_title(f"Whole bill at {bill['storage_prices']['name']}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, fontsize="small", frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def bill_section(bill: dict[str, Any], currency: str) -> str:
    p, m = bill["parts_usd"], bill["monthly"]
    sr = bill["storage_requests"]
    esc = html.escape
    rows = [[label, money(p[key], currency), money(m[key], currency)] for key, label, _ in PART_LABELS]
    rows.append(["whole bill", money(bill["total_usd"], currency), money(m["total_usd"], currency)])
    r3 = bill.get("nats_r3")
    if r3:
        rows.append(["nats-server R3, compressed routes (model)", money(r3["cost_usd"], currency),
                     money(r3["monthly_cost_usd"], currency)])
    kept = bill["storage_bytes"]
    kept_text = (f"Storage bytes: {kept['gb_months']:.3g} GB-months, assumed: {kept['assumed']}." if kept
                 else f"Storage bytes: {bill['storage_bytes_note']}.")
    parts = [
        "<h2>Whole bill: transfer and shared storage</h2>",
        f"<p>Storage priced at <b>{esc(bill['storage_prices']['name'])}</b> "
        f"({esc(bill['storage_prices']['source'])}). {esc(bill['formula'])}. {esc(kept_text)}</p>",
        _figure("whole bill", bill_chart(bill, currency)),
        _table(["part", "over the ledger", "per month"], rows, left=1),
        "<h3>Storage requests by kind</h3>",
        _table(["kind", "requests", "bytes", "cost"], [[k, f"{v['requests']:,}", size(v["bytes"]),
                                                        money(v["cost_usd"], currency)]
                                                       for k, v in sr["by_kind"].items()], left=1),
        "<h3>Storage requests by purpose</h3>",
        _table(["purpose", "requests", "bytes", "cost"], [[k, f"{v['requests']:,}", size(v["bytes"]),
                                                           money(v["cost_usd"], currency)]
                                                          for k, v in sr["by_purpose"].items()], left=1),
    ]
    if r3:
        parts += [
            "<h3>nats-server R3 with route compression</h3>",
            f"<p>{esc(r3['model'])}. Compression ratio {r3['write_compression_ratio']:.3g} (publishes, "
            f"replication), {r3['delivery_compression_ratio']:.3g} (deliveries): "
            f"{esc(r3['compression_ratio_basis'])}. Stream traffic: {r3['published_msgs']:,} publishes "
            f"({esc(size(r3['published_bytes']))}), {r3['delivered_msgs']:,} deliveries "
            f"({esc(size(r3['delivered_bytes']))}); subjects: {esc(str(r3['subjects']))}.</p>",
            _table(["hop", "cross-zone bytes before compression", "ratio", "after", "cost"],
                   [[k.replace("_", " "), size(h["raw_cross_zone_bytes"]), f"{h['compression_ratio']:.3g}",
                     size(h["cross_zone_bytes"]), money(h["cost_usd"], currency)] for k, h in r3["hops"].items()],
                   left=1),
        ]
    elif bill.get("nats_r3_note"):
        parts.append(f"<p class='note'>{esc(bill['nats_r3_note'])}.</p>")
    return "\n".join(parts)


def with_bill(summary: dict[str, Any], page: str) -> str:
    """`page` with the whole bill's section before its end."""
    bill = summary.get("whole_bill")
    end = page.rfind("</body></html>")
    if not bill or end < 0:
        return page
    return page[:end] + bill_section(bill, summary["prices"]["currency"]) + "\n" + page[end:]
