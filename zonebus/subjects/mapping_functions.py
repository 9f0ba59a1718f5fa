"""nats-server's mapping functions in a destination token, `{{name(args)}}` (zonebus.subjects.mapping).

- `partition(n, w1, w2, ...)`: FNV-1a 32 of the named wildcard tokens, concatenated (of the whole subject
  when none is named), modulo `n`;
- `splitFromLeft(w, p)` / `splitFromRight(w, p)`: the token in two at `p` characters from the left/right;
- `sliceFromLeft(w, n)` / `sliceFromRight(w, n)`: the token in pieces of `n` characters (the remainder last /
  first);
- `split(w, delimiter)`: the token cut at each delimiter, empty pieces dropped (as nats-server drops them);
- `left(w, n)` / `right(w, n)`: its first/last `n` characters;
- `random(n)`: a number from 0 to n-1 per message.

Out-of-range positions and sizes leave the token as it is, as in nats-server. A count of 0 for `partition`
or `random` and a size of 0 for the slices, which nats-server accepts and then fails on, are refused.
"""

from __future__ import annotations

import random
import re

_CALL = re.compile(r"^\{\{\s*([A-Za-z]+)\s*\((.*)\)\s*\}\}$", re.DOTALL)
# name (lower case) -> argument kinds: "w" a wildcard index, "i" an integer, "s" a string, "*" more wildcards
SIGNATURES: dict[str, str] = {
    "partition": "i*", "splitfromleft": "wi", "splitfromright": "wi", "slicefromleft": "wi",
    "slicefromright": "wi", "split": "ws", "left": "wi", "right": "wi", "random": "i",
}
_POSITIVE = ("partition", "slicefromleft", "slicefromright", "random")

Function = tuple[str, tuple[int, ...], int, str]  # name, wildcard token indexes, integer argument, string argument


class FunctionError(ValueError):
    """A bad function call, in nats-server's words (without the `invalid mapping destination: ` prefix)."""


def parse_function(token: str, stars: list[int]) -> Function | None:
    """`token` as a function call (None when it is not `{{name(...)}}` or names no known function; `stars`:
    the positions of the source's `*` tokens, which wildcard arguments (from 1) index."""
    m = _CALL.match(token)
    if m is None or m.group(1).lower() not in SIGNATURES:
        return None
    name = m.group(1).lower()
    signature = SIGNATURES[name]
    args = [a.strip() for a in m.group(2).split(",")] if m.group(2).strip() else []
    fixed = signature.rstrip("*")
    if len(args) < len(fixed):
        raise FunctionError(("not enough arguments passed to the function in " if args else
                             "function argument is invalid or in the wrong format in ") + token)
    if len(args) > len(fixed) and not signature.endswith("*"):
        raise FunctionError(f"too many arguments passed to the function in {token}")
    wildcards: list[int] = []
    number, text = 0, ""
    for i, arg in enumerate(args):
        kind = signature[i] if i < len(fixed) else "w"
        if kind == "s":
            text = arg
            continue
        if not re.fullmatch(r"-?\d+", arg):
            raise FunctionError(f"function argument is invalid or in the wrong format in {token}")
        value = int(arg)
        if kind == "i":
            number = value
        elif value < 0 or value > len(stars) or not stars:
            raise FunctionError(f"wildcard index out of range in {token}: [{value}]" if stars
                                else f"wildcard index out of range in {token}")
        else:
            wildcards.append(stars[value - 1] if value else 0)  # (0: the subject's first token)
    if name in _POSITIVE and number < 1:
        raise FunctionError(f"function argument is invalid or in the wrong format in {token}")
    return name, tuple(wildcards), number, text


def apply_function(fn: Function, toks: list[str], subject: str, rng: random.Random) -> str:
    """The function's output for a subject (split into `toks`): one or more tokens joined by dots."""
    name, wildcards, n, text = fn
    if name == "partition":
        key = "".join(toks[i] for i in wildcards) if wildcards else subject
        return str(fnv1a32(key.encode()) % n)
    if name == "random":
        return str(rng.randrange(n))
    token = toks[wildcards[0]]
    size = len(token)
    if name == "split":
        return _split(token, text)
    if not 0 < n < size:
        return token
    if name == "splitfromleft":
        return f"{token[:n]}.{token[n:]}"
    if name == "splitfromright":
        return f"{token[:size - n]}.{token[size - n:]}"
    if name == "left":
        return token[:n]
    if name == "right":
        return token[size - n:]
    if name == "slicefromleft":
        return ".".join(token[i:i + n] for i in range(0, size, n))
    head = size % n  # slicefromright
    return ".".join(([token[:head]] if head else []) + [token[i:i + n] for i in range(head, size, n)])


def _split(token: str, delimiter: str) -> str:
    """nats-server's split, dot for dot (a leading run of delimiters can leave an empty first token)."""
    if not delimiter:
        return token
    parts = token.split(delimiter)
    out = []
    for j, part in enumerate(parts):
        out.append(part)
        if j < len(parts) - 1 and parts[j + 1] and not (j == 0 and not part):
            out.append(".")
    return "".join(out)


def fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h
