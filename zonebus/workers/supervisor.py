"""The parent of a server's workers: starts N worker processes, starts again each one that dies, stops them.

It keeps the client port bound (SO_REUSEPORT, never listening: the workers listen on it), so that a random
port (`-p -1`) is one port for all workers and a port in use fails at once with a clear message. It writes
the options and the shared identity (server id, the local links' secret) into a private directory (0700)
that the workers read, writes the pid file, and forwards signals: SIGTERM/SIGINT stop the workers and then
itself, SIGHUP (reload) and SIGUSR2 (lame duck mode) go to every worker; after lame duck mode the workers
exit one by one and are not started again.

A worker that exits before it ever became ready (its `ready.<i>` mark) means the server cannot run (a
port in use, a bad store directory): the supervisor stops the others and fails. One that exits later, for
whatever reason (`kill -9`), is started again after a short delay (doubling while it keeps dying, up to
`RESTART_MAX`); its clients reconnect, to any worker, and the other workers' clients notice nothing but
the interest of that worker's clients going and coming back.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import replace

from zonebus.server.identity import new_server_id
from zonebus.server.listening import ListenError, naming
from zonebus.server.options import ServerOptions
from zonebus.workers import OPTIONS_FILE, WorkerSpec, counts

RESTART_FIRST, RESTART_MAX = 0.05, 5.0  # seconds before a dead worker is started again
STABLE_AFTER = 10.0  # a worker that lived this long restarts after RESTART_FIRST again
STOP_WAIT = 15.0  # seconds the workers have to stop before they are killed


def log(msg: str, level: str = "INF") -> None:
    ts = time.strftime("%Y/%m/%d %H:%M:%S")
    print(f"[{os.getpid()}] {ts} [{level}] {msg}", file=sys.stderr, flush=True)


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) the client port with SO_REUSEPORT: a random one is picked here, once for all."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with naming("clients", host, port):
            sock.bind((host or "0.0.0.0", max(port, 0)))
    except BaseException:
        sock.close()
        raise
    return sock


class Supervisor:
    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        self.count = opts.workers
        self.dir = tempfile.mkdtemp(prefix="zonebus-workers-")  # mode 0700
        self.spec = WorkerSpec(index=0, count=self.count, directory=self.dir, server_id=new_server_id(),
                               secret=secrets.token_hex(16))
        self.procs: list[asyncio.subprocess.Process | None] = [None] * self.count
        self.stopping = False
        self.lame_duck = False
        self.failure = ""
        self.done = asyncio.Event()
        self._reserved: socket.socket | None = None

    async def run(self) -> None:
        if not hasattr(socket, "SO_REUSEPORT"):
            raise ListenError("workers: this platform has no SO_REUSEPORT; use workers: 1")
        opts = self.opts
        self._reserved = reserve_port(opts.host, opts.port)
        port = self._reserved.getsockname()[1]
        worker_opts = replace(opts, port=port, pid_file="")
        with open(os.path.join(self.dir, OPTIONS_FILE), "wb") as f:
            pickle.dump(worker_opts, f)
        self.spec.save()
        counts.create(self.dir, self.count)
        if opts.pid_file:
            with open(opts.pid_file, "w") as f:
                f.write(str(os.getpid()))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.done.set)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)
        loop.add_signal_handler(signal.SIGUSR2, self._enter_lame_duck)
        log(f"zonebus server {self.spec.server_id}: {self.count} worker processes on {opts.host}:{port}")
        keepers = [loop.create_task(self._keep(i)) for i in range(self.count)]
        try:
            await self.done.wait()
        finally:
            self.stopping = True
            await self._stop_all()
            for k in keepers:
                k.cancel()
            self._reserved.close()
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.failure:
            raise ListenError(self.failure)
        log("server stopped")

    async def _keep(self, i: int) -> None:
        """Run worker `i`, and run it again each time it dies (unless the server is stopping)."""
        delay = RESTART_FIRST
        ever_ready = False
        ready = self.spec.ready_path(i)
        while not self.stopping:
            ready.unlink(missing_ok=True)
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "zonebus.workers.worker", self.dir,
                                                        str(i))
            self.procs[i] = proc
            started = time.monotonic()
            code = await proc.wait()
            if self.stopping:
                return
            counts.clear(self.dir, i)
            if ready.exists():
                ever_ready = True
            if not ever_ready:
                failed = self.spec.failed_path(i)
                self.failure = failed.read_text() if failed.exists() else \
                    f"worker {i} exited with code {code} before it could serve (see its error above)"
                self.done.set()
                return
            if self.lame_duck:
                self.procs[i] = None
                if all(p is None for p in self.procs):
                    self.done.set()
                return
            if time.monotonic() - started >= STABLE_AFTER:
                delay = RESTART_FIRST
            log(f"worker {i} (pid {proc.pid}) exited with code {code}; starting it again in {delay:.2f}s", "WRN")
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX)

    def _forward(self, sig: int) -> None:
        for proc in self.procs:
            if proc is not None and proc.returncode is None:
                proc.send_signal(sig)

    def _enter_lame_duck(self) -> None:
        self.lame_duck = True
        self._forward(signal.SIGUSR2)

    async def _stop_all(self) -> None:
        live = [p for p in self.procs if p is not None and p.returncode is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        if not live:
            return
        _, late = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in live], timeout=STOP_WAIT)
        if late:
            for p in live:
                if p.returncode is None:
                    p.kill()
            await asyncio.wait([asyncio.ensure_future(p.wait()) for p in live], timeout=5)


async def supervise(opts: ServerOptions) -> None:
    """Run the server as `opts.workers` processes until SIGTERM/SIGINT (see the module docstring)."""
    await Supervisor(opts).run()
