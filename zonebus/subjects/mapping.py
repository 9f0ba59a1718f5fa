"""Subject mappings (nats-server's `mappings {}`): a published subject is replaced before it is routed.

    mappings {
      "orders.*.*": "shipped.$2.{{wildcard(1)}}"          # one destination
      "canary": [{destination: "v2", weight: 10%}]          # weighted: 10% to v2, the rest stays on canary
      "by.cluster": [{destination: "east", weight: 100%, cluster: east}, {destination: "west", weight: 100%}]
    }

A destination is built from literal tokens and the tokens the source's `*` wildcards matched, `$N` or
`{{wildcard(N)}}` (from 1), a final `>` when the source ends with one, and nats-server's other functions
(`{{partition(3,1)}}`, `{{split(1,-)}}`, ..., zonebus.subjects.mapping_functions). Weights are percentages
(`50%`, `"50%"` or `50`) that add up to 100 at most; what they leave goes to the subject itself.
Destinations with a `cluster` are used on the servers of that cluster (the others use those without one).
When the sources of two mappings match a subject, the first in the file wins (nats-server's choice is not
defined: it reads the block as an unordered map). Messages are mapped once, where a client publishes them;
routes and gateways carry the mapped subject.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from zonebus.subjects.mapping_functions import Function, FunctionError, apply_function, parse_function
from zonebus.subjects.patterns import matches
from zonebus.subjects.validate import is_valid_subject

_WILDCARD_FN = re.compile(r"^\{\{\s*wildcard\s*\(\s*(\d+)\s*\)\s*\}\}$", re.IGNORECASE)
_DOLLAR = re.compile(r"^\$(\d+)$")


_RNG = random.Random()


class MappingError(ValueError):
    """A bad mapping, in nats-server's words (`invalid subject`, `invalid mapping destination: ...`)."""


@dataclass
class Transform:
    """A destination: its tokens, each a literal (str) or the index of a source token (int); `tail`: the
    source's `>` tokens go at the end."""

    tokens: list[str | int | Function]
    tail: int = -1  # index of the source's `>` (its tokens from there on), -1: none

    @classmethod
    def compile(cls, src: str, dest: str) -> Transform:
        src_toks = src.split(".")
        fwc = src_toks[-1] == ">"
        stars = [i for i, t in enumerate(src_toks) if t == "*"]
        dest_toks = dest.split(".")
        out = cls(tokens=[])
        for pos, tok in enumerate(dest_toks):
            m = _WILDCARD_FN.match(tok) or _DOLLAR.match(tok)
            if m:
                n = int(m.group(1))
                if not stars or n > len(stars):
                    where = f"{tok}: [{n}]" if stars else tok
                    raise MappingError(f"invalid mapping destination: wildcard index out of range in {where}")
                out.tokens.append(stars[n - 1] if n else 0)  # ($0: the subject's first token, as nats-server)
            elif tok == "*" or (tok == ">" and (pos != len(dest_toks) - 1 or not fwc)):
                raise MappingError("invalid subject")
            elif tok == ">":
                out.tail = len(src_toks) - 1
            elif tok.startswith("{{") and tok.endswith("}}"):
                try:
                    fn = parse_function(tok, stars)
                except FunctionError as exc:
                    raise MappingError(f"invalid mapping destination: {exc}") from None
                if fn is None:
                    raise MappingError(f"invalid mapping destination: unknown function in {tok}")
                out.tokens.append(fn)
            elif not tok or any(c in tok for c in " \t\r\n"):
                raise MappingError("invalid mapping destination: invalid transform")
            else:
                out.tokens.append(tok)
        if fwc and out.tail < 0:
            raise MappingError("invalid subject")
        return out

    def apply(self, toks: list[str], subject: str = "", rng: random.Random | None = None) -> str:
        out = [t if isinstance(t, str) else toks[t] if isinstance(t, int)
               else apply_function(t, toks, subject, rng or _RNG) for t in self.tokens]
        if self.tail >= 0:
            out.extend(toks[self.tail:])
        return ".".join(out)


@dataclass
class Destination:
    subject: str
    weight: int = 100  # percent
    cluster: str = ""
    transform: Transform | None = None


@dataclass
class Mapping:
    """One entry of `mappings {}`, checked (`Mapping.build`)."""

    src: str
    destinations: list[Destination] = field(default_factory=list)

    @classmethod
    def build(cls, src: str, destinations: list[Destination]) -> Mapping:
        """Compile the destinations; raises MappingError (total weight, duplicates, bad destinations)."""
        seen: dict[str, set[str]] = {}
        totals: dict[str, int] = {}
        for d in destinations:
            if d.subject in seen.setdefault(d.cluster, set()):
                raise MappingError(f"duplicate entry for {_quote(d.subject)}")
            seen[d.cluster].add(d.subject)
            totals[d.cluster] = totals.get(d.cluster, 0) + d.weight
            if totals[d.cluster] > 100:
                raise MappingError("total weight needs to be <= 100")
            d.transform = Transform.compile(src, d.subject)
        return cls(src, destinations)


def _quote(text: str) -> str:
    return '"' + text + '"'


def valid_source(src: str) -> bool:
    return bool(src) and is_valid_subject(src.encode())


class _Compiled:
    """A mapping as applied on one server: cumulative weights of its cluster's destinations."""

    __slots__ = ("src", "literal", "choices", "keep")

    def __init__(self, mapping: Mapping, cluster: str) -> None:
        self.src = mapping.src
        self.literal = "*" not in mapping.src.split(".") and not mapping.src.endswith(">")
        dests = [d for d in mapping.destinations if cluster and d.cluster == cluster]
        if not dests:
            dests = [d for d in mapping.destinations if not d.cluster]
        self.choices: list[tuple[int, Transform | None]] = []
        total = 0
        for d in sorted(dests, key=lambda d: d.weight):
            total += d.weight
            self.choices.append((total, d.transform))
        self.keep = total < 100  # the rest stays on the subject itself


class Mappings:
    """An account's mappings on this server: `map(subject)` is the subject to route, None when no mapping's
    source matches it (a weighted mapping may route a subject it matches on that subject itself)."""

    __slots__ = ("_list", "_rng")

    def __init__(self, mappings: list[Mapping], cluster: str = "") -> None:
        self._list = [_Compiled(m, cluster) for m in mappings]
        self._rng = random.Random()

    def map(self, subject: bytes) -> bytes | None:
        text = subject.decode("utf-8", "replace")
        for m in self._list:
            if (text == m.src) if m.literal else matches(m.src, text):
                return self._select(m, subject, text)
        return None

    def _select(self, m: _Compiled, subject: bytes, text: str) -> bytes:
        choices = m.choices
        if len(choices) == 1 and not m.keep:
            transform = choices[0][1]
        else:
            draw = self._rng.randrange(100)
            transform = next((t for limit, t in choices if draw < limit), None)
        if transform is None:
            return subject
        return transform.apply(text.split("."), text, self._rng).encode()
