"""`S3Objects`: the broker's S3 client, whole-object calls through boto3 with every HTTP request reported.

One call is one request (retries aside): `put` is one PutObject (`If-None-Match: *` for a create-only put,
412 -> `ObjectExists`), `get` one GetObject (no HEAD first, unlike pyarrow's filesystem layer), `get_range`
one ranged GetObject, `list` one ListObjectsV2 per page of 1,000, `delete` one DeleteObject. Every HTTP
attempt, retries included (botocore retries throttling and 5xx answers), is reported to the hook that
`ObjectStore` installs (`on_request(kind, "bucket/key", request bytes)`), read off the request itself, so
what is counted is what a provider bills. Endpoint, region and credentials come from the standard AWS
environment variables unless given; a custom endpoint uses path-style addressing. boto3 is imported when
the first S3 store is opened. Every failure is an `OSError` (what the callers catch): S3's error answers
(`ClientError`) and botocore's own errors after its retries (a connection closed or refused: `BotoCoreError`s
that are not `OSError`s) are wrapped; 404 on a GET is `FileNotFoundError`, 412 on a create-only PUT
`ObjectExists`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn
from urllib.parse import parse_qs, unquote, urlparse

Hook = Callable[[str, str, int], None]  # (kind, "bucket/key", request body bytes)


def _env(*names: str) -> str:
    for n in names:
        v = os.environ.get(n, "")
        if v:
            return v
    return ""


def s3_location(endpoint: str = "", region: str = "") -> tuple[str, str]:
    """(endpoint, region) as given, else from the standard AWS environment variables ("" when unset)."""
    return (endpoint or _env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            region or _env("AWS_REGION", "AWS_DEFAULT_REGION"))


def request_kind(method: str, query: str, headers: Any, has_key: bool) -> str:
    """What a provider bills an S3 HTTP request as: PUT, COPY, GET, LIST, HEAD, DELETE."""
    if method == "PUT":
        return "COPY" if "x-amz-copy-source" in headers else "PUT"
    if method == "POST":
        return "DELETE" if "delete" in parse_qs(query, keep_blank_values=True) else "PUT"
    if method == "GET":
        return "GET" if has_key else "LIST"
    if method == "HEAD":
        return "HEAD"
    if method == "DELETE":
        return "DELETE"
    return method


def _reraise(op: str, path: str, exc: Exception) -> NoReturn:
    """Raise `exc` as an OSError: itself when it is one (botocore's read and connect timeouts are)."""
    if isinstance(exc, OSError):
        raise exc
    raise OSError(f"S3 {op} {path}: {exc}") from exc


@contextmanager
def _as_oserror(op: str, path: str) -> Iterator[None]:
    """Re-raise botocore's errors (S3's error answers, its own errors after its retries) as OSErrors."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        _reraise(op, path, exc)


class S3Objects:
    """Whole-object S3 calls on one bucket; paths are `bucket/key`."""

    def __init__(self, bucket: str, endpoint: str = "", region: str = "") -> None:
        import boto3
        from botocore.config import Config

        endpoint, region = s3_location(endpoint, region)
        region = region or "us-east-1"
        if endpoint and "://" not in endpoint:
            endpoint = f"https://{endpoint}"
        # a hung request fails within seconds (the publishers waiting on it are told to retry), not minutes
        cfg = Config(max_pool_connections=64, retries={"mode": "standard", "max_attempts": 3},
                     connect_timeout=2, read_timeout=5,
                     s3={"addressing_style": "path"} if endpoint else None)
        self.bucket = bucket
        self.client = boto3.session.Session().client("s3", endpoint_url=endpoint or None, region_name=region,
                                                     config=cfg)
        self._hooks: list[Hook] = []
        self.client.meta.events.register("before-send.s3", self._before_send)

    def on_request(self, hook: Hook) -> None:
        self._hooks.append(hook)

    def _before_send(self, request: Any, **_: Any) -> None:
        u = urlparse(request.url)
        path = unquote(u.path).lstrip("/")
        if not path.startswith(self.bucket + "/") and path != self.bucket:  # virtual-hosted style
            path = f"{self.bucket}/{path}" if path else self.bucket
        key = path[len(self.bucket) + 1:]
        if not key:  # a bucket-level call (list): the prefix says what it was for
            prefix = parse_qs(u.query).get("prefix", [""])[0]
            path = f"{self.bucket}/{prefix}"
        body = request.body
        size = len(body) if isinstance(body, bytes | bytearray) else int(request.headers.get("Content-Length") or 0)
        kind = request_kind(request.method, u.query, request.headers, bool(key))
        for hook in self._hooks:
            hook(kind, path, size)

    def _split(self, path: str) -> str:
        return path[len(self.bucket) + 1:]

    def put(self, path: str, data: bytes, if_absent: bool = False) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        from zonebus.storage.fs import ObjectExists

        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._split(path), "Body": data}
        if if_absent:
            args["IfNoneMatch"] = "*"
        try:
            self.client.put_object(**args)
        except BotoCoreError as exc:
            _reraise("PUT", path, exc)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if if_absent and (status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict")):
                raise ObjectExists(self._split(path))
            raise OSError(f"S3 PUT {path}: {exc}") from exc

    def _get(self, path: str, **extra: Any) -> dict:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._split(path), **extra)
        except BotoCoreError as exc:
            _reraise("GET", path, exc)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(path) from None
            raise OSError(f"S3 GET {path}: {exc}") from exc

    def get(self, path: str) -> bytes:
        body = self._get(path)["Body"]
        with _as_oserror("GET", path):
            return body.read()

    def get_range(self, path: str, start: int, length: int) -> tuple[bytes, int]:
        if length <= 0:
            length = 1
        resp = self._get(path, Range=f"bytes={start}-{start + length - 1}")
        with _as_oserror("GET", path):
            data = resp["Body"].read()
        total = resp.get("ContentRange", "").rpartition("/")[2]
        return data, int(total) if total.isdigit() else len(data)

    def list(self, path: str) -> tuple[list[str], list[str]]:
        """(object names, sub-directory names) directly under `path`."""
        prefix = self._split(path).rstrip("/") + "/" if self._split(path + "/") else ""
        files: list[str] = []
        dirs: list[str] = []
        with _as_oserror("LIST", path):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                               Delimiter="/"):
                files += [o["Key"][len(prefix):] for o in page.get("Contents", ())]
                dirs += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", ())]
        return [f for f in files if f], dirs

    def list_recursive(self, path: str) -> list[str]:
        """Paths (`bucket/key`) of every object under `path`."""
        prefix = self._split(path).rstrip("/") + "/" if self._split(path + "/") else ""
        out = []
        with _as_oserror("LIST", path):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                out += [f"{self.bucket}/{o['Key']}" for o in page.get("Contents", ())]
        return out

    def exists(self, path: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._split(path))
            return True
        except BotoCoreError as exc:
            _reraise("HEAD", path, exc)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return False
            raise OSError(f"S3 HEAD {path}: {exc}") from exc

    def delete(self, path: str) -> None:
        with _as_oserror("DELETE", path):
            self.client.delete_object(Bucket=self.bucket, Key=self._split(path))
