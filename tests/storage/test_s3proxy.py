"""The S3 stand-in (`zonebus.testing.s3proxy`) seen from boto3 and pyarrow: every request counted by kind and
key prefix exactly, latency applied (and off when asked), and each fault giving the error a client sees."""

from __future__ import annotations

import io
import statistics
import time

import boto3
import botocore.exceptions
import pytest
from boto3.s3.transfer import TransferConfig

from zonebus.storage.fs import ObjectExists, filesystem
from zonebus.storage.s3client import S3Objects
from zonebus.testing.motos3 import MotoS3
from zonebus.testing.polling import wait_until
from zonebus.testing.s3proxy import KINDS, S3Proxy, classify, kind_totals, prefix_of

NO_RETRY = {"retries": {"total_max_attempts": 1, "mode": "standard"}}


def _kinds(proxy: S3Proxy | None, field: str = "requests") -> dict[str, int]:
    assert proxy is not None
    return {k: n for k, n in kind_totals(proxy.counts(), field).items() if n}


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("method", "target", "copy", "kind"), [
    ("PUT", "/b/k/x", False, "PUT"), ("PUT", "/b/k/x?partNumber=1&uploadId=u", False, "PUT"),
    ("PUT", "/b/k/x", True, "COPY"), ("POST", "/b/k/x?uploads", False, "PUT"),
    ("POST", "/b/k/x?uploadId=u", False, "PUT"), ("GET", "/b/k/x", False, "GET"),
    ("GET", "/b/k/x?uploadId=u", False, "LIST"), ("GET", "/b?list-type=2&prefix=k/", False, "LIST"),
    ("GET", "/b", False, "LIST"), ("GET", "/b?location", False, "GET"), ("GET", "/b?uploads", False, "LIST"),
    ("HEAD", "/b/k/x", False, "HEAD"), ("HEAD", "/b", False, "HEAD"), ("DELETE", "/b/k/x", False, "DELETE"),
    ("DELETE", "/b/k/x?uploadId=u", False, "DELETE"), ("POST", "/b?delete", False, "DELETE"),
    ("PUT", "/b", False, "PUT"),
])
def test_request_kinds(method: str, target: str, copy: bool, kind: str) -> None:
    assert classify(method, target, copy)[0] == kind
    assert prefix_of("zb/zonerouter/channels/ab12/17/3.zrb", 4) == "zb/zonerouter/channels/ab12/"
    assert prefix_of("zb/zonerouter/channels/ab12/17/3.zrb", 8) == "zb/zonerouter/channels/ab12/*/"
    assert prefix_of("top.json", 4) == "/"


@pytest.mark.timeout(60)
def test_counts_match_the_operations(proxied: MotoS3) -> None:
    c, b = proxied.client(), proxied.bucket
    for i in range(3):
        c.put_object(Bucket=b, Key=f"zb/streams/S/log/{i}.1.blk", Body=b"x" * 1000)
    c.put_object(Bucket=b, Key="zb/streams/S/stream.1.json", Body=io.BytesIO(b"{}" * 50))  # Expect: 100-continue
    assert c.get_object(Bucket=b, Key="zb/streams/S/log/0.1.blk")["Body"].read() == b"x" * 1000
    c.head_object(Bucket=b, Key="zb/streams/S/log/1.1.blk")
    c.list_objects_v2(Bucket=b, Prefix="zb/streams/S/log/")
    c.list_objects(Bucket=b, Prefix="zb/streams/S/")
    c.copy_object(Bucket=b, Key="zb/copy/a", CopySource={"Bucket": b, "Key": "zb/streams/S/log/2.1.blk"})
    c.delete_object(Bucket=b, Key="zb/copy/a")
    c.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "zb/streams/S/log/2.1.blk"}]})
    # multipart: create + 2 parts + complete, all priced as PUT
    c.upload_fileobj(io.BytesIO(b"y" * (10 << 20)), b, "zb/big/obj",
                     Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20, use_threads=False))
    proxy = proxied.proxy
    assert _kinds(proxy) == {"PUT": 4 + 4, "GET": 1, "HEAD": 1, "LIST": 2, "COPY": 1, "DELETE": 2}
    counts = proxy.counts()  # type: ignore[union-attr]
    assert counts["total"] == 15 and counts["faults"] == {"slowdown": 0, "timeout": 0, "reset": 0, "lost": 0}
    log = counts["prefixes"]["zb/streams/S/log/"]
    assert log["PUT"]["requests"] == 3 and log["PUT"]["req_bytes"] == 3000
    assert log["GET"]["resp_bytes"] == 1000 and log["HEAD"]["requests"] == 1 and log["LIST"]["requests"] == 1
    assert counts["prefixes"]["zb/streams/S/"]["LIST"]["requests"] == 1
    assert counts["prefixes"]["zb/big/"]["PUT"]["requests"] == 4
    assert counts["prefixes"]["zb/big/"]["PUT"]["req_bytes"] >= 10 << 20
    proxy.reset()  # type: ignore[union-attr]
    assert proxy.counts()["total"] == 0  # type: ignore[union-attr]


