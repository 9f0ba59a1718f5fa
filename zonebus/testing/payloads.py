"""JSON order events of a chosen size, for the tests and benchmarks that measure link compression.

`json_event(rng, i, size)`: one document of about `size` bytes (never less), with the fields a real event
stream repeats (keys, enums, SKUs) and the ones that do not (ids, prices, a free-text note), so that a
compressor sees what it would in production rather than a repeated string.
"""

from __future__ import annotations

import json
import random

_WORDS = ("shipping", "express", "gift", "wrap", "door", "leave", "call", "before", "the", "at", "parcel",
          "neighbour", "weekend", "fragile", "signature", "locker", "morning", "please")


def json_event(rng: random.Random, i: int, size: int = 750) -> bytes:
    doc = {"seq": i, "order_id": f"ord-{rng.getrandbits(48):012x}",
           "event": rng.choice(["created", "paid", "shipped"]),
           "customer": {"id": rng.randrange(10**7), "tier": rng.choice(["free", "plus", "pro"]),
                        "country": rng.choice(["DE", "FR", "US", "JP", "BR"])},
           "items": [{"sku": f"SKU-{rng.randrange(10**5):05d}", "qty": rng.randint(1, 9),
                      "price": round(rng.uniform(1, 500), 2)} for _ in range(rng.randint(2, 5))],
           "note": ""}
    room = size - len(json.dumps(doc))
    note: list[str] = []
    while room > 0:
        word = rng.choice(_WORDS)
        note.append(word)
        room -= len(word) + 1
    doc["note"] = " ".join(note)
    return json.dumps(doc).encode()
