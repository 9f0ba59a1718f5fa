"""The core path of a client's reads: parse, match, deliver and count its PUB/HPUB messages straight from the
bytes read, without ops, parsed-line objects or a call into the routing code per message.

Realistic traffic rarely repeats a control line (each message its own subject, size and reply), so the
per-line memo of `zonebus.server.fastpath` seldom holds; what does repeat is the subject. `CorePath` keeps,
per subject, where a message on it goes (`SubjectMemo`: the MSG and HMSG line prefixes of each subscriber,
`MSG <subject> <sid>`), valid for one generation of the global account's sublist. A message's line to a
subscriber is then that prefix and the rest of the PUB line as the client wrote it (`[reply] [hdr_len] size`,
checked to be single-space separated): one slice and one concatenation per delivery.

What this path does, it does as `ClientConnection._handle_ops` and `MessageRouting.process_msg` do, for the
cases it takes; everything else goes there, one frame at a time (`ClientConnection.feed_ops`), and the core
path takes over again after it. It takes a client's message only when nothing per message could differ from
the plain delivery: the server has no publish interceptor, forwarder, zone relay or ledger (nor a queue picker,
the workers' or a cluster's, when the subject has queue groups); the client is connected, in the global account
without mappings, has no permissions, is not verbose, and (when pedantic) the subject is a valid publish
subject; every subscriber is a plain client subscription (no max_msgs, no permissions; headers supported for an
HPUB), a server subsystem's internal one (a stream's subjects: `InternalClient.deliver` queues the message as
`deliver_one` would) or the plain interest of a local link to another worker process (one RMSG/HMSG per link,
as `deliver_in_cluster` forwards it, noted for the workers' migration as there), and a queue group gets one
member drawn as `_route_queues` draws it. A request no one receives when the client wants no-responders goes
the general way.

`run` has a compiled twin, `zonebus.server.corerun` (Cython; `setup.py` builds it where a C compiler is there,
and the package works without it): the same decisions with the control line scanned in C. `feed` uses it unless
it is missing or `ZONEBUS_PURE_PYTHON` is set (`IMPLEMENTATION` says which).

Owned by the event loop thread.
"""

from __future__ import annotations

import time
from typing import Any

from zonebus.compiled import twin
from zonebus.server.fastpath import deliver_run
from zonebus.subjects.validate import is_valid_publish_subject

CLIENT = "client"  # (zonebus.server.connection.CLIENT; restated so the compiled module needs no import of it)
INTERNAL = "internal"  # (zonebus.server.connection.INTERNAL)
WORKER = "worker"  # (zonebus.server.connection.WORKER)
TAIL_MAX = 16 * 1024  # a partial message up to this size waits in the parser's buffer as raw bytes
MEMO_MAX = 4096  # subjects remembered (then all are dropped)

# a target: (connection, its MSG line prefix, its HMSG line prefix or None (no headers), subscription); an internal
# subscription's MSG prefix is None (`conn.deliver(sub, subject, reply, hdr_len, data)` takes the message); a local
# link to another worker process gets `RMSG <account> <subject>` / `HMSG ...` and counts in its `memo_sub`, as
# `deliver_in_cluster` and the fast path's entries send it (one per link)
Target = tuple[Any, bytes, Any, Any]


COMPILED = twin("zonebus.server.corerun", "run")
IMPLEMENTATION = "compiled" if COMPILED is not None else "python"


class SubjectMemo:
    """Where a message on one subject goes: plain targets, queue groups (one member drawn per message),
    whether every target takes headers, whether the subject is a valid publish subject, whether a target is
    an internal subscription or a local link (then no run of repeated lines is delivered in one go: `single`),
    and what a message tells the workers' migration when a target is a link (`note`, see `run`)."""

    __slots__ = ("targets", "groups", "headers", "valid", "internal", "single", "links", "note")

    def __init__(self, targets: list, groups: list | None, headers: bool, valid: bool, internal: bool = False,
                 links: list | None = None) -> None:
        self.targets = targets
        self.groups = groups
        self.headers = headers
        self.valid = valid
        self.internal = internal
        self.single = internal or bool(links)
        self.links = bool(links)
        # `ClientConnection.note_routes` as `deliver_in_cluster` calls it: the one link, when it is the only target
        self.note = {links[0]: []} if links and len(links) == 1 and len(targets) == 1 and not groups else None


class CorePath:
    """One server's subject memos and the check of whether the server's setup allows the core path."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.memos: dict[bytes, SubjectMemo | None] = {}
        self.gen = -1

    def server_allows(self) -> bool:
        s = self.server
        return s.publish_interceptor is None and s.forwarder is None and s.zone_relay is None and s.ledger is None

    def memo(self, subject: bytes) -> SubjectMemo | None:
        """The memo of `subject` (built on a miss); None: the subject's messages take the general path."""
        memos = self.memos
        if len(memos) >= MEMO_MAX:
            memos.clear()
        r = self.server.global_account.sublist.match(subject)
        # a queue picker (a cluster's policy, the workers' weights) draws the member: the general path's
        server = self.server
        m = build(subject, r.psubs, r.qsubs, server.global_account.name) \
            if not r.qsubs or server.queue_picker is None else None
        memos[subject] = m
        return m


