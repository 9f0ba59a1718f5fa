"""A leafnode remote's dial settings, differential (zonebus and nats-server as the leaf, against a raw
listener or a real hub): `first_info_timeout` (a hub that sends no INFO is dropped after it),
`leafnodes { reconnect_interval }` (the wait between two dials), `no_randomize` (URLs in the order given)
and `disabled` (a remote never dialled)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from zonebus.localservers import free_port
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, start_parallel, stop_all

pytestmark = pytest.mark.timeout(60)


class RawHub:
    """A listener that accepts leaf connections and never answers; it notes when each came and (with
    `hold`) how long its peer waited before closing, else closes it at once."""

    def __init__(self, hold: bool) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hold = hold
        self.accepted: list[float] = []
        self.held: list[float] = []  # seconds until the peer closed
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(time.monotonic())
            with conn:
                if self.hold:
                    conn.settimeout(10)
                    try:
                        while conn.recv(4096):
                            pass
                    except OSError:
                        pass
                    self.held.append(time.monotonic() - self.accepted[-1])

    def close(self) -> None:
        self.sock.close()


def _leaf(impl: str, body: str, remote_extra: str, *urls: str) -> ServerProcess:
    listed = ", ".join(f'"nats-leaf://{u}"' for u in urls)
    return ServerProcess(impl, http_port=free_port(), workers=1, config=(
        f"server_name: spoke\nleafnodes {{ {body}\n  remotes: [{{ urls: [{listed}] {remote_extra} }}] }}\n"))


def test_first_info_timeout(impl: str) -> None:
    raw = RawHub(hold=True)
    leaf = _leaf(impl, "", ', first_info_timeout: "400ms"', f"127.0.0.1:{raw.port}")
    leaf.start()
    try:
        wait_until(lambda: len(raw.held) >= 2, "two connections dropped for want of an INFO")
        assert all(0.25 < t < 0.9 for t in raw.held[:2]), raw.held  # (the default would be 1 s)
    finally:
        leaf.stop()
        raw.close()


def test_reconnect_interval(impl: str) -> None:
    raw = RawHub(hold=False)
    leaf = _leaf(impl, 'reconnect_interval: "200ms"', "", f"127.0.0.1:{raw.port}")
    leaf.start()
    try:
        wait_until(lambda: len(raw.accepted) >= 4, "four dials")
        dials = list(raw.accepted)
        gaps = [dials[i + 1] - dials[i] for i in range(1, len(dials) - 1)]
        assert all(0.1 < g < 0.7 for g in gaps), gaps  # (the default would be 1 s)
    finally:
        leaf.stop()
        raw.close()


def test_no_randomize_dials_in_order(impl: str) -> None:
    """The first URL is dead: with `no_randomize` the first attempt is always to it, then the second works."""
    port, dead = free_port(), free_port()
    hub = ServerProcess(impl, http_port=free_port(), workers=1, config=(
        f'server_name: hub\nleafnodes {{ listen: "127.0.0.1:{port}" }}\n'))
    leaf = _leaf(impl, "", ", no_randomize: true", f"127.0.0.1:{dead}", f"127.0.0.1:{port}")
    start_parallel([hub, leaf])
    try:
        wait_until(lambda: hub.http_get("/leafz")["leafnodes"] == 1, "the leaf on the second URL")
        assert f'"127.0.0.1:{dead}" (attempt 1)' in leaf.log(), leaf.log()
    finally:
        stop_all([leaf, hub])


def test_disabled_remote_is_not_dialled(impl: str) -> None:
    p1, p2 = free_port(), free_port()
    hubs = [ServerProcess(impl, http_port=free_port(), workers=1, config=(
        f'server_name: hub{i}\nleafnodes {{ listen: "127.0.0.1:{p}" }}\n')) for i, p in ((1, p1), (2, p2))]
    leaf = ServerProcess(impl, http_port=free_port(), workers=1, config=(
        "server_name: spoke\nleafnodes { remotes: [\n"
        f'  {{ url: "nats-leaf://127.0.0.1:{p1}", disabled: true }},\n'
        f'  {{ url: "nats-leaf://127.0.0.1:{p2}" }} ] }}\n'))
    start_parallel([*hubs, leaf])
    try:
        wait_until(lambda: hubs[1].http_get("/leafz")["leafnodes"] == 1, "the enabled remote connected")
        deadline = time.monotonic() + 1.5  # (the enabled one is up: the other would have been dialled as soon)
        while time.monotonic() < deadline:
            assert hubs[0].http_get("/leafz")["leafnodes"] == 0
            time.sleep(0.1)
    finally:
        stop_all([leaf, *hubs])
