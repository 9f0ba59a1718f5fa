"""URLs to pyarrow filesystems, and `ObjectStore`: whole-object put/get/list/delete under one root, counted.

`filesystem(url)` gives the cost pipeline a pyarrow filesystem for its s3:// ledgers: endpoint, region and
credentials come from the standard AWS environment variables (`AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_S3`,
`AWS_REGION` / `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`)
unless given explicitly.

`ObjectStore` talks to S3 through `s3client.S3Objects` (boto3, the same environment variables: one request
per call, no HEAD before a GET or PUT, no directory markers), and counts every request it makes (each HTTP
attempt, retries included) into `zonebus.storage.meter.METER` by kind and purpose. `put(key, data,
if_absent=True)` is a create-only write: S3's `If-None-Match: *` (412 -> `ObjectExists`), `link(2)` on a
file system; writers use it to be fenced without a LIST per upload. `put` is atomic and durable: on S3 the
object appears whole once the PUT returns; on a local file system it is written to a hidden temporary file,
fsynced, renamed (or linked) into place and its directory fsynced (the rename is a new directory entry; a
directory created for it gets its parent fsynced too). That path uses `os` directly (pyarrow's
LocalFileSystem has no fsync, and a few plain system calls cost a worker thread fewer hand-overs of the GIL);
concurrent puts into one directory share directory fsyncs (`_DirSync`). Names starting with `.` are never
listed. Keys are `/`-separated paths relative to the root.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from zonebus.storage.meter import METER, RequestMeter, purpose_of
from zonebus.storage.s3client import S3Objects, s3_location


class StorageError(Exception):
    """A shared-storage URL or setting that cannot be used."""


class ObjectExists(FileExistsError):
    """A create-only put found the object there already."""


def s3_filesystem(endpoint: str = "", region: str = "", bucket: str = "") -> pafs.S3FileSystem:
    """An S3 filesystem; empty `endpoint`/`region` fall back to the AWS environment variables."""
    endpoint, region = s3_location(endpoint, region)
    kwargs: dict = {"background_writes": False, "allow_delayed_open": True}
    if endpoint:
        u = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = u.netloc + u.path.rstrip("/")
        kwargs["scheme"] = u.scheme or "https"
        kwargs["region"] = region or "us-east-1"
    elif region:
        kwargs["region"] = region
    elif bucket:
        try:
            kwargs["region"] = pafs.resolve_s3_region(bucket)
        except OSError:
            pass
    return pafs.S3FileSystem(**kwargs)


def filesystem(url: str, endpoint: str = "", region: str = "") -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for an `s3://bucket/prefix` or `file:///path` URL (or a plain path)."""
    u = urlparse(url)
    if u.scheme == "s3":
        if not u.netloc:
            raise StorageError(f"{url}: an s3:// URL needs a bucket (s3://bucket/prefix)")
        return s3_filesystem(endpoint, region, u.netloc), (u.netloc + u.path).rstrip("/")
    if u.scheme == "file":
        if u.netloc not in ("", "localhost"):
            raise StorageError(f"{url}: a file:// URL needs an absolute path (file:///path)")
        return pafs.LocalFileSystem(), u.path.rstrip("/") or "/"
    if u.scheme == "":
        return pafs.LocalFileSystem(), os.path.abspath(url)
    raise StorageError(f"{url}: unsupported storage URL scheme {u.scheme!r} (use file:// or s3://)")


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _DirSync:
    """fsyncs of one directory shared by the threads that renamed into it: a caller's rename is durable once a
    directory fsync that *started after* the rename has completed, so a caller that finds one running waits for
    the next one, which also covers everybody else waiting, instead of each caller running its own."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._started = 0  # directory fsyncs started so far
        self._done = 0  # the highest started-number whose fsync completed
        self._running = False

    def sync(self, path: str) -> bool:
        """Return once `path` was fsynced after this call began; True when this caller ran that fsync."""
        ran = False
        with self._cond:
            need = self._started + 1  # the first fsync to start from now on covers this caller's rename
            while self._done < need:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                self._started += 1
                mine = self._started
                self._cond.release()
                try:
                    _fsync_path(path)
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._cond.notify_all()
                self._done = max(self._done, mine)  # (not reached when the fsync raised: the caller sees it)
                ran = True
        return ran


class ObjectStore:
    """Whole objects under `root` of a local file system (a pyarrow `LocalFileSystem`) or of S3 (`S3Objects`).
    Every method blocks: call from a worker thread."""

    def __init__(self, fs: Any, root: str, meter: RequestMeter | None = None, label: str = "") -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.local = isinstance(fs, pafs.LocalFileSystem)
        self.meter = meter or METER
        self.label = label or (f"file://{self.root}" if self.local else f"s3://{self.root}")
        self._made_dirs: set[str] = set()
        self._dir_syncs: dict[str, _DirSync] = {}
        self._lock = threading.Lock()
        self.dir_fsyncs = 0  # directory fsyncs run (a local file system); puts that shared one do not count
        if not self.local and hasattr(fs, "on_request"):
            fs.on_request(self._count_s3)

    @classmethod
    def from_url(cls, url: str, endpoint: str = "", region: str = "") -> ObjectStore:
        u = urlparse(url)
        if u.scheme == "s3":
            if not u.netloc:
                raise StorageError(f"{url}: an s3:// URL needs a bucket (s3://bucket/prefix)")
            return cls(S3Objects(u.netloc, endpoint, region), (u.netloc + u.path).rstrip("/"))
        fs, root = filesystem(url, endpoint, region)
        return cls(fs, root)

    def path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def _key_of(self, path: str) -> str:
        return path[len(self.root) + 1:] if path.startswith(self.root + "/") else ""

    def _count(self, kind: str, key: str, nbytes: int = 0, n: int = 1) -> None:
        self.meter.count(self.label, kind, purpose_of(key), nbytes, n)

    def _count_s3(self, kind: str, path: str, nbytes: int) -> None:
        """S3Objects' hook: one HTTP request (each attempt) on `path` (bucket/key or bucket/prefix)."""
        self._count(kind, self._key_of(path), nbytes)

    def _mkdirs(self, d: str) -> None:
        if d in self._made_dirs:
            return
        missing = []
        p = d
        while p and p != "/" and not os.path.isdir(p):
            missing.append(p)
            p = os.path.dirname(p)
        for new in reversed(missing):
            try:
                os.mkdir(new)
            except FileExistsError:
                continue  # made by another thread or process, which syncs its parent
            self._sync_dir(os.path.dirname(new))  # the new directory's entry must survive a crash too
        self._made_dirs.add(d)

    def forget_dirs(self) -> None:
        """Forget which directories were made (a writer whose folder was removed under it makes it again)."""
        self._made_dirs.clear()

    def _sync_dir(self, d: str) -> None:
        with self._lock:
            ds = self._dir_syncs.get(d)
            if ds is None:
                ds = self._dir_syncs[d] = _DirSync()
        if ds.sync(d):
            with self._lock:
                self.dir_fsyncs += 1

    def put(self, key: str, data: bytes, if_absent: bool = False) -> None:
        """Write a whole object atomically; durable when this returns. With `if_absent`, only if no object of
        that key exists (`ObjectExists` otherwise)."""
        path = self.path(key)
        if not self.local:
            self.fs.put(path, data, if_absent)
            return
        self._count("PUT", key, len(data))
        d, name = path.rsplit("/", 1)
        self._mkdirs(d)
        tmp = f"{d}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            if if_absent:
                try:
                    os.link(tmp, path)  # create-only: fails when the name exists
                except FileExistsError:
                    raise ObjectExists(key)
                finally:
                    os.unlink(tmp)
            else:
                os.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._sync_dir(d)

    def get(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError when it does not exist."""
        if not self.local:
            data = self.fs.get(self.path(key))
        else:
            self._count("GET", key)
            with open(self.path(key), "rb") as f:
                data = f.read()
        self._count("GET", key, len(data), n=0)
        return data

    def get_range(self, key: str, start: int, length: int) -> tuple[bytes, int]:
        """(up to `length` bytes from `start`, the object's whole size): one ranged GET."""
        if not self.local:
            data, size = self.fs.get_range(self.path(key), start, length)
        else:
            self._count("GET", key)
            with open(self.path(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(start)
                data = f.read(length)
        self._count("GET", key, len(data), n=0)
        return data, size

    def list(self, prefix: str, dirs: bool = False) -> list[str]:
        """Names (not paths) of the objects (or, with `dirs`, the sub-directories) directly under `prefix`."""
        if not self.local:
            files, subdirs = self.fs.list(self.path(prefix))
            return sorted(n for n in (subdirs if dirs else files) if not n.startswith("."))
        self._count("LIST", prefix)
        try:  # (one scandir, no FileInfo objects)
            with os.scandir(self.path(prefix)) as it:
                return sorted(e.name for e in it if not e.name.startswith(".")
                              and (e.is_dir() if dirs else e.is_file()))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def list_recursive(self, prefix: str) -> list[str]:
        """Keys (relative to the root) of every object under `prefix`."""
        n = len(self.root) + 1
        if not self.local:
            return sorted(p[n:] for p in self.fs.list_recursive(self.path(prefix)))
        self._count("LIST", prefix)
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(prefix), allow_not_found=True, recursive=True))
        return sorted(i.path[n:] for i in infos if i.type == pafs.FileType.File)

    def exists(self, key: str) -> bool:
        if not self.local:
            return self.fs.exists(self.path(key))
        self._count("HEAD", key)
        return os.path.isfile(self.path(key))

    def delete(self, key: str) -> None:
        if not self.local:
            self.fs.delete(self.path(key))
            return
        self._count("DELETE", key)
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under `prefix` (and, on a local file system, its directories)."""
        for key in self.list_recursive(prefix):
            self.delete(key)
        if self.local:
            try:
                self.fs.delete_dir(self.path(prefix))
            except (FileNotFoundError, OSError):
                pass
            gone = self.path(prefix)
            self._made_dirs = {d for d in self._made_dirs if not d.startswith(gone)}
            with self._lock:
                self._dir_syncs = {d: v for d, v in self._dir_syncs.items() if not d.startswith(gone)}
