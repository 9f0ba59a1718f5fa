"""The report's key sentences, shared by the terminal table, the HTML page and the demo."""

from __future__ import annotations

from typing import Any

from zonebus.pipeline.units import money, percent


def saving_sentence(summary: dict[str, Any]) -> str:
    """The headline comparison with stock NATS routing, in words (terminal and HTML)."""
    cur = summary["prices"]["currency"]
    saved, noise = summary["saved_usd"], summary["saved_noise_usd"]
    monthly = summary["monthly"]
    if not summary["queue_routing"]["msgs"]:
        return "no queue group deliveries in this ledger, so stock routing would cost the same"
    if summary["saving_is_significant"]:
        return (f"zone-aware queue routing saved {money(saved, cur)} here, {money(monthly['saved_usd'], cur)} "
                f"per month ({percent(saved, summary['stock_routing_cost_usd'])} of the bill under stock routing)")
    if saved < 0 and -saved > 2 * noise:
        return (f"zone-aware queue routing cost {money(-saved, cur)} more than stock routing would have "
                f"(sampling noise ±{money(noise, cur)})")
    return ("no measurable saving against stock routing: this ledger's queue routing sent about as much across "
            f"zones as a random choice would (difference {money(saved, cur)}, sampling noise ±{money(noise, cur)})")


def transfers_sentence(summary: dict[str, Any]) -> str:
    """What `msgs` counts: transfers on links, by kind (a published message is delivered and copied too)."""
    t = summary["transfers"]
    parts = [f"{t['published']:,} published by clients", f"{t['delivered']:,} delivered to clients",
             f"{t['server_copies']:,} copies between servers"]
    if t["storage"]:
        parts.append(f"{t['storage']:,} to and from storage")
    return f"{summary['total_msgs']:,} message transfers on links: " + ", ".join(parts)
