"""An S3 stand-in for tests and benchmarks: an HTTP proxy in front of moto's S3 server that behaves like S3
(latency per request kind, faults on demand) and counts every request.

`S3Proxy(upstream)` starts `python -m zonebus.testing.s3proxy` as its own process (so that it shares no event
loop and no GIL with the load generator or with moto) and talks to its admin endpoint:

    with S3Proxy("http://127.0.0.1:5000") as proxy:        # moto's endpoint
        client = boto3.client("s3", endpoint_url=proxy.endpoint, ...)
        proxy.counts()    # {"kinds": {"PUT": {"requests", "req_bytes", "resp_bytes", "errors", "delay_ms",
                          #                    "upstream_ms"}, ...},
                          #  "prefixes": {"zb/streams/ORDERS/log/": {"PUT": {...}}}, "faults": {...}, "total": n}
        proxy.reset()
        proxy.set_faults(slowdown=0.1, timeout=0.0, reset=0.0, lost=0.0, kind="PUT", prefix="zb/zonerouter/")

Every request is forwarded to moto unchanged (path-style addressing; keep-alive, chunked bodies and
`Expect: 100-continue` work: the proxy answers `100 Continue` itself, reads the body, then forwards the whole
request; interim answers from moto are dropped) and the answer is streamed back. A request is delayed before it
is forwarded by a lognormal draw for its kind: PUT and COPY p50 20 ms / p99 80 ms, GET, LIST, HEAD, DELETE
p50 10 ms / p99 40 ms (`latency=False`: none; or a mapping kind -> (p50 ms, p99 ms)). `delay_ms` sums the
injected delays, `upstream_ms` the time moto took to answer (request sent -> answer's head): when moto is
saturated, latency beyond the injected one is moto's, not S3's.

Kinds, as S3 prices them: PUT (PutObject, UploadPart, CreateBucket, and every POST on an object: multipart
create and complete), COPY (a PUT with `x-amz-copy-source`), GET (an object, or a bucket's configuration), LIST
(ListObjects/ListObjectsV2, ListMultipartUploads, ListParts), HEAD, DELETE (DeleteObject, abort multipart,
DeleteObjects as a POST `?delete`). Prefixes: the key's folder (for a LIST, its `prefix` parameter's folder),
at most `prefix_depth` components, with all-digit components as `*` (a request on a key ending in `/`, a
folder marker, is counted under `<folder> (folder marker)`).

Faults (admin `POST /faults`): with probability `slowdown` a `503 SlowDown` with S3's XML error body, with
`timeout` the request is held unanswered until the client gives up (or `hold` seconds), with `reset` the
connection is reset (RST) halfway through the request body (right after the headers if it has none), with
`lost` the request is carried out upstream but the connection is reset before the answer (a PUT that landed
although its client saw an error); `kind`/`prefix` restrict them, `limit` caps how many are injected.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from zonebus.testing.processes import stop_child

HOST = "127.0.0.1"
CHUNK = 256 * 1024
FAULTS = ("slowdown", "timeout", "reset", "lost")
KINDS = ("PUT", "COPY", "GET", "LIST", "HEAD", "DELETE")
DEFAULT_LATENCY_MS: dict[str, tuple[float, float]] = {
    "PUT": (20.0, 80.0), "COPY": (20.0, 80.0),
    "GET": (10.0, 40.0), "LIST": (10.0, 40.0), "HEAD": (10.0, 40.0), "DELETE": (10.0, 40.0)}
NO_LATENCY: dict[str, tuple[float, float]] = {k: (0.0, 0.0) for k in KINDS}
Z99 = 2.3263478740408408  # the standard normal's 99th percentile
LIST_PARAMS = {"list-type", "prefix", "delimiter", "marker", "max-keys", "continuation-token", "start-after",
               "encoding-type", "fetch-owner", "uploads", "key-marker", "upload-id-marker", "x-id"}
SLOWDOWN_BODY = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                 "<Message>Please reduce your request rate.</Message><RequestId>{rid}</RequestId>"
                 "<HostId>zonebus-s3proxy</HostId></Error>")


class _Dropped(Exception):
    """The client went away, or a fault ended the connection."""


# -- requests: framing and classification ------------------------------------------------------------


class Head:
    """A request's or response's first line and headers, as read (names compared case-insensitively)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        lines = raw.decode("latin-1").split("\r\n")
        self.first = lines[0]
        self.headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:] if ":" in line]

    def get(self, name: str, default: str = "") -> str:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return default

    def has_token(self, name: str, token: str) -> bool:
        return token in [t.strip().lower() for t in self.get(name).split(",")]


