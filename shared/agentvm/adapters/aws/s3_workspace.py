"""A container's workspace synced between S3 and a local directory (the container tier's `Disk`).

Layout: `workspaces/{tenant}/{container}/{path}`, where `{path}` is the file's path relative to the
workspace root, `/`-separated. The two ids are escaped (`%` → `%25`, `/` → `%2F`), so no id can
reach into another container's prefix. Each object carries its sha256 and permission bits
(`x-amz-meta-sha256`, `x-amz-meta-mode`, octal); empty directories, symlinks, sockets, fifos and
devices are not synced.

* `pull(local_dir)` downloads every object under the prefix. Keys that are not a plain relative
  path (`..`, `.`, empty segments, a leading `/`, NUL) are skipped with a warning. Directories are
  opened one component at a time with `O_NOFOLLOW` relative to the parent's descriptor, so a symlink
  already in `local_dir` (`a -> /etc`) cannot redirect a key (`a/passwd`) outside; a file is
  written to a temporary name and renamed into place, which replaces a symlink instead of
  following it.
* `push(local_dir)` walks `local_dir` the same way (never following a symlink, reading only regular
  files opened with `O_NOFOLLOW`) and uploads what is new or changed, deletes the objects of files
  that are gone, and skips files above `max_file_bytes` with a warning (their stored copy stays).
  "Changed" is decided against the manifest of what this instance pulled or pushed: same size,
  mtime and mode → unchanged without reading the file; else the sha256 decides. Only objects this
  instance knows of are deleted, so a push without a pull never removes anything it did not write.

Uploads are single PutObject requests streamed from the open file (no multipart: files above 5 GB
are far beyond the default limit). File-system work runs on threads; S3 calls use the awaitable
botocore client (`botocore_async`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import logging
import os
import stat
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final, TypeVar

from botocore.exceptions import ClientError

from agentvm.errors import InvalidRequest

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

log = logging.getLogger(__name__)

WORKSPACES_PREFIX: Final = "workspaces/"
DEFAULT_MAX_FILE_BYTES: Final = 100 * 1024 * 1024
DEFAULT_CONCURRENCY: Final = 8
_CHUNK = 1024 * 1024
_DELETE_BATCH = 1000  # DeleteObjects' limit
_MAX_KEY_BYTES = 1024  # S3's limit for a key
_TMP_PREFIX = ".avm-sync-"  # a pull's temporary files; never uploaded
_DEFAULT_MODE = 0o644
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Path conflicts a pull skips (a key under a file, a directory where a file goes, a symlink on the way).
_CONFLICTS = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY,
                        errno.ENAMETOOLONG})
_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SyncStats:
    """What one `push` did. `skipped`: symlinks, special files, unencodable names, files too large."""

    uploaded: int = 0
    deleted: int = 0
    unchanged: int = 0
    skipped: int = 0
    bytes_uploaded: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    size: int
    mtime_ns: int
    mode: int
    sha256: str


@dataclass(frozen=True, slots=True)
class _LocalFile:
    rel: str
    size: int
    mtime_ns: int
    mode: int


def workspace_prefix(tenant_id: str, container_id: str) -> str:
    """`workspaces/{tenant}/{container}/`, ids escaped."""
    return f"{WORKSPACES_PREFIX}{_segment(tenant_id, 'tenant_id')}/{_segment(container_id, 'container_id')}/"


def _segment(value: str, field: str) -> str:
    if value in ("", ".", "..") or "\x00" in value:
        raise InvalidRequest(f"Invalid id for a workspace key: {value!r}", field=field)
    return value.replace("%", "%25").replace("/", "%2F")


class S3Workspace:
    """Pull and push one container's workspace. Keep the instance for the container's life in the
    task: its manifest is what makes `push` incremental."""

    def __init__(self, bucket: str, prefix: str, client: S3Client, *,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        parts = prefix.strip("/").split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"invalid workspace prefix: {prefix!r}")  # never the whole bucket
        if concurrency < 1 or max_file_bytes < 0:
            raise ValueError("concurrency must be positive and max_file_bytes not negative")
        self.bucket = bucket
        self.prefix = "/".join(parts) + "/"
        self.client = client
        self.max_file_bytes = max_file_bytes
        self.concurrency = concurrency
        self._manifest: dict[str, _Entry] = {}  # relative path → what the stored object holds

    @classmethod
    def for_container(cls, bucket: str, tenant_id: str, container_id: str, client: S3Client, *,
                      max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                      concurrency: int = DEFAULT_CONCURRENCY) -> S3Workspace:
        return cls(bucket, workspace_prefix(tenant_id, container_id), client, max_file_bytes=max_file_bytes,
                   concurrency=concurrency)

    # ---- pull ----------------------------------------------------------------------------------

    async def pull(self, local_dir: str | os.PathLike[str]) -> int:
        """Download every object of the workspace into `local_dir` (created if missing); returns the
        number of files written. The manifest then describes exactly these files."""
        keys = await self._list()
        root = await asyncio.to_thread(_open_root, os.fspath(local_dir), True)
        try:
            jobs: list[Callable[[], Awaitable[tuple[str, _Entry] | None]]] = []
            for key in keys:
                rel = key[len(self.prefix):]
                parts = _rel_parts(rel)
                if parts is not None:
                    jobs.append(functools.partial(self._download, root, rel, parts))
                elif not (rel.endswith("/") and (rel == "/" or _rel_parts(rel[:-1]) is not None)):
                    log.warning("workspace pull: unsafe key skipped", extra={"key": key})
                # else a "folder" marker: directories are created for the files in them
            results = await _bounded(jobs, self.concurrency)
        finally:
            os.close(root)
        self._manifest = dict(r for r in results if r is not None)
        return len(self._manifest)

    async def _list(self) -> list[str]:
        keys: list[str] = []
        token: str | None = None
        while True:
            if token is None:
                resp = await self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix)
            else:
                resp = await self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix,
                                                         ContinuationToken=token)
            keys.extend(obj["Key"] for obj in resp.get("Contents", []))
            if not resp.get("IsTruncated"):
                return keys
            token = resp["NextContinuationToken"]

    async def _download(self, root: int, rel: str, parts: tuple[str, ...]) -> tuple[str, _Entry] | None:
        try:
            resp = await self.client.get_object(Bucket=self.bucket, Key=self.prefix + rel)
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in _NOT_FOUND:
                return None  # deleted since the listing
            raise
        body: Any = resp["Body"]  # botocore's (blocking) StreamingBody: read on the thread
        try:
            entry = await asyncio.to_thread(_write_file, root, parts, body, _mode(resp.get("Metadata", {})))
        finally:
            body.close()
        return None if entry is None else (rel, entry)

    # ---- push ----------------------------------------------------------------------------------

    async def push(self, local_dir: str | os.PathLike[str]) -> SyncStats:
        """Upload new and changed files, delete the objects of files that are gone."""
        root = await asyncio.to_thread(_open_root, os.fspath(local_dir), False)
        try:
            max_rel = _MAX_KEY_BYTES - len(self.prefix.encode())
            files, present, skipped = await asyncio.to_thread(_scan, root, self.max_file_bytes, max_rel)
            unchanged = 0
            jobs: list[Callable[[], Awaitable[int | None]]] = []
            for f in files:
                known = self._manifest.get(f.rel)
                if known is not None and (known.size, known.mtime_ns, known.mode) == (f.size, f.mtime_ns, f.mode):
                    unchanged += 1
                else:
                    jobs.append(functools.partial(self._upload, root, f))
            results = await _bounded(jobs, self.concurrency)
        finally:
            os.close(root)
        uploaded = [n for n in results if n is not None and n >= 0]
        deleted = await self._delete([rel for rel in self._manifest if rel not in present])
        return SyncStats(uploaded=len(uploaded), deleted=deleted,
                         unchanged=unchanged + sum(1 for n in results if n == -1),
                         skipped=skipped + sum(1 for n in results if n is None), bytes_uploaded=sum(uploaded))

    async def _upload(self, root: int, f: _LocalFile) -> int | None:
        """Bytes uploaded; -1 when the content turned out unchanged; None when the file is no longer
        a regular file (or grew too large)."""
        opened = await asyncio.to_thread(_open_and_hash, root, f.rel)
        if opened is None:
            return None
        fileobj, entry = opened
        try:
            known = self._manifest.get(f.rel)
            if known is not None and (known.sha256, known.mode) == (entry.sha256, entry.mode):
                self._manifest[f.rel] = entry  # touched, not changed: remember the new mtime
                return -1
            if entry.size > self.max_file_bytes:
                log.warning("workspace push: file too large, skipped",
                            extra={"path": f.rel, "size": entry.size, "limit": self.max_file_bytes})
                return None
            await self.client.put_object(Bucket=self.bucket, Key=self.prefix + f.rel, Body=fileobj,
                                         Metadata={"sha256": entry.sha256, "mode": f"{entry.mode:o}"})
            after = await asyncio.to_thread(os.fstat, fileobj.fileno())
        finally:
            await asyncio.to_thread(fileobj.close)
        if (after.st_size, after.st_mtime_ns) == (entry.size, entry.mtime_ns):
            self._manifest[f.rel] = entry
        else:  # written to while uploading: the next push uploads it again
            self._manifest.pop(f.rel, None)
        return entry.size

    async def _delete(self, rels: list[str]) -> int:
        deleted = 0
        for start in range(0, len(rels), _DELETE_BATCH):
            chunk = rels[start:start + _DELETE_BATCH]
            resp = await self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": self.prefix + rel} for rel in chunk], "Quiet": True})
            failed = {str(e.get("Key", "")) for e in resp.get("Errors", [])}
            if failed:
                log.warning("workspace push: objects not deleted (retried at the next push)",
                            extra={"keys": sorted(failed)[:20], "count": len(failed)})
            for rel in chunk:
                if self.prefix + rel not in failed:
                    self._manifest.pop(rel, None)
                    deleted += 1
        return deleted


# ---- helpers (blocking: run on threads) ------------------------------------------------------


async def _bounded(jobs: Iterable[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run the jobs with at most `limit` at a time; the first failure cancels the rest and is raised."""
    semaphore = asyncio.Semaphore(limit)

    async def run(job: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await job()

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(run(job)) for job in jobs]
    except BaseExceptionGroup as failures:
        raise failures.exceptions[0] from failures
    return [task.result() for task in tasks]