def _target(sub: Any, subject: bytes, account: bytes = b"$G") -> Target | None:
    conn = sub.conn
    if sub.max_msgs:
        return None
    if conn.kind == INTERNAL:  # (a callback's; it takes headers)
        return (conn, None, None, sub) if sub.callback is not None else None  # type: ignore[return-value]
    if conn.kind == WORKER and sub.queue is None:
        return (conn, b"RMSG " + account + b" " + subject, b"HMSG " + account + b" " + subject, conn.memo_sub)
    if conn.kind != CLIENT or conn.perms is not None:
        return None
    sid = sub.sid
    hmsg = b"HMSG " + subject + b" " + sid if conn.headers else None
    return (conn, b"MSG " + subject + b" " + sid, hmsg, sub)


def build(subject: bytes, psubs: list, qsubs: list, account: bytes = b"$G") -> SubjectMemo | None:
    targets: list = []
    headers = True
    internal = False
    links: list = []
    for sub in psubs:
        t = _target(sub, subject, account)
        if t is None:
            return None
        if t[3] is not sub:  # a link: one message per link, however many of its subscriptions match
            if t[0] in links:
                continue
            links.append(t[0])
        if t[1] is None:
            internal = True
        else:
            headers = headers and t[2] is not None
        targets.append(t)
    groups: list | None = None
    if qsubs:
        groups = []
        for group in qsubs:
            members = []
            for sub in group:
                t = _target(sub, subject)  # (a link's queue interest is no target: the general path's)
                if t is None:
                    return None
                if t[1] is None:
                    internal = True
                else:
                    headers = headers and t[2] is not None
                members.append(t)
            groups.append(members)
    return SubjectMemo(targets, groups, headers, is_valid_publish_subject(subject), internal, links)


def feed(core: CorePath, conn: Any, data: bytes) -> None:
    """Handle one read of client `conn`: its messages on the core path, any other frame by the general one."""
    parser = conn.parser
    if parser.held:  # (never for a client's parser: its owner decides)
        conn.feed_ops(data)
        return
    need = parser.pending_need()  # the rest of a large payload first
    if need:
        if len(data) <= need:
            conn.feed_ops(data)
            return
        conn.feed_ops(data[:need])
        data = data[need:]
        if conn.closed or parser.buffered():
            if not conn.closed:
                conn.feed_ops(data)
            return
    rest = parser.take_rest()  # a partial line, or a message held as raw bytes
    if rest:
        data = rest + data
    conn.last_activity = time.time()
    n = len(data)
    pos = 0
    while pos < n:
        if not allowed(core, conn):  # (checked again after each frame the general path took: a CONNECT, a SUB)
            conn.feed_ops(data[pos:] if pos else data)
            return
        pos = (COMPILED(core, conn, data, pos, TAIL_MAX) if COMPILED is not None and type(data) is bytes
               else run(core, conn, data, pos))
        if pos >= n or conn.closed:
            break
        if pos < 0:  # an incomplete message kept as raw bytes
            return
        # one frame (or the incomplete rest) by the general path, then the core path again
        end = frame_end(data, pos)
        if end < 0:
            conn.feed_ops(data[pos:])
            return
        conn.feed_ops(data[pos:end])
        if conn.closed or parser.buffered() or parser.held:
            if end < n and not conn.closed:
                conn.feed_ops(data[end:])
            return
        pos = end


def allowed(core: CorePath, conn: Any) -> bool:
    """Whether the server's setup and the client's options let its messages take the core path."""
    return (conn.connected and not conn.verbose and conn.perms is None and conn.ledger_in is None
            and conn.account is core.server.global_account and conn.account.mappings is None
            and core.server_allows())


def frame_end(buf: bytes, pos: int) -> int:
    """Where the frame at `pos` ends, when its line and (for a well-formed PUB/HPUB) payload are all there; -1
    otherwise (the general parser then takes the rest of the read)."""
    eol = buf.find(b"\n", pos)
    if eol < 0:
        return -1
    head = buf[pos : pos + 5].upper()
    if head.startswith(b"PUB") or head.startswith(b"HPUB"):
        args = buf[pos:eol].split()
        if len(args) < 3 or not args[-1].isdigit():
            return eol + 1  # (the general parser finds what is wrong)
        stop = eol + 1 + int(args[-1]) + 2
        return stop if stop <= len(buf) else -1
    return eol + 1


