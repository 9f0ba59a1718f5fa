"""A byte-counting TCP proxy on loopback, for measuring the traffic between servers of a cluster.

`ByteProxy.add(src, dst, target_port)` opens a listening port on 127.0.0.1 that forwards every connection to
127.0.0.1:`target_port` (dst's route port); give that port to server `src` as its route to `dst`. Every byte
read from the dialling side is counted as (src, dst), every byte read from the target as (dst, src): all
bytes, whatever the protocol. One link per ordered pair (src, dst) means a route is counted whichever side
dialled it. A link added with src `"*"` takes connections from anyone (a gateway URL that every server of
another cluster may dial): each accepted connection is counted under `"pid:<n>"`, the process that dialled it
(found with `ss -p` from the connection's source port before any byte is relayed; `"pid:?"` if not found),
so that a caller who knows its servers' pids can name both ends.
`route_ports()` is the set of ports a route through a proxy shows as its remote port (the
listening ports, and the local ports of the proxy's own outgoing connections), so that a caller can check
that no route bypasses the proxies.

Partitions (the chaos campaigns' nemesis, `zonebus.testing.nemesis`): `block(pairs)` cuts the links of the
given (src, dst) pairs: their live connections are reset and new ones are closed as soon as they are accepted
(the dialler sees a refused route and retries), both directions of the route, as a cut cable; `stall(flows)`
holds every byte flowing from one named server to another (on the links of either pair, whoever dialled):
the pump stops reading, so the bytes wait in the kernel's buffers and then the sender's, as a one-way
partition leaves a TCP connection; `heal()` lifts every block and stall (held bytes then flow on).

For benchmarks the proxy runs in its own process, so that it does not share an event loop (or the GIL) with
the load generator: `ProxyProcess` drives `python -m zonebus.testing.byteproxy`, which takes one JSON command
per line on stdin and answers one JSON line on stdout: `add` {src, dst, target} -> {port}; `counts` ->
{counts, route_ports, connections}; `reset`; `block` {pairs: [[src, dst], ...]} and `stall` {flows: [[from, to],
...]} -> {closed: connections reset}; `heal` -> {ok}.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass, field

from zonebus.testing.processes import stop_child

HOST = "127.0.0.1"
CHUNK = 256 * 1024
ANYONE = "*"  # a link's src: whoever dials it, named by its pid


def dialler_pid(src_port: int, dst_port: int) -> str:
    """`pid:<n>` of the process owning the loopback socket 127.0.0.1:src_port -> :dst_port (`ss -p`), or
    `pid:?`."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{src_port} and dport = :{dst_port} )"],
                         capture_output=True, text=True, check=False).stdout
    found = re.search(r"pid=(\d+)", out)
    return f"pid:{found.group(1)}" if found else "pid:?"


@dataclass
class _Link:
    src: str
    dst: str
    target_port: int
    server: asyncio.Server | None = None
    port: int = 0
    upstream_ports: set[int] = field(default_factory=set)
    accepted: int = 0
    live: set[asyncio.StreamWriter] = field(default_factory=set)  # the dialling side of each open connection


