"""A linearizability checker for one key of a NATS KV bucket: Wing & Gong's search with Lowe's memoisation (WGL).

PyPI has no maintained linearizability checker (Jepsen's Knossos and Porcupine are Clojure and Go), so this is
the small one issue 27 asks for: a single register with revisions, the model of one KV key.

The model's state is `(value, revision)`; `(None, 0)` is a key never written. Operations (`Op`):
- `read`, ok with `(value, revision)` (`value` None: not found): the state must be exactly that;
- `put(value)`, ok with its revision `r`: any state with a lower revision; the state becomes `(value, r)`;
- `cas(value, expect)` (KV `update` with the last revision, `create` when `expect` is 0), ok with `r`: the state's
  revision must be `expect` (`create`: the key absent) and lower than `r`; the state becomes `(value, r)`;
  failed (`fail`, wrong last sequence): the state's revision must differ from `expect`; nothing changes;
- an operation whose outcome is unknown (`info`: a timeout, a lost connection) may have taken effect at any
  point after it began, or never: both are searched. Its revision is unknown: the state's revision becomes
  None, which a later read pins and which matches any `expect` meanwhile (a weaker check right after an
  unknown write, never a false alarm).

`check(ops)` returns a `Verdict`: linearizable or not, and for a history that is not, the longest prefix of
operations (by completion) that could be linearized and the first operation that could not. The search is
depth-first over the entries of the history in time order; a `(linearized set, state)` pair already explored is
not explored again (Lowe). Operations that never completed (`info`) stay open to the end of the history, which is
what makes a history with many of them expensive: those no read saw are dropped first (`_prune`, with the
failed compare-and-sets they could explain), and `max_steps` bounds the search (the verdict then says
`unknown`). Reads that failed carry no information and are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

READ, PUT, CAS = "read", "put", "cas"
OK, FAIL, INFO = "ok", "fail", "info"
INF = float("inf")

State = tuple[Any, int | None]  # (value or None, revision: 0 never written, None unknown)
INITIAL: State = (None, 0)


@dataclass
class Op:
    process: str
    kind: str  # read | put | cas
    start: float  # when it was invoked (any clock, the same for every op of a history)
    end: float  # when it completed (INF for `info`)
    outcome: str  # ok | fail | info
    value: Any = None  # put/cas: the value written; read (ok): the value read (None: not found)
    expect: int = 0  # cas: the revision it expected (0: create, the key absent)
    revision: int | None = None  # ok put/cas: the new revision; ok read: the revision read


@dataclass
class Verdict:
    ok: bool | None  # None: the search budget ran out
    ops: int = 0
    steps: int = 0
    reason: str = ""
    witness: list[Op] = field(default_factory=list)  # not linearizable: the operations around the failure

    def line(self) -> str:
        word = {True: "linearizable", False: "NOT linearizable", None: "unknown (search budget exhausted)"}[self.ok]
        return f"{word}: {self.ops} operations, {self.steps} search steps" + (f"; {self.reason}" if self.reason else "")


def _steps(state: State, op: Op) -> list[State]:
    """The states `op` can lead to from `state` (empty: it cannot be linearized here)."""
    value, rev = state
    if op.kind == READ:
        if op.value != value:
            return []
        if rev is None or rev == (op.revision or 0):
            return [(value, op.revision or 0)]
        return []
    if op.outcome == INFO:
        if op.kind == CAS and not _cas_may_apply(state, op.expect):
            return [state]
        return [(op.value, None), state]
    if op.kind == PUT:
        if op.outcome != OK:
            return [state]
        return [(op.value, op.revision)] if rev is None or (op.revision or 0) > rev else []
    if op.kind == CAS:
        if op.outcome == FAIL:
            return [state] if rev is None or not _cas_may_apply(state, op.expect) else []
        if not _cas_may_apply(state, op.expect):
            return []
        return [(op.value, op.revision)] if rev is None or (op.revision or 0) > rev else []
    raise ValueError(f"unknown operation kind {op.kind!r}")


def _cas_may_apply(state: State, expect: int) -> bool:
    value, rev = state
    if expect == 0:
        return value is None and rev is not None  # create: the key absent (a deleted key is not modelled)
    return rev is None or rev == expect


class _Entry:
    __slots__ = ("op", "index", "call", "match", "prev", "next")

    def __init__(self, op: Op | None, index: int, call: bool) -> None:
        self.op, self.index, self.call = op, index, call
        self.match: _Entry | None = None
        self.prev: _Entry | None = None
        self.next: _Entry | None = None


def _lift(call: _Entry) -> None:
    """Take an operation's call and return entries out of the list."""
    for e in (call, call.match):
        assert e is not None and e.prev is not None
        e.prev.next = e.next
        if e.next is not None:
            e.next.prev = e.prev


