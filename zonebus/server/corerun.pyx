# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, annotation_typing=False
"""The compiled twin of `zonebus.server.corepath.run` (Cython, built when a compiler is there: `setup.py`).

Same contract, same decisions, line for line: the control line is scanned in C (the line's end with `memchr`,
its tokens split at single spaces, sizes read as decimal digits) instead of slicing and splitting Python bytes;
the subject, the rest of the line and the payload are sliced once each, as there, and the deliveries are the
same Python operations. `corepath` uses it unless `ZONEBUS_PURE_PYTHON` is set (the tests run both:
`tests/wire/test_core_path.py`); anything but `bytes` goes to the pure-Python `run`.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memchr, memcmp

from zonebus.server.fastpath import deliver_run

cdef enum:
    MAXTOK = 6  # tokens of a PUB/HPUB line at most (op, subject, reply, header size, size) plus one

cdef inline long long _digits(const char* s, Py_ssize_t a, Py_ssize_t b):
    """The value of s[a:b] when it is 1-18 ASCII digits (as `bytes.isdigit` then `int`); -1 otherwise,
    -2 when longer (bigger than any payload limit)."""
    cdef long long v = 0
    cdef Py_ssize_t i
    cdef char c
    if b <= a:
        return -1
    for i in range(a, b):
        c = s[i]
        if c < 48 or c > 57:
            return -1
    if b - a > 18:
        return -2
    for i in range(a, b):
        v = v * 10 + (s[i] - 48)
    return v


cdef inline int _deliver(c, line, data, sub, long long size, mark_dirty) except -1:
    """One message to one target: its line and payload queued, the counts, the connection marked dirty."""
    out = c.out
    out.append(line)
    out.append(data)
    sub.delivered += 1
    c.out_msgs += 1
    c.out_bytes += size
    if not c.dirty:
        c.dirty = True
        mark_dirty(c)
    return 0


cdef inline int _deliver_internal(c, sub, subject, reply, long long hdr_len, data) except -1:
    """One message to an internal subscription (`deliver_one`'s work; its MSG prefix is None)."""
    sub.delivered += 1
    c.deliver(sub, subject, reply, hdr_len, data)
    return 0


def run(core, conn, bytes buf, Py_ssize_t pos, Py_ssize_t tail_max):
    cdef const char* s = PyBytes_AS_STRING(buf)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(buf)
    cdef Py_ssize_t eol, stop, i, nargs, line_len, prev_pos = -1, prev_len = 0, op_len, hpos, hlen
    cdef Py_ssize_t ts[MAXTOK]
    cdef Py_ssize_t te[MAXTOK]
    cdef long long size, hdr_len, mcl, max_payload
    cdef long long in_msgs = 0, in_bytes = 0
    cdef bint is_hpub, has_reply, pedantic, headers_ok, echo, no_responders
    cdef const char* e
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
    while pos < n:
        e = <const char*>memchr(s + pos, 10, <size_t>(n - pos))
        if e == NULL:
            break
        eol = e - s
        if eol - pos > mcl or eol == 0 or s[eol - 1] != 13:
            break
        line_len = eol - 1 - pos
        if line_len > 0 and memchr(s + pos, 9, <size_t>line_len) != NULL:
            break
        # tokens at single spaces (as `line.split(b" ")`): more than MAXTOK means no PUB/HPUB form
        nargs = 0
        ts[0] = pos
        for i in range(pos, eol - 1):
            if s[i] == 32:
                te[nargs] = i
                nargs += 1
                if nargs >= MAXTOK:
                    break
                ts[nargs] = i + 1
        if nargs >= MAXTOK:
            break
        te[nargs] = eol - 1
        nargs += 1
        op_len = te[0] - ts[0]
        if op_len == 3 and memcmp(s + pos, b"PUB", 3) == 0:
            is_hpub = False
            if nargs == 3:
                has_reply = False
            elif nargs == 4:
                has_reply = True
            else:
                break
            hdr_len = -1
        elif op_len == 4 and memcmp(s + pos, b"HPUB", 4) == 0:
            is_hpub = True
            if not headers_ok:
                break
            if nargs == 4:
                has_reply = False
            elif nargs == 5:
                has_reply = True
            else:
                break
            hdr_len = _digits(s, ts[nargs - 2], te[nargs - 2])
            if hdr_len == -1:
                break
            if hdr_len == 0:  # (no header block: a plain MSG, the general path's case)
                break
            if hdr_len == -2:
                hdr_len = max_payload + 1
        else:
            break
        # (sizes go out as the client wrote them, leading zeros included, as nats-server's do)
        size = _digits(s, ts[nargs - 1], te[nargs - 1])
        if size == -1 or te[1] == ts[1] or (has_reply and te[2] == ts[2]):
            break
        if size == -2 or size > max_payload or hdr_len > size:
            break
        stop = eol + 1 + <Py_ssize_t>size
        if stop + 2 > n:  # incomplete: wait for the rest as raw bytes (small), else the general path
            if n - pos <= tail_max and (stop >= n or s[stop] == 13):
                conn.parser.hold(buf[pos:])
                conn.in_msgs += in_msgs
                conn.in_bytes += in_bytes
                return -1
            break
        if s[stop] != 13 or s[stop + 1] != 10:
            break
        subject = PyBytes_FromStringAndSize(s + ts[1], te[1] - ts[1])
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
        if has_reply and no_responders and (not echo or (not targets and not groups)):
            break  # (a request that may reach no one: the general path answers it with a 503)
        data = PyBytes_FromStringAndSize(s + eol + 1, <Py_ssize_t>size + 2)
        rest = PyBytes_FromStringAndSize(s + te[1], eol + 1 - te[1])  # " [reply] [hdr_len] size\r\n"
        in_msgs += 1
        in_bytes += size
        reply = None
        if has_reply and m.internal:
            reply = PyBytes_FromStringAndSize(s + ts[2], te[2] - ts[2])
        for c, mline, hline, sub in targets:
            if c is conn and not echo:
                continue
            if mline is None:
                _deliver_internal(c, sub, subject, reply, hdr_len, data)
                continue
            _deliver(c, (mline if hdr_len < 0 else hline) + rest, data, sub, size, mark_dirty)
        if groups is not None:
            for members in groups:
                if not echo:  # (as `_route_queues`: the publisher's own members left out)
                    members = [t for t in members if t[0] is not conn]
                k = len(members)
                if not k:
                    continue
                c, mline, hline, sub = members[randrange(k)] if k > 1 else members[0]
                if mline is None:
                    _deliver_internal(c, sub, subject, reply, hdr_len, data)
                    continue
                _deliver(c, (mline if hdr_len < 0 else hline) + rest, data, sub, size, mark_dirty)
        if m.links and route_notes:  # (zonebus.workers.migrate: a publisher follows its messages)
            conn.note_routes(m.note)
        if groups is None and not m.single and prev_pos >= 0 and prev_len == line_len and memcmp(s + prev_pos, s + pos, line_len) == 0:
            # the line twice in a row (a steady publisher's stream): its repeats that follow need no parsing
            hpos = pos
            hlen = eol + 1 - pos
            pos = stop + 2
            repeats = []
            while pos + hlen <= n and memcmp(s + pos, s + hpos, hlen) == 0:
                stop = pos + hlen + <Py_ssize_t>size
                if stop + 2 > n or s[stop] != 13 or s[stop + 1] != 10:
                    break
                repeats.append(PyBytes_FromStringAndSize(s + pos + hlen, <Py_ssize_t>size + 2))
                pos = stop + 2
            if repeats:  # delivered together, as the fast path's runs of one line are (fastpath.deliver_run)
                deliver_run([(c, (mline if hdr_len < 0 else hline) + rest, sub) for c, mline, hline, sub in targets
                             if c is not conn or echo], size, repeats, mark_dirty)
                in_msgs += len(repeats)
                in_bytes += len(repeats) * size
            prev_pos, prev_len = hpos, line_len
        else:
            prev_pos, prev_len = pos, line_len
            pos = stop + 2
    conn.in_msgs += in_msgs
    conn.in_bytes += in_bytes
    return pos
