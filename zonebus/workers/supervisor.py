"""The parent of a server's workers: starts N worker processes, starts again each one that dies, stops them.

Two steps, one pid. `supervise(opts)` runs in the process that read the options: it binds the client port
(SO_REUSEPORT, never listening: the workers listen on it), so that a random port (`-p -1`) is one port for
all workers and a port in use fails at once with a clear message; writes the options and the shared identity
(server id, the local links' secret) into a private directory (0700) that the workers read; writes the pid
file; and then replaces itself (exec, the same pid) by `python -m zonebus.workers.supervisor <dir> <fd>`: a
small interpreter that imports no server code and no asyncio (about 16 MB resident instead of 28), holding
the reserved port as descriptor `<fd>`. That one (`Supervisor`) forwards signals: SIGTERM/SIGINT stop the
workers and then itself, SIGHUP (reload) and SIGUSR2 (lame duck mode) go to every worker; after lame duck
mode the workers exit one by one and are not started again. It waits in `select` on a signal wake-up pipe.

A worker that exits before it ever became ready (its `ready.<i>` mark) means the server cannot run (a
port in use, a bad store directory): the supervisor stops the others and fails with that worker's reason
(`failed.<i>`) as its last line. One that exits later, for whatever reason (`kill -9`), is started again
after a short delay (doubling while it keeps dying, up to `RESTART_MAX`); its clients reconnect, to any
worker, and the other workers' clients notice nothing but the interest of that worker's clients going and
coming back.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zonebus.workers import OPTIONS_FILE, WorkerSpec, counts

if TYPE_CHECKING:
    import socket

    from zonebus.options import ServerOptions

RESTART_FIRST, RESTART_MAX = 0.05, 5.0  # seconds before a dead worker is started again
STABLE_AFTER = 10.0  # a worker that lived this long restarts after RESTART_FIRST again
STOP_WAIT = 15.0  # seconds the workers have to stop before they are killed
LOOK_EVERY = 1.0  # the longest wait in `select` (children are also looked at on every SIGCHLD)
SUPERVISOR_FILE = "supervisor.json"  # what the second step needs of the options: where it serves, for its log


def log(msg: str, level: str = "INF") -> None:
    ts = time.strftime("%Y/%m/%d %H:%M:%S")
    print(f"[{os.getpid()}] {ts} [{level}] {msg}", file=sys.stderr, flush=True)


def reserve_port(host: str, port: int, what: str = "clients") -> socket.socket:
    """Bind (not listen) the client port (or another port every worker listens on, `what`) with SO_REUSEPORT:
    a random one is picked here, once for all."""
    import socket

    from zonebus.server.listening import naming

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with naming(what, host, port):
            sock.bind((host or "0.0.0.0", max(port, 0)))
    except BaseException:
        sock.close()
        raise
    return sock


async def supervise(opts: ServerOptions) -> None:
    """Run the server as `opts.workers` processes until SIGTERM/SIGINT (see the module docstring): prepare
    the directory and the port here, then become the small supervisor (this call does not return, unless
    the port cannot be had: ListenError)."""
    import pickle
    import socket
    import tempfile
    from dataclasses import replace

    from zonebus.server.identity import new_server_id
    from zonebus.server.listening import ListenError
    from zonebus.workers import OPTIONS_FILE

    if not hasattr(socket, "SO_REUSEPORT"):
        raise ListenError("workers: this platform has no SO_REUSEPORT; use workers: 1")
    reserved = reserve_port(opts.host, opts.port)
    port = reserved.getsockname()[1]
    websocket = opts.websocket
    if websocket.port < 0:  # a random WebSocket port: one for all workers, held (bound) by the supervisor
        ws_reserved = reserve_port(websocket.host, websocket.port, "websocket clients")
        websocket = replace(websocket, port=ws_reserved.getsockname()[1])
        os.set_inheritable(ws_reserved.fileno(), True)  # kept open across the exec below, never passed on
    directory = tempfile.mkdtemp(prefix="zonebus-workers-")  # mode 0700
    spec = WorkerSpec(index=0, count=opts.workers, directory=directory, server_id=new_server_id(),
                      secret=os.urandom(16).hex())  # (what secrets.token_hex does, without loading OpenSSL's hashes)
    with open(os.path.join(directory, OPTIONS_FILE), "wb") as f:
        pickle.dump(replace(opts, port=port, pid_file="", websocket=websocket), f)
    spec.save()
    counts.create(directory, spec.count)
    (Path(directory) / SUPERVISOR_FILE).write_text(json.dumps({"where": f"{opts.host}:{port}"}))
    if opts.pid_file:
        with open(opts.pid_file, "w") as f:
            f.write(str(os.getpid()))
    os.set_inheritable(reserved.fileno(), True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "zonebus.workers.supervisor", directory,
                              str(reserved.fileno())])


class Supervisor:
    """The second step: N workers kept running until a stop signal (see the module docstring)."""

    def __init__(self, directory: str, reserved: int) -> None:
        self.dir = directory
        self.reserved = reserved
        self.spec = WorkerSpec.load(directory, 0)
        self.count = self.spec.count
        self.where = json.loads((Path(directory) / SUPERVISOR_FILE).read_text())["where"]
        self.procs: list[subprocess.Popen[Any] | None] = [None] * self.count
        self.started = [0.0] * self.count
        self.ever_ready = [False] * self.count
        self.delay = [RESTART_FIRST] * self.count
        self.due: dict[int, float] = {}  # worker -> when to start it again
        self.signals: list[int] = []
        self.done = False
        self.lame_duck = False
        self.failure = ""

    def _syslog(self) -> None:
        """`syslog`/`remote_syslog`: this process's log and its workers' (they inherit its stderr) go there
        (checked by `zonebus server` before it started this supervisor); a rotated `log_file` goes through
        this process's rotation thread (zonebus.server.logrotation)."""
        import pickle

        from zonebus.server.logrotation import start_log_rotation
        from zonebus.server.syslogging import start_syslog

        with open(Path(self.dir) / OPTIONS_FILE, "rb") as f:
            opts = pickle.load(f)
        start_syslog(opts)
        start_log_rotation(opts)

    def run(self) -> int:
        os.set_inheritable(self.reserved, False)
        self._syslog()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, lambda s, _frame: self.signals.append(s))
        log(f"zonebus server {self.spec.server_id}: {self.count} worker processes on {self.where}")
        try:
            for i in range(self.count):
                self._start(i)
            while not self.done:
                now = time.monotonic()
                wait = min([LOOK_EVERY] + [max(0.0, t - now) for t in self.due.values()])
                select.select([wake_r], [], [], wait)
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
                self._handle_signals()
                self._reap()
                self._start_due()
        finally:
            self._stop_all()
            os.close(self.reserved)
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.failure:
            print(f"zonebus server: {self.failure}", file=sys.stderr, flush=True)
            return 1
        log("server stopped")
        return 0

    # -- signals -----------------------------------------------------------------------------------------
    def _handle_signals(self) -> None:
        pending, self.signals = self.signals, []
        for sig in pending:
            if sig in (signal.SIGTERM, signal.SIGINT):
                self.done = True
            elif sig == signal.SIGHUP:
                self._forward(signal.SIGHUP)
            elif sig == signal.SIGUSR2:
                self.lame_duck = True
                self.due.clear()  # a dead worker is not started again; with none running, nothing is left to wait for
                self._forward(signal.SIGUSR2)
                self.done = all(p is None for p in self.procs)

    def _forward(self, sig: int) -> None:
        for proc in self.procs:
            if proc is not None and proc.returncode is None:
                proc.send_signal(sig)

    # -- workers -----------------------------------------------------------------------------------------
    def _start(self, i: int) -> None:
        self.spec.ready_path(i).unlink(missing_ok=True)
        self.procs[i] = subprocess.Popen([sys.executable, "-m", "zonebus.workers.worker", self.dir, str(i)])
        self.started[i] = time.monotonic()

    def _start_due(self) -> None:
        now = time.monotonic()
        for i, when in list(self.due.items()):
            if when <= now and not self.done:
                del self.due[i]
                self._start(i)

    def _reap(self) -> None:
        """Each worker that exited: the server fails (never ready), ends (lame duck), or it starts again."""
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is None or self.done:
                continue
            code = proc.returncode
            self.procs[i] = None
            counts.clear(self.dir, i)
            if self.spec.ready_path(i).exists():
                self.ever_ready[i] = True
            if not self.ever_ready[i]:
                failed = self.spec.failed_path(i)
                self.failure = failed.read_text() if failed.exists() else \
                    f"worker {i} exited with code {code} before it could serve (see its error above)"
                self.done = True
                return
            if self.lame_duck:
                self.done = all(p is None for p in self.procs)
                continue
            if time.monotonic() - self.started[i] >= STABLE_AFTER:
                self.delay[i] = RESTART_FIRST
            log(f"worker {i} (pid {proc.pid}) exited with code {code}; starting it again in {self.delay[i]:.2f}s",
                "WRN")
            self.due[i] = time.monotonic() + self.delay[i]
            self.delay[i] = min(self.delay[i] * 2, RESTART_MAX)

    def _stop_all(self) -> None:
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        for p in live:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        late = [p for p in live if p.poll() is None]
        for p in late:
            p.kill()
        for p in late:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass


if __name__ == "__main__":
    sys.exit(Supervisor(sys.argv[1], int(sys.argv[2])).run())
