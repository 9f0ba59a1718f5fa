"""Parser for nats-server's configuration syntax, producing a tree of positioned `Value`s.

The grammar follows nats-server's `conf/lex.go` and `conf/parse.go`:

- entries are `key: value`, `key = value` or `key value`, ended by a new line, `;` or `,`;
- blocks `name { ... }`, arrays `[a, b]` (commas or new lines), comments `#` and `//`;
- strings double-quoted (escapes `\\t \\n \\r \\" \\\\ \\xXX`), single-quoted (raw), unquoted, or
  `( ... )` blocks ending with `)` alone on a line;
- integers with size suffixes (`k`=1000, `kb`/`ki`/`kib`=1024, likewise m, g, t, p, e), floats,
  booleans (true/false/yes/no/on/off), Zulu datetimes; a word starting with a digit that is no number
  (`10s`, `127.0.0.1:4222`) is a string;
- `include path` (relative to the including file) and `$name` variables, looked up in the enclosing
  blocks and then in the environment (whose text is parsed as a value).

Every value records the file, line and column (1-based) where it was written; a map entry records the
position of its key, as nats-server does, because that is where errors are best reported.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

MAX_INCLUDE_DEPTH = 10
MAX_NESTING = 64
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
BCRYPT_PREFIX = "2a$"

SIZE_SUFFIXES = {"": 1}
for _i, _letter in enumerate("kmgtpe", start=1):
    SIZE_SUFFIXES[_letter] = 1000**_i
    for _binary in ("b", "i", "ib"):
        SIZE_SUFFIXES[_letter + _binary] = 1024**_i

_INT_RE = re.compile(r"-?\d+([a-z]*)", re.IGNORECASE)
_FLOAT_RE = re.compile(r"-?\d+\.\d+")
_DATETIME_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", '"': '"', "\\": "\\"}
# Characters that end an unquoted value (or a number).
_VALUE_END = frozenset("\n\r;,]} \t")


class ConfigError(ValueError):
    """A configuration problem; the message names file, line and column. `errors` lists each one."""

    def __init__(self, errors: list[str] | str) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("\n".join(self.errors))


@dataclass
class Value:
    """One parsed value and where it was written.

    `value` is a str, int, float, bool or datetime, a list of `Value`s (`kind` "array") or a dict of
    key -> `Value` (`kind` "map"). `raw` is the source text of a scalar (e.g. "2m" for the integer
    2000000). `used` is set when the entry was referenced as a `$variable`; such entries are variable
    definitions, not settings.
    """

    value: Any
    kind: str
    file: str
    line: int
    col: int
    raw: str = ""
    used: bool = field(default=False, compare=False)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def at(self, file: str, line: int, col: int) -> Value:
        """A copy of this value placed at another position."""
        return Value(self.value, self.kind, file, line, col, self.raw)

    def plain(self) -> Any:
        """The value with all positions stripped: nested lists, dicts and scalars."""
        if self.kind == "array":
            return [v.plain() for v in self.value]
        if self.kind == "map":
            return {k: v.plain() for k, v in self.value.items()}
        return self.value


class _Parser:
    def __init__(self, text: str, filename: str, env: Mapping[str, str] | None, depth: int, display: str) -> None:
        self.text = text
        self.filename = filename  # used to resolve includes; "" means the working directory
        self.display = display  # the name errors use
        self.env = os.environ if env is None else env
        self.depth = depth
        self.pos = 0
        self.line_starts = [0] + [m.end() for m in re.finditer(r"\n", text)]
        self.scopes: list[dict[str, Value]] = []
        self.nesting = 0

    # ---- positions and errors -------------------------------------------------------------------

    def loc(self, pos: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, pos)
        return line, pos - self.line_starts[line - 1] + 1

    def fail(self, message: str, pos: int | None = None) -> ConfigError:
        line, col = self.loc(self.pos if pos is None else pos)
        return ConfigError(f"{self.display}:{line}:{col}: {message}")

    def peek(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.text[i] if i < len(self.text) else ""

    def describe(self, ch: str) -> str:
        return {"": "end of file", "\n": "new line", "\r": "new line"}.get(ch, repr(ch))

    # ---- whitespace and comments ----------------------------------------------------------------

    def at_comment(self) -> bool:
        return self.peek() == "#" or (self.peek() == "/" and self.peek(1) == "/")

    def skip_comment(self) -> None:
        while self.peek() not in ("", "\n"):
            self.pos += 1

    def skip_inline(self) -> None:
        """Spaces and tabs (and a trailing comment) but not new lines."""
        while True:
            ch = self.peek()
            if ch in (" ", "\t"):
                self.pos += 1
            elif self.at_comment():
                self.skip_comment()
            else:
                return

    def skip_blank(self) -> None:
        """Whitespace including new lines, and comments."""
        while True:
            ch = self.peek()
            if ch and ch.isspace():
                self.pos += 1
            elif self.at_comment():
                self.skip_comment()
            else:
                return

    # ---- document and maps ----------------------------------------------------------------------

    def parse_document(self) -> dict[str, Value]:
        self.skip_blank()
        if self.peek() == "{":  # a document may be wrapped in braces, JSON style
            self.pos += 1
            body = self.parse_entries(closing="}")
            self.skip_blank()
        else:
            body = self.parse_entries(closing="")
        if self.peek():
            raise self.fail(f"unexpected {self.describe(self.peek())} after the end of the configuration")
        return body

    def parse_entries(self, closing: str) -> dict[str, Value]:
        """Entries up to `closing` ("}" for a block, "" for end of file), which is consumed."""
        entries: dict[str, Value] = {}
        self.scopes.append(entries)
        try:
            while True:
                self.skip_blank()
                ch = self.peek()
                if ch == closing:
                    self.pos += len(closing)
                    return entries
                if ch == "":
                    raise self.fail("unexpected end of file, missing '}'")
                self.parse_entry(entries)
                self.skip_inline()
                ch = self.peek()
                if ch in ("\n", "\r", ";", ","):
                    self.pos += 1
                elif ch == "" and closing:
                    raise self.fail("unexpected end of file, missing '}'")
                elif ch != closing:
                    raise self.fail(f"expected a new line, ';' or ',' after a value, got {self.describe(ch)}")
        finally:
            self.scopes.pop()

    def parse_entry(self, entries: dict[str, Value]) -> None:
        key_pos = self.pos
        key, quoted = self.parse_key()
        line, col = self.loc(key_pos)
        if not quoted and key.lower() == "include" and self.peek() in (" ", "\t"):
            self.parse_include(entries, key_pos)
            return
        # As in nats-server, white space (even new lines) may sit between a key and its value
        # when there is no separator; after a separator the value must be on the same line.
        while self.peek() and self.peek().isspace():
            self.pos += 1
        if self.peek() in ("=", ":"):
            self.pos += 1
            while self.peek() in (" ", "\t"):
                self.pos += 1
        value = self.parse_value()
        entries[key] = value.at(self.display, line, col)

    def parse_key(self) -> tuple[str, bool]:
        ch = self.peek()
        if ch in ("=", ":"):
            raise self.fail(f"unexpected key separator {ch!r}")
        if ch in ('"', "'"):
            end = self.text.find(ch, self.pos + 1)
            nl = self.text.find("\n", self.pos + 1)
            if end < 0 or (0 <= nl < end):
                raise self.fail("unterminated quoted key")
            key = self.text[self.pos + 1 : end]
            self.pos = end + 1
            return key, True
        start = self.pos
        while (c := self.peek()) and not c.isspace() and c not in "=:{}[]":
            self.pos += 1
        if self.pos == start:
            raise self.fail(f"expected a key, got {self.describe(ch)}")
        return self.text[start : self.pos], False

    def parse_include(self, entries: dict[str, Value], key_pos: int) -> None:
        self.skip_inline()
        start = self.pos
        ch = self.peek()
        if ch in ('"', "'"):
            end = self.text.find(ch, start + 1)
            if end < 0:
                raise self.fail("unterminated include path")
            path = self.text[start + 1 : end]
            self.pos = end + 1
        else:
            while (c := self.peek()) and c not in _VALUE_END:
                self.pos += 1
            path = self.text[start : self.pos]
        if not path:
            raise self.fail("expected a file name after include", start)
        self.skip_inline()
        if self.peek() in ('"', "'"):  # newer nats-server: an optional digest of the included file
            end = self.text.find(self.peek(), self.pos + 1)
            self.pos = len(self.text) if end < 0 else end + 1
        if self.depth >= MAX_INCLUDE_DEPTH:
            raise self.fail(f"include nesting deeper than {MAX_INCLUDE_DEPTH} at '{path}'", key_pos)
        base = os.path.dirname(self.filename) if self.filename else ""
        full = os.path.normpath(os.path.join(base, path))
        try:
            with open(full, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise self.fail(f"error parsing include file '{path}', open {full}: {reason.lower()}", key_pos)
        sub = _Parser(text, full, self.env, self.depth + 1, full)
        sub.scopes = list(self.scopes)  # included text sees the variables in scope here
        entries.update(sub.parse_document())

    # ---- values ---------------------------------------------------------------------------------

    def parse_value(self) -> Value:
        start = self.pos
        line, col = self.loc(start)
        ch = self.peek()
        if ch in ("[", "{"):
            if self.nesting >= MAX_NESTING:
                raise self.fail(f"arrays and blocks nested deeper than {MAX_NESTING}")
            self.pos += 1
            self.nesting += 1
            try:
                if ch == "[":
                    return Value(self.parse_array(), "array", self.display, line, col)
                return Value(self.parse_entries(closing="}"), "map", self.display, line, col)
            finally:
                self.nesting -= 1
        if ch == '"':
            return self.scalar(self.parse_dq_string(), "string", start)
        if ch == "'":
            end = self.text.find("'", start + 1)
            if end < 0:
                raise self.fail("unterminated string")
            self.pos = end + 1
            return self.scalar(self.text[start + 1 : end], "string", start)
        if ch == "(":
            return self.scalar(self.parse_block_string(), "string", start)
        if ch in ("", "\n", "\r"):
            raise self.fail(f"expected a value but found {self.describe(ch)}")
        if ch in ";,]}":
            raise self.fail(f"expected a value but found {ch!r}")
        while (c := self.peek()) and c not in _VALUE_END:
            self.pos += 1
        word = self.text[start : self.pos]
        if ch.isdigit() or ch in "-.":
            return self.parse_number(word, start)
        if word.lower() in ("true", "yes", "on"):
            return self.scalar(True, "bool", start)
        if word.lower() in ("false", "no", "off"):
            return self.scalar(False, "bool", start)
        if ch == "$" and not word.startswith("$" + BCRYPT_PREFIX):
            return self.lookup_variable(word[1:], start)
        return self.scalar(word, "string", start)

    def scalar(self, value: Any, kind: str, start: int) -> Value:
        line, col = self.loc(start)
        return Value(value, kind, self.display, line, col, raw=self.text[start : self.pos])

    def parse_number(self, word: str, start: int) -> Value:
        if word.startswith("."):
            raise self.fail("floats must start with a digit", start)
        if m := _INT_RE.fullmatch(word):
            suffix = m.group(1).lower()
            if suffix in SIZE_SUFFIXES:
                number = int(word[: len(word) - len(suffix)]) * SIZE_SUFFIXES[suffix]
                if not INT64_MIN <= number <= INT64_MAX:
                    raise self.fail(f"value '{word}' is outside of the integer range", start)
                return self.scalar(number, "integer", start)
        if _FLOAT_RE.fullmatch(word):
            return self.scalar(float(word), "float", start)
        if _DATETIME_RE.fullmatch(word):
            stamp = datetime.strptime(word, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            return self.scalar(stamp, "datetime", start)
        if word.startswith("-"):
            raise self.fail(f"expected a number, got '{word}'", start)
        return self.scalar(word, "string", start)  # e.g. 10s, 127.0.0.1:4222

    def parse_array(self) -> list[Value]:
        items: list[Value] = []
        while True:
            self.skip_blank()
            ch = self.peek()
            if ch == "]":
                self.pos += 1
                return items
            if ch == "":
                raise self.fail("unexpected end of file, missing ']'")
            if ch == ",":
                raise self.fail("unexpected array value terminator ','")
            items.append(self.parse_value())
            self.skip_inline()
            ch = self.peek()
            if ch in (",", "\n", "\r"):
                self.pos += 1
            elif ch == "":
                raise self.fail("unexpected end of file, missing ']'")
            elif ch != "]":
                raise self.fail(f"expected ',' or ']' after an array value, got {self.describe(ch)}")

    def parse_dq_string(self) -> str:
        self.pos += 1
        out: list[str] = []
        while True:
            ch = self.peek()
            if ch == "":
                raise self.fail("unterminated string")
            self.pos += 1
            if ch == '"':
                return "".join(out)
            if ch != "\\":
                out.append(ch)
                continue
            esc = self.peek()
            self.pos += 1
            if esc in _ESCAPES:
                out.append(_ESCAPES[esc])
            elif esc == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", self.text[self.pos : self.pos + 2]):
                out.append(chr(int(self.text[self.pos : self.pos + 2], 16)))
                self.pos += 2
            else:
                raise self.fail(
                    f'invalid escape character {esc!r}; only \\xXX, \\t, \\n, \\r, \\", \\\\ are allowed',
                    self.pos - 2,
                )

    def parse_block_string(self) -> str:
        """`( ... )`: everything up to a line holding only `)`."""
        m = re.compile(r"\n\)(?=\r?\n|$)").search(self.text, self.pos)
        if not m:
            raise self.fail("unterminated block string: expected ')' alone on a line")
        body = self.text[self.pos + 1 : m.start()]
        self.pos = m.end()
        return body.strip("\r\n")

    def lookup_variable(self, name: str, start: int) -> Value:
        line, col = self.loc(start)
        for scope in reversed(self.scopes):
            if name in scope:
                scope[name].used = True
                return scope[name].at(self.display, line, col)
        if name in self.env:
            try:
                parsed = _Parser(f"pk={self.env[name]}", "", {}, self.depth, f"${name}").parse_document()
            except ConfigError as exc:
                raise self.fail(f"variable reference for '{name}' could not be parsed: {exc}", start)
            return parsed["pk"].at(self.display, line, col)
        raise self.fail(f"variable reference for '{name}' can not be found", start)


def parse_text(text: str, filename: str = "", env: Mapping[str, str] | None = None) -> dict[str, Value]:
    """Parse configuration text into a dict of key -> `Value`. `filename` names it in errors and is
    where includes are resolved from (the working directory when empty). Raises `ConfigError`."""
    return _Parser(text, filename, env, 0, filename or "<config>").parse_document()


def parse_file(path: str, env: Mapping[str, str] | None = None) -> dict[str, Value]:
    """Read and parse a configuration file. Raises `ConfigError`, also when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"error opening config file: open {path}: {(exc.strerror or str(exc)).lower()}")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"error opening config file: {path} is not UTF-8 text: {exc}")
    return parse_text(text, path, env)