def _unlift(call: _Entry) -> None:
    for e in (call.match, call):
        assert e is not None and e.prev is not None
        e.prev.next = e
        if e.next is not None:
            e.next.prev = e


def check(ops: Iterable[Op], max_steps: int = 2_000_000) -> Verdict:
    """Whether the history `ops` of one key is linearizable (see the module docstring)."""
    history = _prune([o for o in ops if not (o.kind == READ and o.outcome != OK)])
    if not history:
        return Verdict(True)
    # entries in time order; at equal times a return comes first (the operations did not overlap)
    points: list[tuple[float, int, int]] = []
    for i, o in enumerate(history):
        points.append((o.start, 1, i))
        points.append((o.end if o.outcome != INFO else INF, 0, i))
    points.sort()
    head = _Entry(None, -1, False)
    calls: dict[int, _Entry] = {}
    last = head
    for _t, is_call, i in points:
        e = _Entry(history[i], i, bool(is_call))
        if is_call:
            calls[i] = e
        else:
            calls[i].match = e
        last.next, e.prev, last = e, last, e
    # operations that must be linearized: every one that completed (an `info` may stay out)
    needed = sum(1 for o in history if o.outcome != INFO)
    done = 0
    state: State = INITIAL
    linearized = 0  # bit set of history indexes
    seen: set[tuple[int, State]] = set()
    stack: list[tuple[_Entry, State, list[State]]] = []  # (call entry, state before, alternatives left)
    entry = head.next
    steps = 0
    best: tuple[int, Op | None] = (0, None)
    def take(call: _Entry, before: State, candidates: list[State]) -> bool:
        """Linearize `call` here, into the first of `candidates` not explored yet (the rest stay on the stack
        for backtracking)."""
        nonlocal state, linearized, done
        assert call.op is not None
        while candidates:
            nxt = candidates.pop(0)
            key = (linearized | (1 << call.index), nxt)
            if key in seen:
                continue
            seen.add(key)
            stack.append((call, before, candidates))
            state, linearized = nxt, key[0]
            done += call.op.outcome != INFO
            _lift(call)
            return True
        return False

    while done < needed:
        steps += 1
        if steps > max_steps:
            return Verdict(None, len(history), steps, "search budget exhausted")
        if entry is not None and entry.call:
            assert entry.op is not None
            entry = head.next if take(entry, state, _steps(state, entry.op)) else entry.next
            continue
        # a return (or the end) reached before its operation could be linearized: undo the last choice
        if entry is not None and done >= best[0]:
            best = (done, entry.op)
        if not stack:
            failed = best[1]
            witness = [o for o in history if failed is not None and o.start <= failed.end and o.end >= failed.start]
            return Verdict(False, len(history), steps,
                           f"{best[0]} of {needed} completed operations linearized; cannot place "
                           f"{_describe(failed)}", witness[:20])
        call, before, alternatives = stack.pop()
        assert call.op is not None
        done -= call.op.outcome != INFO
        linearized &= ~(1 << call.index)
        _unlift(call)
        state = before
        entry = head.next if take(call, before, alternatives) else call.next
    return Verdict(True, len(history), steps)


def _prune(ops: list[Op]) -> list[Op]:
    """Drop what cannot change the verdict but makes the search explode: a write of unknown outcome whose value
    no read returned. Had it taken effect, no read saw it and no compare-and-set could have expected its revision
    (a client expects only revisions it saw), so placing it nowhere explains as much as placing it anywhere,
    with one exception: it may explain a compare-and-set that failed. So every failed compare-and-set that ended
    after such a write began is dropped too (a weaker check there, never a false alarm)."""
    read_values = {o.value for o in ops if o.kind == READ and o.outcome == OK and o.value is not None}
    unseen = [o for o in ops if o.outcome == INFO and o.kind != READ and o.value not in read_values]
    if not unseen:
        return ops
    since = min(o.start for o in unseen)
    dropped = {id(o) for o in unseen}
    return [o for o in ops if id(o) not in dropped and not (o.kind == CAS and o.outcome == FAIL and o.end > since)]


def _describe(op: Op | None) -> str:
    if op is None:
        return "?"
    what = {READ: f"read -> {op.value!r}@{op.revision}", PUT: f"put {op.value!r} -> @{op.revision}",
            CAS: f"cas {op.value!r} if @{op.expect} -> {op.outcome} @{op.revision}"}[op.kind]
    return f"{op.process} {what} [{op.start:.3f}, {op.end:.3f}]"


def by_key(history: Iterable[tuple[str, Op]]) -> dict[str, list[Op]]:
    """Split a history of (key, op) into one per key: linearizability is compositional, so each key is checked
    alone."""
    out: dict[str, list[Op]] = {}
    for key, op in history:
        out.setdefault(key, []).append(op)
    return out