def _rel_parts(rel: str) -> tuple[str, ...] | None:
    """The path components of a key below the prefix, or None if it is not a plain relative path."""
    if not rel or rel.startswith("/") or "\x00" in rel:
        return None
    parts = tuple(rel.split("/"))
    if any(part in ("", ".", "..") for part in parts) or parts[-1].startswith(_TMP_PREFIX):
        return None
    return parts


def _mode(metadata: dict[str, str]) -> int:
    try:
        return int(metadata.get("mode", ""), 8) & 0o777  # permission bits only: never setuid
    except ValueError:
        return _DEFAULT_MODE


def _open_root(path: str, create: bool) -> int:
    if create:
        os.makedirs(path, exist_ok=True)
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _open_dir(root: int, names: Iterable[str], *, create: bool) -> int:
    """Open root/names... one component at a time, never following a symlink."""
    fd = os.dup(root)
    try:
        for name in names:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_file(root: int, parts: tuple[str, ...], body: Any, mode: int) -> _Entry | None:
    rel = "/".join(parts)
    try:
        parent = _open_dir(root, parts[:-1], create=True)
    except OSError as exc:
        if exc.errno not in _CONFLICTS:
            raise
        log.warning("workspace pull: key skipped (path conflict or symlink)", extra={"path": rel, "error": str(exc)})
        return None
    tmp = f"{_TMP_PREFIX}{uuid.uuid4().hex}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
        try:
            digest = hashlib.sha256()
            for chunk in body.iter_chunks(_CHUNK):
                digest.update(chunk)
                _write_all(fd, chunk)
            os.fchmod(fd, mode)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=parent)
            raise
        os.close(fd)
        try:
            # rename replaces a symlink at the destination, it never follows it
            os.rename(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except OSError as exc:
            os.unlink(tmp, dir_fd=parent)
            if exc.errno not in _CONFLICTS:
                raise
            log.warning("workspace pull: key skipped (a directory is in the way)", extra={"path": rel})
            return None
    finally:
        os.close(parent)
    return _Entry(st.st_size, st.st_mtime_ns, mode, digest.hexdigest())


def _scan(root: int, max_bytes: int, max_rel_bytes: int) -> tuple[list[_LocalFile], set[str], int]:
    """Regular files under root (never through a symlink): the ones to consider for upload, every
    regular file's path (too large ones too: their stored copy stays), and how many were skipped."""
    files: list[_LocalFile] = []
    present: set[str] = set()
    skipped = 0
    pending: list[tuple[str, ...]] = [()]
    while pending:
        dir_parts = pending.pop()
        try:
            fd = _open_dir(root, dir_parts, create=False)
        except OSError as exc:  # replaced by a symlink or removed since it was listed
            if exc.errno not in (*_CONFLICTS, errno.ENOENT):
                raise
            skipped += 1
            continue
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    parts = (*dir_parts, entry.name)
                    rel = "/".join(parts)
                    try:
                        encoded = rel.encode()
                    except UnicodeEncodeError:
                        log.warning("workspace push: file name is not UTF-8, skipped", extra={"path": repr(rel)})
                        skipped += 1
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        pending.append(parts)
                    elif not stat.S_ISREG(st.st_mode):
                        skipped += 1  # symlink, socket, fifo, device
                    elif entry.name.startswith(_TMP_PREFIX):
                        continue  # a pull in progress
                    elif len(encoded) > max_rel_bytes:
                        log.warning("workspace push: path too long for an S3 key, skipped", extra={"path": rel})
                        skipped += 1
                    else:
                        present.add(rel)
                        if st.st_size > max_bytes:
                            log.warning("workspace push: file too large, skipped",
                                        extra={"path": rel, "size": st.st_size, "limit": max_bytes})
                            skipped += 1
                        else:
                            files.append(_LocalFile(rel, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode) & 0o777))
        finally:
            os.close(fd)
    return files, present, skipped


def _open_and_hash(root: int, rel: str) -> tuple[IO[bytes], _Entry] | None:
    """The file opened without following symlinks, rewound after hashing; None unless a regular file."""
    parts = rel.split("/")
    try:
        parent = _open_dir(root, parts[:-1], create=False)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as exc:  # gone, or replaced by a symlink (ELOOP) or a socket (ENXIO) since the scan
        if exc.errno not in (*_CONFLICTS, errno.ENOENT, errno.ENXIO):
            raise
        return None
    fileobj = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            fileobj.close()
            return None
        digest = hashlib.sha256()
        while chunk := fileobj.read(_CHUNK):
            digest.update(chunk)
        fileobj.seek(0)
    except BaseException:
        fileobj.close()
        raise
    return fileobj, _Entry(st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode) & 0o777, digest.hexdigest())
