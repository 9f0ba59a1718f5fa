"""moto's S3 server on 127.0.0.1 with one bucket, for the tests that put streams or router channels on S3.

    with moto_s3_server("zonebus-streams") as s3:
        server_env = s3.env()            # credentials (and, unless endpoint=False, the endpoint) for a process
        s3.keys("prefix/")               # what is stored under a prefix

    with proxied_s3("zonebus-bench", latency=True) as s3:   # moto behind zonebus.testing.s3proxy
        s3.endpoint                      # the proxy's: S3-like latency, every request counted
        s3.proxy.counts(); s3.proxy.set_faults(slowdown=0.1)
        s3.keys("prefix/")               # read from moto directly (not counted)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from zonebus.testing.polling import wait_until
from zonebus.testing.processes import free_port
from zonebus.testing.s3proxy import S3Proxy

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_EC2_METADATA_DISABLED": "true"}


@dataclass
class MotoS3:
    endpoint: str
    region: str
    bucket: str
    direct: str = ""  # moto's own endpoint when `endpoint` is a proxy's
    proxy: S3Proxy | None = None

    def env(self, endpoint: bool = True) -> dict[str, str]:
        """Environment for a server process: credentials through the standard AWS variables, and the endpoint
        and region too unless the process gets them from its config (`endpoint=False`)."""
        where = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": self.region} if endpoint else {}
        return where | CREDENTIALS

    def client(self, direct: bool = False, **config: Any) -> Any:
        """A boto3 client of `endpoint` (of moto itself with `direct`); `config`: botocore Config options."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=(self.direct or self.endpoint) if direct else self.endpoint,
                            region_name=self.region, aws_access_key_id="test", aws_secret_access_key="test",
                            config=Config(**config) if config else None)

    def keys(self, prefix: str) -> list[str]:
        pages = self.client(direct=True).get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", ()))


@contextmanager
def moto_s3_server(bucket: str, process: bool = False, host: str = "127.0.0.1") -> Iterator[MotoS3]:
    """moto's S3 server with `bucket`: in this process (threads), or with `process` in a child process of its
    own (for benchmarks: moto then shares no GIL with the load generator); `host`: the address it listens on
    (a bridge's, for servers in network namespaces: `zonebus.testing.netzones`)."""
    port = free_port()
    s3 = MotoS3(f"http://{host}:{port}", "us-east-1", bucket)
    for key, value in CREDENTIALS.items():
        os.environ.setdefault(key, value)  # for in-process clients; endpoints are passed explicitly
    if process:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stop: Callable[[], None] = lambda: (proc.terminate(), proc.wait(10))  # noqa: E731
    else:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
        server.start()
        stop = server.stop
    try:
        wait_until(lambda: _answers(port, host), "moto's S3 server to listen", timeout=30)
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        stop()


def _answers(port: int, host: str = "127.0.0.1") -> bool:
    with socket.create_connection((host, port), timeout=1):
        return True


@contextmanager
def proxied_s3(bucket: str, latency: bool | dict[str, tuple[float, float]] = True,
               seed: int | None = None, process: bool = False, prefix_depth: int = 4) -> Iterator[MotoS3]:
    """moto with `bucket`, behind an `S3Proxy` (its own process): `endpoint` is the proxy's, `direct` moto's;
    the proxy's counters start at zero (the bucket was made directly)."""
    with moto_s3_server(bucket, process) as s3:
        proxy = S3Proxy(s3.endpoint, latency=latency, seed=seed, prefix_depth=prefix_depth)
        try:
            yield MotoS3(proxy.endpoint, s3.region, bucket, direct=s3.endpoint, proxy=proxy)
        finally:
            proxy.stop()