@pytest.mark.timeout(60)
def test_pyarrow_through_the_proxy(proxied: MotoS3) -> None:
    fs, root = filesystem(f"s3://{proxied.bucket}/pa", endpoint=proxied.endpoint, region=proxied.region)
    with fs.open_output_stream(f"{root}/dir/one.bin") as f:
        f.write(b"z" * 300_000)
    with fs.open_input_stream(f"{root}/dir/one.bin") as f:
        assert f.read() == b"z" * 300_000
    kinds = _kinds(proxied.proxy)
    assert kinds.get("PUT", 0) >= 1 and kinds.get("GET", 0) >= 1
    put = proxied.proxy.counts()["prefixes"]["pa/dir/"]["PUT"]  # type: ignore[union-attr]
    assert put["req_bytes"] >= 300_000  # (pyarrow's body may carry aws-chunked framing and a checksum trailer)
    proxied.proxy.reset()  # type: ignore[union-attr]
    fs.delete_file(f"{root}/dir/one.bin")  # pyarrow: HEAD, DELETE, then a marker keeps the emptied folder
    prefixes = proxied.proxy.counts()["prefixes"]  # type: ignore[union-attr]
    assert {k: v["requests"] for k, v in prefixes["pa/dir/"].items()} == {"HEAD": 1, "DELETE": 1}
    assert {k: v["requests"] for k, v in prefixes["pa/dir/ (folder marker)"].items()} == {"PUT": 1}


@pytest.mark.timeout(60)
def test_latency_is_applied_and_can_be_off(proxied: MotoS3, flat_proxy: S3Proxy) -> None:
    c, b = proxied.client(), proxied.bucket
    took = []
    for i in range(15):
        t0 = time.perf_counter()
        c.put_object(Bucket=b, Key=f"lat/{i}", Body=b"l" * 100)
        took.append(time.perf_counter() - t0)
    assert statistics.median(took) >= 0.010
    put = proxied.proxy.counts()["kinds"]["PUT"]  # type: ignore[union-attr]
    assert put["delay_ms"] / put["requests"] >= 10
    flat = boto3.client("s3", endpoint_url=flat_proxy.endpoint, region_name=proxied.region,
                        aws_access_key_id="test", aws_secret_access_key="test")
    flat.put_object(Bucket=b, Key="lat/flat", Body=b"f")
    assert flat.get_object(Bucket=b, Key="lat/flat")["Body"].read() == b"f"
    counts = flat_proxy.counts()
    assert kind_totals(counts) == {k: int(k in ("PUT", "GET")) for k in KINDS}
    assert all(v["delay_ms"] == 0 for v in counts["kinds"].values())


