"""Instructions per message of zonebus servers under valgrind's callgrind: a before/after measure of a hot-path
change that does not depend on what else the machine is doing (timings on a shared 2-core machine swing by
+-20%; instruction counts by a few percent).

    python bench/instructions.py                         # this tree, core pub/sub and a route hop
    python bench/instructions.py --tree /tmp/base        # another checkout (git worktree add /tmp/base REV)
    python bench/instructions.py --scenario route --msgs 10000,60000
    python bench/instructions.py --scenario realistic --msgs 10000,40000   # bench/realistic.py's traffic

Runs the server(s) of the tree under callgrind twice, with N1 and N2 messages of 16 B from a raw-socket
publisher to a raw-socket subscriber (for `route`: publisher on server A, subscriber on server B), and prints
(Ir(N2) - Ir(N1)) / (N2 - N1): the instructions the server processes execute per message, start-up excluded.
Needs valgrind (Debian package valgrind); a run takes about a minute.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realistic  # noqa: E402


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(tree: str, conf: str, port: int, outdir: str, tag: str) -> subprocess.Popen:
    path = os.path.join(outdir, f"{tag}.conf")
    with open(path, "w") as f:
        f.write(conf)
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={outdir}/{tag}.out",
           sys.executable, "-m", "zonebus", "server", "-c", path, "-a", "127.0.0.1", "-p", str(port)]
    if os.path.isdir(os.path.join(tree, "zonebus", "workers")):  # one process (the default is one per core)
        cmd += ["--workers", "1"]
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(10).startswith(b"INFO"):
                    return proc
        except OSError:
            time.sleep(0.5)
    raise SystemExit("server did not start")


def client(port: int, connect: bytes = b'CONNECT {"verbose":false,"protocol":0}\r\n') -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.recv(65536)
    s.sendall(connect + b"PING\r\n")
    buf = b""
    while b"PONG" not in buf:
        buf += s.recv(65536)
    return s


def run(tree: str, scenario: str, n: int) -> int:
    outdir = tempfile.mkdtemp(prefix="abi-")
    pa, pb, ra, rb = free_port(), free_port(), free_port(), free_port()
    procs = []
    if scenario in ("core", "realistic"):  # one server
        procs.append(start(tree, "", pa, outdir, "a"))
        subport = pubport = pa
    else:  # route: publisher on a, subscriber on b
        procs.append(start(tree, f"cluster {{ listen: 127.0.0.1:{ra}, routes: [nats://127.0.0.1:{rb}] }}\n",
                           pa, outdir, "a"))
        procs.append(start(tree, f"cluster {{ listen: 127.0.0.1:{rb}, routes: [nats://127.0.0.1:{ra}] }}\n",
                           pb, outdir, "b"))
        subport, pubport = pb, pa
    sub = client(subport, realistic.CONNECT) if scenario == "realistic" else client(subport)  # (headers: HMSG)
    sub.sendall((b"SUB orders.0.> 1" if scenario == "realistic" else b"SUB bench 1") + b"\r\nPING\r\n")
    buf = b""
    while b"PONG" not in buf:
        buf += sub.recv(65536)
    pub = client(pubport)
    if scenario == "route":  # wait until the route carries the interest: probe messages until one arrives
        sub.settimeout(0.5)
        while True:
            pub.sendall(b"PUB bench 5\r\nprobe\r\n")
            try:
                if b"probe" in sub.recv(65536):
                    break
            except TimeoutError:
                pass
        time.sleep(2)
        sub.settimeout(1)
        try:
            while sub.recv(65536):
                pass
        except TimeoutError:
            pass
    if scenario == "realistic":  # bench/realistic.py's pair 0: its own subject and size per message, ...
        frames, want = realistic.build(0, n)
        pub.sendall(realistic.CONNECT)
        for i in range(0, len(frames), 65536):
            pub.sendall(frames[i : i + 65536])
    else:
        frame = b"PUB bench 16\r\n" + b"x" * 16 + b"\r\n"
        want = len(b"MSG bench 1 16\r\n" + b"x" * 16 + b"\r\n") * n
        batch = frame * 1000
        for _ in range(n // 1000):
            pub.sendall(batch)
    sub.settimeout(300)
    got = 0
    while got < want:
        chunk = sub.recv(1 << 20)
        if not chunk:
            break
        got += len(chunk)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=300)
    total = 0
    for path in glob.glob(f"{outdir}/*.out*"):
        with open(path) as f:
            for line in f:
                m = re.match(r"summary: (\d+)", line) or re.match(r"totals: (\d+)", line)
                if m:
                    total += int(m.group(1))
                    break
    return total


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="instructions per message under callgrind")
    parser.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--scenario", default="core,route",
                        help="core, route, realistic (bench/realistic.py's traffic, one server), comma-separated")
    parser.add_argument("--msgs", default="10000,60000", help="the two message counts N1,N2")
    args = parser.parse_args()
    n1, n2 = (int(x) for x in args.msgs.split(","))
    for scenario in args.scenario.split(","):
        print(f"{scenario}: running {n1:,} and {n2:,} messages under callgrind ...", file=sys.stderr, flush=True)
        a = run(args.tree, scenario, n1)
        b = run(args.tree, scenario, n2)
        print(f"{scenario:6s} {(b - a) / (n2 - n1):>10,.0f} instructions per message   "
              f"(start-up and {n1:,} msgs: {a:,})", flush=True)


if __name__ == "__main__":
    main()
