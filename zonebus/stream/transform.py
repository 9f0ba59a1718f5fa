"""A stream's `subject_transform {src, dest}`: the subject a message is stored under, as nats-server maps it.

`src` is a subject filter (empty = every subject); `dest` is built from literal tokens and references to
the tokens the source's `*` wildcards matched: `$N` and `{{wildcard(N)}}` (the N-th one, from 1), and a final
`>` when the source ends with one (a plain `*` in `dest` is refused, as nats-server refuses it), and nats-server's
other functions (partition, split, ..., zonebus.subjects.mapping_functions). An empty `dest` maps nothing
(nats-server accepts and ignores it).
"""

from __future__ import annotations

import random
import re
from typing import Any

from zonebus.protocol.jserrors import JSError
from zonebus.stream.subjects import valid_subject
from zonebus.subjects.mapping_functions import FunctionError, apply_function, parse_function
from zonebus.subjects.patterns import matches

_RNG = random.Random()
_WILDCARD_FN = re.compile(r"^\{\{\s*wildcard\s*\(\s*(\d+)\s*\)\s*\}\}$", re.IGNORECASE)
_DOLLAR = re.compile(r"^\$(\d+)$")

# a token of the destination: a literal, or ("wc", index into the source's wildcard tokens), or (">",)
Part = tuple[str, Any]




class SubjectTransform:
    def __init__(self, src: str, dest: str) -> None:
        self.src = src or ">"
        src_toks = self.src.split(".")
        self._fwc = src_toks[-1] == ">"
        stars = [i for i, t in enumerate(src_toks) if t == "*"]
        self.parts: list[Part] = []
        dest_toks = dest.split(".")
        for pos, tok in enumerate(dest_toks):
            m = _WILDCARD_FN.match(tok) or _DOLLAR.match(tok)
            if m:
                n = int(m.group(1))
                if not stars or n > len(stars):
                    raise _bad_dest(f"invalid mapping destination: wildcard index out of range in {tok}: [{n}]")
                self.parts.append(("wc", stars[n - 1] if n else 0))  # ($0: the subject's first token)
            elif tok == "*" or (tok == ">" and (pos != len(dest_toks) - 1 or not self._fwc)):
                raise _bad_dest("invalid subject")
            elif tok == ">":
                self.parts.append((">", None))
            elif tok.startswith("{{") and tok.endswith("}}"):
                try:
                    fn = parse_function(tok, stars)
                except FunctionError as exc:
                    raise _bad_dest(f"invalid mapping destination: {exc}") from None
                if fn is None:
                    raise _bad_dest(f"invalid mapping destination: unknown function in {tok}")
                self.parts.append(("fn", fn))
            elif not tok or any(c in tok for c in " \t\r\n{}"):
                raise _bad_dest("invalid mapping destination: invalid transform")
            else:
                self.parts.append(("lit", tok))
        if self._fwc and self.parts[-1][0] != ">":
            raise _bad_dest("invalid subject")

    def apply(self, subject: str) -> str:
        """The subject to store `subject` under (unchanged when it does not match the source)."""
        if not matches(self.src, subject):
            return subject
        toks = subject.split(".")
        out: list[str] = []
        for kind, val in self.parts:
            if kind == "lit":
                out.append(val)
            elif kind == "wc":
                out.append(toks[val])
            elif kind == "fn":
                out.append(apply_function(val, toks, subject, _RNG))
            else:
                out.extend(toks[self._last:])
        return ".".join(out)

    @property
    def _last(self) -> int:
        return self.src.count(".")


def _bad_dest(err: str) -> JSError:
    return JSError("stream_transform_invalid_destination", err=err)


def compile_transform(cfg: Any) -> SubjectTransform | None:
    """Validate a `subject_transform` object (decoded JSON); None when it maps nothing (no `dest`)."""
    if not isinstance(cfg, dict):
        raise JSError("invalid_json", err="json: cannot unmarshal value into Go struct field "
                                          "StreamConfigRequest.subject_transform of type server.SubjectTransformConfig")
    src, dest = cfg.get("src") or "", cfg.get("dest") or ""
    if not isinstance(src, str) or (src and not valid_subject(src)):
        raise JSError("stream_transform_invalid_source", err=f"invalid subject {src}")
    if not isinstance(dest, str):
        raise _bad_dest("invalid subject")
    return SubjectTransform(src, dest) if dest else None