class ByteProxy:
    """Forwarding links on loopback that count the bytes of each direction per (src server, dst server)."""

    def __init__(self) -> None:
        self.counts: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.links: list[_Link] = []
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.blocked: set[tuple[str, str]] = set()  # links (src, dst) that take no connection
        self.stalled: set[tuple[str, str]] = set()  # flows (from, to) whose bytes are held
        self._healed = asyncio.Event()

    async def add(self, src: str, dst: str, target_port: int, listen_port: int = 0) -> int:
        """Listen on 127.0.0.1:listen_port (0: any free port) and forward to 127.0.0.1:target_port; returns
        the listening port."""
        link = _Link(src, dst, target_port)
        link.server = await asyncio.start_server(lambda r, w: self._accept(link, r, w), HOST, listen_port)
        link.port = link.server.sockets[0].getsockname()[1]
        self.links.append(link)
        return link.port

    def snapshot(self) -> dict[tuple[str, str], int]:
        return dict(self.counts)

    def reset(self) -> None:
        self.counts.clear()

    def route_ports(self) -> set[int]:
        ports = {link.port for link in self.links}
        for link in self.links:
            ports |= link.upstream_ports
        return ports

    def connections(self) -> int:
        """Connections accepted so far, over all links."""
        return sum(link.accepted for link in self.links)

    def block(self, pairs: list[tuple[str, str]]) -> int:
        """Cut the links (src, dst) of `pairs`: reset their live connections, refuse new ones until `heal()`;
        returns how many connections were reset."""
        self.blocked |= set(pairs)
        closed = 0
        for link in self.links:
            if (link.src, link.dst) in self.blocked:
                for w in list(link.live):
                    _abort(w)
                    closed += 1
        return closed

    def stall(self, flows: list[tuple[str, str]]) -> None:
        """Hold the bytes of the flows (from, to) until `heal()` (a one-way partition)."""
        self.stalled |= set(flows)
        self._healed.clear()

    def heal(self) -> None:
        self.blocked.clear()
        self.stalled.clear()
        self._healed.set()

    async def close(self) -> None:
        for link in self.links:
            if link.server is not None:
                link.server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for link in self.links:
            if link.server is not None:
                await link.server.wait_closed()

    def _accept(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(link, reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link.accepted += 1
        if (link.src, link.dst) in self.blocked:
            _abort(writer)
            return
        link.live.add(writer)
        self._writers.add(writer)
        src = link.src
        if src == ANYONE:
            peer = writer.get_extra_info("peername")
            src = await asyncio.to_thread(dialler_pid, peer[1], link.port) if peer else "pid:?"
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(HOST, link.target_port)
            except OSError:
                return  # the target is not listening (yet): the dialler sees a closed connection and retries
            self._writers.add(up_writer)
            local = up_writer.get_extra_info("sockname")[1]
            link.upstream_ports.add(local)
            try:
                await asyncio.gather(self._pump(reader, up_writer, (src, link.dst)),
                                     self._pump(up_reader, writer, (link.dst, src)))
            finally:
                link.upstream_ports.discard(local)
                self._writers.discard(up_writer)
                up_writer.close()
                with contextlib.suppress(OSError, asyncio.CancelledError):
                    await up_writer.wait_closed()
        finally:
            link.live.discard(writer)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: tuple[str, str]) -> None:
        counts = self.counts
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                while key in self.stalled:  # (held in hand; no more is read meanwhile)
                    await self._healed.wait()
                counts[key] += len(data)
                writer.write(data)
                if writer.transport.get_write_buffer_size() > CHUNK:
                    await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            writer.close()  # a reset on one side: close the other side too


def _abort(writer: asyncio.StreamWriter) -> None:
    """Reset the connection (RST), as a cut route shows to both ends."""
    with contextlib.suppress(OSError, RuntimeError):
        writer.transport.abort()


# -- a proxy in its own process ----------------------------------------------------------------------


async def _serve_stdin() -> None:
    proxy = ByteProxy()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout
    while line := await reader.readline():
        cmd = json.loads(line)
        op = cmd.get("op")
        if op == "add":
            reply: dict = {"port": await proxy.add(cmd["src"], cmd["dst"], cmd["target"])}
        elif op == "counts":
            reply = {"counts": [[s, d, n] for (s, d), n in proxy.snapshot().items()],
                     "route_ports": sorted(proxy.route_ports()), "connections": proxy.connections()}
        elif op == "reset":
            proxy.reset()
            reply = {"ok": True}
        elif op == "block":
            reply = {"closed": proxy.block([(s, d) for s, d in cmd["pairs"]])}
        elif op == "stall":
            proxy.stall([(s, d) for s, d in cmd["flows"]])
            reply = {"closed": 0}
        elif op == "heal":
            proxy.heal()
            reply = {"ok": True}
        else:
            reply = {"error": f"unknown op {op!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    await proxy.close()


class ProxyProcess:
    """A `ByteProxy` in a child process, driven synchronously (add links, read counters, stop); one command at a
    time, so that threads may share it (clusters started at once)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "zonebus.testing.byteproxy"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self._lock = threading.Lock()

    def _call(self, **cmd: object) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("byte proxy process exited")
        return json.loads(line)

    def add(self, src: str, dst: str, target_port: int) -> int:
        return int(self._call(op="add", src=src, dst=dst, target=target_port)["port"])

    def counts(self) -> dict[tuple[str, str], int]:
        return {(s, d): n for s, d, n in self._call(op="counts")["counts"]}

    def route_ports(self) -> set[int]:
        return set(self._call(op="counts")["route_ports"])

    def reset(self) -> None:
        self._call(op="reset")

    def block(self, pairs: list[tuple[str, str]]) -> int:
        """Cut these links (src, dst): live connections reset, new ones refused until `heal()`."""
        return int(self._call(op="block", pairs=[list(p) for p in pairs])["closed"])

    def stall(self, flows: list[tuple[str, str]]) -> None:
        """Hold the bytes from `from` to `to` of each flow until `heal()`."""
        self._call(op="stall", flows=[list(f) for f in flows])

    def heal(self) -> None:
        self._call(op="heal")

    def stop(self) -> None:
        stop_child(self.proc)


def main() -> None:
    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve_stdin())


if __name__ == "__main__":
    main()