def classify(method: str, target: str, copy_source: bool) -> tuple[str, str]:
    """(kind, key or LIST prefix) of a path-style request `method target`."""
    parts = urlsplit(target)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    path = unquote(parts.path).lstrip("/")
    key = path.split("/", 1)[1] if "/" in path else ""
    if not key:  # the bucket itself
        if method == "GET":
            if "uploads" in query or not query or set(query) <= LIST_PARAMS:
                return "LIST", query.get("prefix", "")
            return "GET", ""
        if method == "POST":
            return ("DELETE" if "delete" in query else "PUT"), ""
        return {"HEAD": "HEAD", "DELETE": "DELETE"}.get(method, "PUT"), ""
    if method == "PUT":
        return ("COPY" if copy_source else "PUT"), key
    if method == "POST":
        return "PUT", key
    if method == "GET":
        return ("LIST" if "uploadId" in query else "GET"), key
    return {"HEAD": "HEAD", "DELETE": "DELETE"}.get(method, "GET"), key


def prefix_of(key: str, depth: int) -> str:
    """The folder of `key` (everything up to its last `/`), at most `depth` components, digits as `*`."""
    folder = key.rsplit("/", 1)[0].split("/") if "/" in key else []
    comps = ["*" if c.isdigit() else c for c in folder[:depth]]
    return "/".join(comps) + "/" if comps else "/"


# -- the proxy -----------------------------------------------------------------------------------------


def _stat() -> dict[str, float]:
    return {"requests": 0, "req_bytes": 0, "resp_bytes": 0, "errors": 0, "delay_ms": 0.0, "upstream_ms": 0.0}


