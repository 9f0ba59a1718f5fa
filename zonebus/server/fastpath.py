"""The publish fast path: the memo of a repeated message line, its building, its check and its replay.

Most traffic repeats control lines (`PUB orders.eu 512`, `RMSG $G orders.eu 512`). The first message of a
line takes the full path (`zonebus.server.routing`: match, interceptors, forwarders, queue policy); from
then on the line's *memo* (where such a message went) is replayed for every message with that very line,
while the subscriptions it was built from hold.

The memo format, in one place:

- an entry is the tuple `(conn, line, sub)` (`Entry`): the connection to write to, the control line it gets
  (`MSG <subject> <sid> <size>` for a client, an RMSG line for a route or worker link, or what a hook put
  there: a gateway's RMSG, a zone relay frame's line) and the subscription the delivery counts in (a link's
  entry counts in the link's `memo_sub`, which is also how the zone relay tells plain RMSG entries apart);
- a memo is a list of entries in delivery order (`Memo`); None means "this line takes the full path";
- a client's PUB line keeps its memo on its parsed header, `PubLine` (the client's parser makes them):
  `gen` (the account sublist's generation it was built under; -1: no message yet, -2: one message, the next
  one builds the memo), `memo`, `qmemo` (one list of entries per queue group, one member drawn per message)
  and `ledger_n` (messages replayed since the ledger last counted them, `ledger_hooks.settle`);
- a link keeps its memos in a dict of its own, message header -> `(generation, memo or None)`, at most
  `MEMO_MAX` of the link's kind (then cleared).

The check: a memo is valid while its generation equals its sublist's `generation` (bumped by every
subscription change and by `Sublist.touch()`: interest of links, interceptors, zone relay sets, gateway
modes). A client's memo holds also only while the client is not `verbose`. The two checks are written out
where messages come in (`ClientConnection._handle_ops`, `LinkConnection._process`): one comparison each.

Building: `entries` is the one rule of what a memo can hold, for every kind of source (clients, routes,
workers, gateways); `client_memo` remembers a client's PUB line (on the full path, from `process_msg`),
`link_memo` and `relay_memo` are the route and worker links' builders (`LinkConnection.build_memo` /
`build_relay_memo`), `link_memo_miss` fills a link's dict. A gateway's builder stays in `zonebus.gateway`
(its `_GR_.` rule) on `entries`; extensions add their deliveries through the hooks' `memo_entries`
(`zonebus.server.hooks`).

Replay: `replay` (a link's message: the ledger counted per message), `deliver_run` (a run of messages with
one line, clients and links: one slice assignment per connection) and `replay_run` (a link's run, with the
ledger). The callers bind them to module globals at import (no attribute lookup per message). A client's
single message is replayed by the same loop as `replay`'s, without the ledger (a client's line counts it
later, `ledger_n`) and with one member drawn per queue group, written out in `ClientConnection._handle_ops`:
a call there costs about 500 instructions per message (+4.5% with alternating lines, `bench/instructions.py`
with two subjects), so it stays unrolled.
Owned by the event loop thread; imports no extension (routes and gateways call it, not the other way round).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zonebus.protocol.client_parser import PubHeader
from zonebus.protocol.route_parser import MsgHeader, msg_line
from zonebus.server.connection import ACCOUNT, CLIENT, LINKS, ROUTE, Connection
from zonebus.subjects.sublist import MatchResult, Subscription

if TYPE_CHECKING:
    from zonebus.server.routing import MessageRouting

Entry = tuple[Connection, bytes, Subscription]  # (conn, control line, sub): see the module's docstring
Memo = list[Entry]
MEMO_MAX = 256  # memos a link keeps (a kind may set its own `MEMO_MAX`); all are dropped when it is full


class PubLine(PubHeader):
    """A client's parsed PUB/HPUB line with the fast path's fields (the format: the module's docstring). The
    client's parser caches reply-less lines, so a repeated line is this very object each time."""

    __slots__ = ("gen", "memo", "qmemo", "ledger_n")

    def __init__(self, subject: bytes, reply: bytes | None, hdr_len: int, size: int) -> None:
        super().__init__(subject, reply, hdr_len, size)
        self.gen = -1  # -1: no message yet, -2: one (the next one builds `memo`), else the sublist generation
        self.memo: Memo | None = None
        self.qmemo: list[Memo] | None = None  # queue groups (lists of entries), one member drawn per message
        self.ledger_n = 0  # fast-path messages not yet counted in the ledger (see server/ledger_hooks.py)


def forget(server: MessageRouting, src: Connection, hdr: PubLine) -> None:
    """The line's next messages take the full path (until a later one remembers it again). Its fast-path
    messages not counted yet are settled first, along the memo they were replayed on."""
    if hdr.ledger_n and server.ledger is not None:
        server.ledger.settle(src, hdr)
    hdr.memo = hdr.qmemo = None


# -- building ----------------------------------------------------------------------------------------------
def entries(src: Connection, subs: list[Subscription], subject: bytes, size: int, account: bytes) -> Memo | None:
    """The entries of a plain, reply-less message from `src` to the subscriptions `subs`, or None when one of
    them needs the full path. A client's subscription gets its MSG line (None for one that unsubscribes after
    some messages, or whose permissions deny deliveries: checked per message); `src`'s own are left out when
    it asked for no echo. A link's plain interest (route, worker) gets one RMSG line of `account` per link,
    none to a link of `src`'s own kind (one hop per kind). Anything else needs the full path: internal
    subscribers, leaf nodes, a link's queue group member."""
    out: Memo = []
    links: set[Connection] = set()
    src_kind = src.kind
    for sub in subs:
        conn = sub.conn
        kind = conn.kind
        if kind == CLIENT:
            if sub.max_msgs or (conn.perms is not None and conn.perms.deliver_deny):
                return None
            if conn is src and not src.echo:
                continue
            out.append((conn, b"MSG %b %b %d\r\n" % (subject, sub.sid, size), sub))
        elif kind in LINKS and sub.queue is None:
            if kind != src_kind and conn not in links:
                links.add(conn)
                out.append((conn, msg_line(account, subject, None, None, -1, size), conn.memo_sub))
        else:
            return None
    return out


def relayed_entries(server: MessageRouting, src: Connection, psubs: list[Subscription], subject: bytes,
                    size: int, account: bytes) -> Memo | None:
    """`entries`, with the zone relay's plan applied to what goes to routes (one relay frame per remote zone
    where several of its servers want the message: zonebus.cluster.relay)."""
    out = entries(src, psubs, subject, size, account)
    zr = server.zone_relay
    if out is not None and zr is not None:
        out = zr.memo_entries(subject, size, account, out)
    return out


def client_memo(server: MessageRouting, src: Connection, hdr: PubLine, r: MatchResult) -> None:
    """Remember the deliveries of a client's reply-less PUB line (`r`, the match of its subject) on the line,
    when they can be replayed: plain client subscribers, routes and workers, and what the forwarder (gateways)
    and the zone relay add; queue groups only on a lone server without a ledger (elsewhere the cluster
    policy, gateways and the decision counts need the full path). Settles the line's ledger count first."""
    forget(server, src, hdr)
    acc = src.account
    hdr.gen = acc.sublist.generation
    fwd = server.forwarder if acc is server.global_account else None
    if hdr.reply is not None or hdr.hdr_len >= 0:
        return
    subject, size = hdr.subject, hdr.size
    memo = relayed_entries(server, src, r.psubs, subject, size, acc.name)
    if memo is None or (fwd is not None and not fwd.memo_entries(subject, size, memo)):
        return
    if r.qsubs:
        if server.queue_picker is not None or fwd is not None or server.ledger is not None:
            return
        qmemo = []
        for group in r.qsubs:
            members = entries(src, group, subject, size, acc.name)
            if members is None:
                return
            if members:
                qmemo.append(members)
        hdr.qmemo = qmemo
    hdr.memo = memo


def link_memo(conn: Any, subject: bytes, size: int) -> Memo | None:
    """A route's or worker link's memo of a plain RMSG (`conn.build_memo`): local client deliveries (a message
    from a route is delivered here only) and one RMSG per link of the other kind (the worker holding a
    server's routes passes it on to its other workers, and the other way round), with the zone relay's plan
    applied to what goes to routes."""
    server = conn.server
    psubs = server.sublist.match(subject).psubs
    if conn.kind == ROUTE:  # (a route's message goes to no route: no relay plan)
        return entries(conn, psubs, subject, size, ACCOUNT)
    return relayed_entries(server, conn, psubs, subject, size, ACCOUNT)


def relay_memo(conn: Any, subject: bytes, size: int) -> Memo | None:
    """A plain zone relay frame's memo (`ZMSG`, zonebus.cluster.relay; `conn.build_relay_memo`): `link_memo`'s
    deliveries and one RMSG per route of this server's zone that has interest and takes part in relaying."""
    out = conn.build_memo(subject, size)
    server = conn.server
    zr = server.zone_relay
    if out is None or zr is None:
        return None
    routes: set[Connection] = set()
    for sub in server.sublist.match(subject).psubs:
        other = sub.conn
        if other.kind == ROUTE and other is not conn and other not in routes and zr.fans_out_to(other):
            routes.add(other)
            out.append((other, msg_line(ACCOUNT, subject, None, None, -1, size), other.memo_sub))
    return out


def link_memo_miss(conn: Any, memos: dict[MsgHeader, tuple[int, Memo | None]], hdr: MsgHeader) -> Memo | None:
    """A link's plain message whose line has no valid memo in `memos`: build it (the kind's `build_memo`, or
    `build_relay_memo` for a relay frame) and keep it under the current generation."""
    if len(memos) >= conn.MEMO_MAX:
        memos.clear()
    memo = conn.build_relay_memo(hdr.subject, hdr.size) if hdr.relay else conn.build_memo(hdr.subject, hdr.size)
    memos[hdr] = (conn.server.sublist.generation, memo)
    return memo


# -- replay ------------------------------------------------------------------------------------------------
def replay(server: Any, memo: Memo, subject: bytes, size: int, payload: bytes) -> None:
    """A link's message along its line's memo, counted in the ledger of each connection that keeps one."""
    for conn, line, sub in memo:
        out = conn.out
        out.append(line)
        out.append(payload)
        sub.delivered += 1
        conn.out_msgs += 1
        conn.out_bytes += size
        if conn.ledger_out is not None:
            server.ledger_count(conn.ledger_out, subject, len(line) + size + 2)
        if not conn.dirty:
            conn.dirty = True
            server.mark_dirty(conn)


def deliver_run(memo: Memo, size: int, run: list[bytes], mark_dirty: Callable[[Connection], None]) -> None:
    """Queue a run of payloads (`run`, each with its CRLF) along a memo that holds for all of them: each
    connection's line interleaved with the payloads by one slice assignment. A connection with several
    entries gets them message by message, in the order one message at a time gives. Counts what each sub and
    conn delivered (not the ledger: `replay_run` for links; a client's line counts it later)."""
    k = len(run)
    if len(memo) > 1 and len({conn for conn, _, _ in memo}) < len(memo):
        for data in run:
            for conn, line, _ in memo:
                conn.out.append(line)
                conn.out.append(data)
    else:
        frames = [b""] * (2 * k)
        frames[1::2] = run
        for conn, line, _ in memo:
            frames[::2] = [line] * k
            conn.out.extend(frames)
    total = k * size
    for conn, _, sub in memo:
        sub.delivered += k
        conn.out_msgs += k
        conn.out_bytes += total
        if not conn.dirty:
            conn.dirty = True
            mark_dirty(conn)


def replay_run(server: Any, memo: Memo, subject: bytes, size: int, run: list[bytes]) -> None:
    """A link's run of messages with one line (`deliver_run`), counted in the ledgers per message."""
    deliver_run(memo, size, run, server.mark_dirty)
    k = len(run)
    for conn, line, _ in memo:
        if conn.ledger_out is not None:
            for _ in range(k):
                server.ledger_count(conn.ledger_out, subject, len(line) + size + 2)
