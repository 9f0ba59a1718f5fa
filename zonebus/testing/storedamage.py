"""Damage to the objects of a shared store on the S3 stand-in (the chaos campaigns' `damage` fault,
`zonebus.testing.nemesis`), through the S3 API against moto directly (not the fault-injecting proxy, and not
counted): the object is read, damaged and written back, as bit rot or a torn write would leave it.

    damage = StoreDamage(s3, "zb/")          # a `zonebus.testing.motos3.MotoS3`, the store's key prefix
    what = damage.hit(rng, ("flip", "torn"))  # e.g. "flipped bit 3 of byte 1021 of 4096 in zb/streams/S/log/...blk"

The kinds (`KINDS`), one drawn per hit among those asked for that have an object to hit:
- `flip`: one bit of a batch object (`streams/<s>/log/<batch>.<epoch>.blk`) at a uniformly drawn offset: bit
  rot hits any byte of any object;
- `torn`: a batch object cut short to a drawn fraction of its bytes (a torn write);
- `claim`: the newest claim object of a stream (`streams/<s>/epochs/<epoch>.claim`) deleted.
Which batch: uniformly among the stream's stored batches, or with probability `RECENT` among its last three
(the objects a reader is most likely to fetch again soon, and those only the writer's cache also holds).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from zonebus.testing.motos3 import MotoS3

KINDS = ("flip", "torn", "claim")
RECENT = 0.5


@dataclass
class StoreDamage:
    s3: MotoS3
    prefix: str  # the store's root in the bucket, ending in "/"
    hits: list[str] = field(default_factory=list)  # what each hit did
    _client: Any = None

    def _keys(self, suffix: str, folder: str) -> list[str]:
        return [k for k in self.s3.keys(f"{self.prefix}streams/") if k.endswith(suffix) and f"/{folder}/" in k]

    def hit(self, rng: random.Random, kinds: tuple[str, ...] = KINDS) -> str:
        """Damage one object of one of `kinds` (blocking: run it in a thread); what was done, or why nothing
        was."""
        if self._client is None:
            self._client = self.s3.client(direct=True)
        batches = self._keys(".blk", "log")
        claims = self._keys(".claim", "epochs")
        can = [k for k in kinds if (claims if k == "claim" else batches)]
        if not can:
            what = f"nothing to damage: no object for {'/'.join(kinds)} stored"
        elif (kind := rng.choice(can)) == "claim":
            newest: dict[str, str] = {}
            for key in claims:  # (names are zero-padded: the highest sorts last)
                stream = key.rsplit("/epochs/", 1)[0]
                newest[stream] = max(newest.get(stream, key), key)
            key = rng.choice(sorted(newest.values()))
            self._client.delete_object(Bucket=self.s3.bucket, Key=key)
            what = f"deleted claim {key}"
        else:
            by_stream: dict[str, list[str]] = {}
            for key in batches:
                by_stream.setdefault(key.rsplit("/log/", 1)[0], []).append(key)
            keys = sorted(by_stream[rng.choice(sorted(by_stream))])
            key = rng.choice(keys[-3:] if rng.random() < RECENT else keys)
            try:
                raw = bytearray(self._client.get_object(Bucket=self.s3.bucket, Key=key)["Body"].read())
            except self._client.exceptions.NoSuchKey:  # a base move deleted it since the listing
                what = f"nothing damaged: {key} was deleted before it could be read"
                self.hits.append(what)
                return what
            if kind == "flip" and raw:
                pos, bit = rng.randrange(len(raw)), rng.randrange(8)
                raw[pos] ^= 1 << bit
                what = f"flipped bit {bit} of byte {pos} of {len(raw)} in {key}"
            else:
                keep = int(len(raw) * rng.uniform(0.05, 0.95))
                what = f"tore {key}: {keep} of {len(raw)} bytes kept"
                raw = raw[:keep]
            self._client.put_object(Bucket=self.s3.bucket, Key=key, Body=bytes(raw))
        self.hits.append(what)
        return what