def run(core: CorePath, conn: Any, buf: bytes, pos: int) -> int:
    """Deliver the messages from `pos` on while they can take the core path (`allowed`: the caller checked);
    return where it stopped (a frame the general path must see), len(buf) when all were done, or -1 when the
    rest is an incomplete message now in the parser's buffer."""
    server = conn.server
    sublist = server.global_account.sublist
    if sublist.generation != core.gen:
        core.memos.clear()
        core.gen = sublist.generation
    memos = core.memos
    pedantic = conn.pedantic
    headers_ok = conn.headers
    echo = conn.echo
    no_responders = conn.no_responders
    mcl = conn.parser.max_control_line
    max_payload = conn.parser.max_payload
    mark_dirty = server.mark_dirty
    randrange = server.random.randrange
    route_notes = server.route_notes
    n = len(buf)
    find = buf.find
    in_msgs = 0
    in_bytes = 0
    prev = b""
    while pos < n:
        eol = find(b"\n", pos)
        if eol < 0 or eol - pos > mcl or buf[eol - 1] != 13:
            break
        line = buf[pos : eol - 1]
        if 9 in line:
            break
        args = line.split(b" ")
        op = args[0]
        nargs = len(args)
        if op == b"PUB":
            if nargs == 3:
                reply = None
            elif nargs == 4:
                reply = args[2]
            else:
                break
            hdr_len = -1
        elif op == b"HPUB":
            if not headers_ok:
                break
            if nargs == 4:
                reply = None
            elif nargs == 5:
                reply = args[2]
            else:
                break
            htok = args[-2]
            if not htok.isdigit():
                break
            hdr_len = int(htok)
            if hdr_len <= 0:  # (no header block: a plain MSG, the general path's case)
                break
        else:
            break
        stok = args[-1]
        subject = args[1]
        # (sizes go out as the client wrote them, leading zeros included, as nats-server's do)
        if not stok.isdigit() or not subject or (reply is not None and not reply):
            break
        size = int(stok)
        if size > max_payload or hdr_len > size:
            break
        stop = eol + 1 + size
        if stop + 2 > n:  # incomplete: wait for the rest as raw bytes (small), else the general path
            if n - pos <= TAIL_MAX and (stop >= n or buf[stop] == 13):
                conn.parser.hold(buf[pos:])
                conn.in_msgs += in_msgs
                conn.in_bytes += in_bytes
                return -1
            break
        if buf[stop] != 13 or buf[stop + 1] != 10:
            break
        m = memos.get(subject)
        if m is None:
            if subject in memos:
                break
            m = core.memo(subject)
            if m is None:
                break
        if pedantic and not m.valid:
            break
        if hdr_len >= 0 and not m.headers:
            break
        groups = m.groups
        targets = m.targets
        if reply is not None and no_responders and (not echo or (not targets and not groups)):
            break  # (a request that may reach no one: the general path answers it with a 503)
        data = buf[eol + 1 : stop + 2]
        rest = buf[pos + len(op) + 1 + len(subject) : eol + 1]  # " [reply] [hdr_len] size\r\n"
        in_msgs += 1
        in_bytes += size
        for c, mline, hline, sub in targets:
            if c is conn and not echo:
                continue
            if mline is None:  # an internal subscription (`deliver_one`'s work)
                sub.delivered += 1
                c.deliver(sub, subject, reply, hdr_len, data)
                continue
            out = c.out
            out.append((mline if hdr_len < 0 else hline) + rest)
            out.append(data)
            sub.delivered += 1
            c.out_msgs += 1
            c.out_bytes += size
            if not c.dirty:
                c.dirty = True
                mark_dirty(c)
        if groups is not None:
            for members in groups:
                if not echo:  # (as `_route_queues`: the publisher's own members left out)
                    members = [t for t in members if t[0] is not conn]
                k = len(members)
                if not k:
                    continue
                c, mline, hline, sub = members[randrange(k)] if k > 1 else members[0]
                if mline is None:
                    sub.delivered += 1
                    c.deliver(sub, subject, reply, hdr_len, data)
                    continue
                out = c.out
                out.append((mline if hdr_len < 0 else hline) + rest)
                out.append(data)
                sub.delivered += 1
                c.out_msgs += 1
                c.out_bytes += size
                if not c.dirty:
                    c.dirty = True
                    mark_dirty(c)
        if m.links and route_notes:  # (zonebus.workers.migrate: a publisher follows its messages)
            conn.note_routes(m.note)
        if groups is None and line == prev and not m.single:
            # the line twice in a row (a steady publisher's stream): its repeats that follow need no parsing
            head = buf[pos : eol + 1]
            pos = stop + 2
            repeats = []
            while buf.startswith(head, pos):
                stop = pos + len(head) + size
                if stop + 2 > n or buf[stop] != 13 or buf[stop + 1] != 10:
                    break
                repeats.append(buf[pos + len(head) : stop + 2])
                pos = stop + 2
            if repeats:  # delivered together, as the fast path's runs of one line are (fastpath.deliver_run)
                deliver_run([(c, (mline if hdr_len < 0 else hline) + rest, sub) for c, mline, hline, sub in targets
                             if c is not conn or echo], size, repeats, mark_dirty)
                in_msgs += len(repeats)
                in_bytes += len(repeats) * size
        else:
            pos = stop + 2
        prev = line
    conn.in_msgs += in_msgs
    conn.in_bytes += in_bytes
    return pos

