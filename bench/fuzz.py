"""The long fuzzing run (the short one is tests/security/test_fuzz.py): the client and route parsers, then a
real zonebus server, fed raw and protocol-shaped bytes for as long as asked.

    python bench/fuzz.py --seconds 600                 # parsers, with atheris when installed (pip install atheris)
    python bench/fuzz.py --seconds 300 --server        # also a real server: garbage on many connections

Without atheris, inputs are random bytes and `zonebus.testing.fuzzing.protocol_input` of random bytes.
Prints a progress line every 10 s and, at the end, inputs tried, parse errors reported (expected) and
failures (an exception other than a reported protocol error, input held without bound, split input parsed
differently, or for --server the server gone or a healthy client unanswered). Exit status 1 on a failure,
with the input written to fuzz-failure.bin.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import time

from zonebus.testing.fuzzing import check_parser, protocol_input


def _input(rng: random.Random) -> tuple[str, bytes, list[int]]:
    raw = os.urandom(rng.randint(0, 600))
    data = protocol_input(raw) if rng.random() < 0.7 else raw
    cuts = [rng.randint(0, len(data) + 1) for _ in range(rng.randint(0, 8))]
    return rng.choice(["client", "route"]), data, cuts


def _fail(data: bytes, what: str) -> int:
    with open("fuzz-failure.bin", "wb") as f:
        f.write(data)
    print(f"FAILURE: {what}; input written to fuzz-failure.bin", file=sys.stderr)
    return 1


def fuzz_parsers(seconds: float) -> int:
    try:
        import atheris  # type: ignore[import-not-found]
    except ImportError:
        atheris = None
    if atheris is not None:  # coverage-guided; runs until --seconds via libFuzzer's -max_total_time
        def one(buf: bytes) -> None:
            fdp = atheris.FuzzedDataProvider(buf)
            kind = "client" if fdp.ConsumeBool() else "route"
            raw = fdp.ConsumeBytes(fdp.remaining_bytes())
            check_parser(kind, protocol_input(raw) if raw[:1] < b"\xb0" else raw, [len(raw) // 3, len(raw) // 2])

        atheris.Setup([sys.argv[0], f"-max_total_time={int(seconds)}"], one)
        atheris.Fuzz()
        return 0
    rng = random.Random(1)
    start = last = time.monotonic()
    tried = 0
    while time.monotonic() - start < seconds:
        kind, data, cuts = _input(rng)
        try:
            check_parser(kind, data, cuts)
        except Exception as exc:  # noqa: BLE001 - any failure is the finding
            return _fail(data, f"{kind} parser: {exc!r}")
        tried += 1
        if time.monotonic() - last >= 10:
            last = time.monotonic()
            print(f"  parsers: {tried:,} inputs, {last - start:.0f} s", file=sys.stderr, flush=True)
    print(f"parsers: {tried:,} inputs, no failure")
    return 0


def fuzz_server(seconds: float) -> int:
    from zonebus.testing.processes import ServerProcess, free_port

    server = ServerProcess("zonebus", "max_payload: 65536\n", http_port=free_port()).start()
    rng = random.Random(2)
    start = last = time.monotonic()
    tried = 0
    try:
        while time.monotonic() - start < seconds:
            _, data, _ = _input(rng)
            try:
                with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                    sock.recv(65536)
                    sock.sendall(data)
            except OSError:
                pass
            tried += 1
            if server.proc is None or server.proc.poll() is not None:
                return _fail(data, "the server exited")
            if tried % 50 == 0:
                with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                    sock.recv(65536)
                    sock.sendall(b"CONNECT {}\r\nSUB ok 1\r\nPUB ok 2\r\nok\r\nPING\r\n")
                    got, deadline = b"", time.monotonic() + 5
                    while b"PONG" not in got and time.monotonic() < deadline:
                        got += sock.recv(65536)
                    if b"MSG ok 1 2" not in got:
                        return _fail(data, f"a healthy client was not answered: {got!r}")
            if time.monotonic() - last >= 10:
                last = time.monotonic()
                rss = server.http_get("/varz").get("mem", 0)
                print(f"  server: {tried:,} connections, rss {rss / 2**20:.0f} MB", file=sys.stderr, flush=True)
        varz = server.http_get("/varz")
        print(f"server: {tried:,} hostile connections, {varz['connections']} open now, rss "
              f"{varz.get('mem', 0) / 2**20:.0f} MB, no failure")
        return 0
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--server", action="store_true", help="also fuzz a real server over sockets")
    args = parser.parse_args()
    code = fuzz_parsers(args.seconds)
    if code == 0 and args.server:
        code = fuzz_server(args.seconds)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