class S3ProxyServer:
    """The proxy's event-loop side: forwarding, delays, counters, faults."""

    def __init__(self, upstream: str, latency: Mapping[str, tuple[float, float]], seed: int | None = None,
                 prefix_depth: int = 4) -> None:
        u = urlsplit(upstream)
        self.up_host, self.up_port = u.hostname or HOST, u.port or 80
        self.rng = random.Random(seed)
        self.prefix_depth = prefix_depth
        self.latency: dict[str, tuple[float, float]] = dict(NO_LATENCY)
        self.set_latency(latency)
        self.faults: dict[str, Any] = {}
        self.reset()
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    # counters
    def reset(self) -> None:
        self.kinds: defaultdict[str, dict[str, float]] = defaultdict(_stat)
        self.prefixes: defaultdict[str, defaultdict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(_stat))
        self.injected = {name: 0 for name in FAULTS}

    def snapshot(self) -> dict[str, Any]:
        return {"kinds": {k: dict(v) for k, v in self.kinds.items()},
                "prefixes": {p: {k: dict(v) for k, v in ks.items()} for p, ks in self.prefixes.items()},
                "faults": dict(self.injected), "total": sum(int(v["requests"]) for v in self.kinds.values())}

    def _count(self, kind: str, prefix: str, field: str, n: float) -> None:
        self.kinds[kind][field] += n
        self.prefixes[prefix][kind][field] += n

    # configuration
    def set_latency(self, latency: Mapping[str, Any]) -> None:
        for kind, (p50, p99) in latency.items():
            if kind not in KINDS:
                raise ValueError(f"unknown request kind {kind!r} (one of {', '.join(KINDS)})")
            if p50 < 0 or p99 < p50:
                raise ValueError(f"{kind}: need 0 <= p50 <= p99, got {p50}, {p99}")
            self.latency[kind] = (float(p50), float(p99))

    def set_faults(self, spec: Mapping[str, Any]) -> None:
        known = {*FAULTS, "kind", "prefix", "limit", "hold"}
        unknown = set(spec) - known
        if unknown:
            raise ValueError(f"unknown fault keys {sorted(unknown)} (known: {sorted(known)})")
        total = sum(float(spec.get(k) or 0) for k in FAULTS)
        if total > 1.0:
            raise ValueError("fault probabilities add up to more than 1")
        self.faults = dict(spec)

    def delay(self, kind: str) -> float:
        """A lognormal draw (seconds) with the kind's p50 and p99."""
        p50, p99 = self.latency.get(kind, (0.0, 0.0))
        if p50 <= 0:
            return 0.0
        sigma = math.log(p99 / p50) / Z99 if p99 > p50 else 0.0
        return self.rng.lognormvariate(math.log(p50 / 1000.0), sigma)

    def draw_fault(self, kind: str, key: str) -> str:
        f = self.faults
        if not f or (f.get("kind") and f["kind"] != kind) or (f.get("prefix") and not key.startswith(f["prefix"])):
            return ""
        if f.get("limit") is not None and sum(self.injected.values()) >= int(f["limit"]):
            return ""
        r, edge = self.rng.random(), 0.0
        for name in FAULTS:
            edge += float(f.get(name) or 0)
            if r < edge:
                self.injected[name] += 1
                return name
        return ""

    # serving
    def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                    return
                head = Head(raw)
                up, keep = await self._one(head, reader, writer, up)
                if not keep:
                    return
        except (_Dropped, OSError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            if up is not None:
                up[1].close()
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _one(self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
                   ) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None, bool]:
        """Serve one request; returns the upstream connection to reuse and whether the client's stays open."""
        method, target = head.first.split(" ")[:2]
        kind, key = classify(method, target, bool(head.get("x-amz-copy-source")))
        prefix = prefix_of(key, self.prefix_depth)  # (for a LIST, `key` is its prefix parameter)
        if kind != "LIST" and key.endswith("/"):
            prefix += " (folder marker)"
        self._count(kind, prefix, "requests", 1)
        fault = self.draw_fault(kind, key)
        if head.has_token("expect", "100-continue"):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if fault == "reset":
            await _read_some(head, reader)
            _reset(writer)
            raise _Dropped
        body, size = await _read_body(head, reader)
        self._count(kind, prefix, "req_bytes", size)
        wait = self.delay(kind)
        if wait:
            self._count(kind, prefix, "delay_ms", wait * 1000.0)
            await asyncio.sleep(wait)
        if fault == "timeout":
            with contextlib.suppress(asyncio.TimeoutError, OSError):
                await asyncio.wait_for(reader.read(), float(self.faults.get("hold") or 600))
            raise _Dropped
        client_keeps = not head.has_token("connection", "close") and not head.first.endswith("HTTP/1.0")
        if fault == "slowdown":
            self._count(kind, prefix, "errors", 1)
            text = SLOWDOWN_BODY.format(rid=f"{self.rng.getrandbits(64):016X}").encode()
            writer.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                         + f"Content-Length: {len(text)}\r\nx-amz-request-id: zbproxy\r\n\r\n".encode()
                         + (b"" if method == "HEAD" else text))
            await writer.drain()
            return up, client_keeps
        for attempt in range(2):  # a kept-alive upstream connection may have been closed meanwhile: reopen once
            if up is None:
                try:
                    up = await asyncio.open_connection(self.up_host, self.up_port)
                except OSError:
                    writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    await writer.drain()
                    return None, False
            try:
                sent = time.monotonic()
                up[1].write(head.raw + body)
                await up[1].drain()
                rhead = await _read_response_head(up[0])
                self._count(kind, prefix, "upstream_ms", (time.monotonic() - sent) * 1000.0)
                break
            except (OSError, asyncio.IncompleteReadError):
                up[1].close()
                up = None
                if attempt:
                    raise _Dropped
        status = int(rhead.first.split(" ")[1])
        if fault == "lost":  # done upstream; the client never hears of it
            up[1].close()
            _reset(writer)
            raise _Dropped
        if status >= 400:
            self._count(kind, prefix, "errors", 1)
        writer.write(rhead.raw)
        n, up_keeps = await _relay_body(rhead, method, up[0], writer)
        self._count(kind, prefix, "resp_bytes", n)
        await writer.drain()
        if not up_keeps or rhead.has_token("connection", "close"):
            up[1].close()
            up = None
        return up, client_keeps and up_keeps


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a dropped connection looks to the client."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _read_some(head: Head, reader: asyncio.StreamReader) -> None:
    """Read about half the request's body (nothing if it has none), for a reset in the middle of an upload."""
    length = int(head.get("content-length") or 0)
    if length:
        await reader.readexactly(max(1, length // 2))
    elif head.has_token("transfer-encoding", "chunked"):
        await reader.read(1)


async def _read_body(head: Head, reader: asyncio.StreamReader) -> tuple[bytes, int]:
    """The request body as it was sent (chunked framing kept) and its decoded length."""
    if head.has_token("transfer-encoding", "chunked"):
        raw, size = bytearray(), 0
        while True:
            line = await reader.readuntil(b"\r\n")
            raw += line
            n = int(line.split(b";")[0].strip(), 16)
            if n == 0:
                while True:  # trailers, up to the empty line
                    t = await reader.readuntil(b"\r\n")
                    raw += t
                    if t == b"\r\n":
                        return bytes(raw), size
            raw += await reader.readexactly(n + 2)
            size += n
    length = int(head.get("content-length") or 0)
    body = await reader.readexactly(length) if length else b""
    return body, length


async def _read_response_head(reader: asyncio.StreamReader) -> Head:
    while True:  # interim answers (100 Continue) were already given to the client by the proxy
        rhead = Head(await reader.readuntil(b"\r\n\r\n"))
        status = int(rhead.first.split(" ")[1])
        if not 100 <= status < 200:
            return rhead


async def _relay_body(rhead: Head, method: str, up: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> tuple[int, bool]:
    """Stream a response body to the client; (body bytes, whether the upstream connection can be reused)."""
    status = int(rhead.first.split(" ")[1])
    if method == "HEAD" or status in (204, 304):
        return 0, True
    if rhead.has_token("transfer-encoding", "chunked"):
        size = 0
        while True:
            line = await up.readuntil(b"\r\n")
            writer.write(line)
            n = int(line.split(b";")[0].strip(), 16)
            if n == 0:
                while (t := await up.readuntil(b"\r\n")) != b"\r\n":
                    writer.write(t)
                writer.write(b"\r\n")
                return size, True
            await _copy(up, writer, n + 2)
            size += n
    length = rhead.get("content-length")
    if length:
        await _copy(up, writer, int(length))
        return int(length), True
    size = 0
    while data := await up.read(CHUNK):  # no framing: the body runs to the end of the connection
        writer.write(data)
        size += len(data)
    return size, False


async def _copy(up: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    while n > 0:
        data = await up.read(min(n, CHUNK))
        if not data:
            raise _Dropped
        writer.write(data)
        n -= len(data)
        if writer.transport.get_write_buffer_size() > CHUNK:
            await writer.drain()


# -- the admin endpoint ----------------------------------------------------------------------------------


async def _admin(proxy: S3ProxyServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """GET /counts, POST /reset, GET|POST /faults, GET|POST /latency (JSON in, JSON out; one request each)."""
    try:
        head = Head(await reader.readuntil(b"\r\n\r\n"))
        body, _ = await _read_body(head, reader)
        method, path = head.first.split(" ")[:2]
        status, doc = 200, {}
        try:
            arg = json.loads(body) if body else {}
            if path == "/counts":
                doc = proxy.snapshot()
            elif path == "/reset" and method == "POST":
                proxy.reset()
                doc = {"ok": True}
            elif path == "/faults":
                if method == "POST":
                    proxy.set_faults(arg)
                doc = {"faults": proxy.faults, "injected": proxy.injected}
            elif path == "/latency":
                if method == "POST":
                    proxy.set_latency(arg)
                doc = {"latency_ms": proxy.latency}
            else:
                status, doc = 404, {"error": f"no {method} {path}"}
        except (ValueError, TypeError) as exc:
            status, doc = 400, {"error": str(exc)}
        text = json.dumps(doc).encode()
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(text)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + text)
        await writer.drain()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def _serve(args: argparse.Namespace) -> None:
    latency = NO_LATENCY if args.latency == "off" else DEFAULT_LATENCY_MS
    if args.latency not in ("off", "default"):
        latency = {k: tuple(v) for k, v in json.loads(args.latency).items()}
    proxy = S3ProxyServer(args.upstream, latency, args.seed, args.prefix_depth)
    server = await asyncio.start_server(proxy.accept, HOST, args.port, limit=1 << 20, backlog=1024)
    admin = await asyncio.start_server(lambda r, w: _admin(proxy, r, w), HOST, 0)
    sys.stdout.write(json.dumps({"port": server.sockets[0].getsockname()[1],
                                 "admin": admin.sockets[0].getsockname()[1]}) + "\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    await stdin.read()  # runs until the controlling process closes our stdin (or dies)
    server.close()
    admin.close()
    await proxy.close()


# -- the controlling side ----------------------------------------------------------------------------


class S3Proxy:
    """The proxy in a child process. `latency`: True (S3-like defaults), False (none) or kind -> (p50, p99) ms."""

    def __init__(self, upstream: str, latency: bool | Mapping[str, tuple[float, float]] = True,
                 seed: int | None = None, prefix_depth: int = 4, port: int = 0) -> None:
        spec = "default" if latency is True else "off" if latency is False else json.dumps(dict(latency))
        cmd = [sys.executable, "-m", "zonebus.testing.s3proxy", "--upstream", upstream, "--latency", spec,
               "--prefix-depth", str(prefix_depth), "--port", str(port)]
        if seed is not None:
            cmd += ["--seed", str(seed)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"s3 proxy did not start (exit {self.proc.returncode})")
        ports = json.loads(line)
        self.port, self.admin_port = int(ports["port"]), int(ports["admin"])
        self.endpoint = f"http://{HOST}:{self.port}"

    def _call(self, path: str, body: object = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{HOST}:{self.admin_port}{path}", data=data,
                                     method="GET" if data is None else "POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def counts(self) -> dict:
        return self._call("/counts")

    def reset(self) -> None:
        self._call("/reset", {})

    def set_faults(self, slowdown: float = 0.0, timeout: float = 0.0, reset: float = 0.0, lost: float = 0.0,
                   kind: str | None = None, prefix: str | None = None, limit: int | None = None,
                   hold: float | None = None) -> dict:
        spec = {"slowdown": slowdown, "timeout": timeout, "reset": reset, "lost": lost, "kind": kind,
                "prefix": prefix, "limit": limit, "hold": hold}
        return self._call("/faults", {k: v for k, v in spec.items() if v is not None})

    def clear_faults(self) -> None:
        self._call("/faults", {})

    def set_latency(self, latency: Mapping[str, tuple[float, float]]) -> dict:
        return self._call("/latency", {k: list(v) for k, v in latency.items()})

    def latency(self) -> dict[str, tuple[float, float]]:
        """The injected latency now: kind -> (p50 ms, p99 ms)."""
        return {k: (float(v[0]), float(v[1])) for k, v in self._call("/latency")["latency_ms"].items()}

    def stop(self) -> None:
        stop_child(self.proc)

    def __enter__(self) -> S3Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kind_totals(counts: Mapping[str, Any], field: str = "requests") -> dict[str, int]:
    """kind -> `field` (requests, req_bytes, resp_bytes, ...) from a `counts()` answer, every kind present."""
    return {k: int(counts.get("kinds", {}).get(k, {}).get(field, 0)) for k in KINDS}


def main() -> None:
    ap = argparse.ArgumentParser(description="an S3 proxy that delays, counts and breaks requests")
    ap.add_argument("--upstream", required=True, help="moto's endpoint, http://host:port")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", default="default", help='"default", "off" or JSON {kind: [p50_ms, p99_ms]}')
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--prefix-depth", type=int, default=4)
    args = ap.parse_args()
    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