@pytest.mark.timeout(60)
def test_slowdown_is_an_s3_error_and_retried(proxied: MotoS3) -> None:
    proxy, b = proxied.proxy, proxied.bucket
    assert proxy is not None
    proxy.set_faults(slowdown=1.0, kind="PUT", prefix="slow/")
    c = proxied.client(retries={"total_max_attempts": 3, "mode": "standard"})
    with pytest.raises(botocore.exceptions.ClientError) as err:
        c.put_object(Bucket=b, Key="slow/a", Body=b"s")
    assert err.value.response["Error"]["Code"] == "SlowDown"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert proxy.counts()["faults"]["slowdown"] == 3  # every attempt
    c.put_object(Bucket=b, Key="fast/a", Body=b"f")  # another prefix is not affected
    proxy.reset()
    proxy.set_faults(slowdown=1.0, kind="PUT", limit=1)
    c.put_object(Bucket=b, Key="slow/b", Body=b"s")  # one 503, then botocore's retry succeeds
    assert _kinds(proxy) == {"PUT": 2} and proxy.counts()["kinds"]["PUT"]["errors"] == 1
    assert "slow/b" in proxied.keys("slow/") and "slow/a" not in proxied.keys("slow/")


@pytest.mark.timeout(60)
def test_timeout_holds_the_request(proxied: MotoS3) -> None:
    proxy = proxied.proxy
    assert proxy is not None
    proxy.set_faults(timeout=1.0, kind="GET")
    c = proxied.client(read_timeout=1, connect_timeout=2, **NO_RETRY)
    c.put_object(Bucket=proxied.bucket, Key="held/a", Body=b"h")  # a PUT is not held
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        c.get_object(Bucket=proxied.bucket, Key="held/a")
    assert proxy.counts()["faults"]["timeout"] == 1
    proxy.set_faults(timeout=1.0, kind="GET", limit=1)  # the limit counts what was injected so far: none left
    assert c.get_object(Bucket=proxied.bucket, Key="held/a")["Body"].read() == b"h"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body", [b"r" * 65536, io.BytesIO(b"r" * 65536)], ids=["bytes", "expect-100"])
def test_reset_in_the_middle_of_an_upload(proxied: MotoS3, body: bytes | io.BytesIO) -> None:
    proxy = proxied.proxy
    assert proxy is not None
    proxy.set_faults(reset=1.0, kind="PUT", limit=1)
    with pytest.raises(botocore.exceptions.HTTPClientError):
        proxied.client(**NO_RETRY).put_object(Bucket=proxied.bucket, Key="reset/a", Body=body)
    wait_until(lambda: proxy.counts()["faults"]["reset"] == 1, "the reset counted", timeout=10)
    assert "reset/a" not in proxied.keys("reset/")
    if isinstance(body, io.BytesIO):
        body.seek(0)
    proxy.reset()
    proxy.set_faults(reset=1.0, kind="PUT", limit=1)
    proxied.client(retries={"total_max_attempts": 3, "mode": "standard"}).put_object(
        Bucket=proxied.bucket, Key="reset/b", Body=body)  # reset once, then retried and stored
    assert _kinds(proxy) == {"PUT": 2} and "reset/b" in proxied.keys("reset/")


@pytest.mark.timeout(60)
def test_lost_answer_after_the_put_landed(proxied: MotoS3) -> None:
    proxy = proxied.proxy
    assert proxy is not None
    proxy.set_faults(lost=1.0, kind="PUT", limit=1)
    with pytest.raises(botocore.exceptions.HTTPClientError):
        proxied.client(**NO_RETRY).put_object(Bucket=proxied.bucket, Key="lost/a", Body=b"l")
    assert "lost/a" in proxied.keys("lost/")  # stored although the client saw its connection reset
    assert proxy.counts()["faults"]["lost"] == 1
    # the broker's client: botocore retries the create-only PUT, which then finds the object (412)
    proxy.set_faults(lost=1.0, kind="PUT", limit=2)
    objects = S3Objects(proxied.bucket, proxied.endpoint, proxied.region)
    with pytest.raises(ObjectExists):
        objects.put(f"{proxied.bucket}/lost/b", b"l", if_absent=True)
    assert "lost/b" in proxied.keys("lost/") and proxy.counts()["faults"]["lost"] == 2
