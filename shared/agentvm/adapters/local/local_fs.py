"""A FileSystem confined to a directory on disk (a container's workspace).

Paths are relative POSIX paths, normalised lexically first: absolute paths, a NUL byte and a `..`
that leaves the root are refused before anything touches the disk. The rest is resolved one
component at a time with directory file descriptors (`openat`-style): every component is opened
relative to the already open parent with `O_NOFOLLOW`, and a symlink is followed by reading it and
continuing the walk ourselves, only while it stays inside the root (an absolute target must name a
path under the root; a relative target's `..` cannot climb above the root's descriptor). So a tool
that swaps a directory for a symlink while we resolve gets an error, never an escape: there is no
check-then-use window on the path. What a descriptor can still see is a directory the tool moved out
of the workspace after we opened it; it holds only the tool's own files. When the server runs as
root and the workspace has an `owner` (the uid tools run as), a file with several hard links that
the owner does not own is refused, so a hard link to a host file cannot be read or written through
the server's privileges (the kernel's `fs.protected_hardlinks` already prevents making one).
"""

from __future__ import annotations

import asyncio
import builtins
import os
import posixpath
import shutil
import stat as st_
from pathlib import Path

from agentvm.domain.models import FileInfo
from agentvm.errors import InvalidRequest, NotFound

_MAX_SYMLINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_CHUNK = 1 << 20
_MAX_LIST_DEPTH = 64  # a recursive listing enters at most this many levels (one descriptor each)


def _bad(path: str, reason: str) -> InvalidRequest:
    return InvalidRequest(f"path {path!r}: {reason}", field="path")


def _missing(path: str) -> NotFound:
    return NotFound(f"path {path!r}: no such file or directory", field="path")


def _kind(mode: int) -> str:
    if st_.S_ISREG(mode):
        return "file"
    if st_.S_ISDIR(mode):
        return "dir"
    if st_.S_ISLNK(mode):
        return "symlink"
    return "other"


def _info(rel: str, st: os.stat_result) -> FileInfo:
    return FileInfo(path=rel, kind=_kind(st.st_mode), size=st.st_size, modified_ms=st.st_mtime_ns // 1_000_000)


def _join(prefix: str, name: str) -> str:
    return name if prefix in ("", ".") else f"{prefix}/{name}"


class LocalFileSystem:
    """FileSystem on a directory. `owner` (uid, gid): who owns what this creates when the server
    runs as root (the uid tools run as, so they can change the files the agent wrote).

    Inside this class `list` names the method, so annotations spell the type `builtins.list`."""

    def __init__(self, root: Path, *, owner: tuple[int, int] | None = None) -> None:
        self.root = Path(os.path.realpath(root))
        self._owner = owner if owner is not None and os.geteuid() == 0 else None

    # -- the port ----------------------------------------------------------------------------------

    async def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return await asyncio.to_thread(self._read, path, max_bytes)

    async def write_bytes(self, path: str, data: bytes) -> int:
        return await asyncio.to_thread(self._write, path, bytes(data))

    async def list(self, path: str = ".", *, recursive: bool = False, limit: int = 1000) -> builtins.list[FileInfo]:
        return await asyncio.to_thread(self._list, path, recursive, limit)

    async def stat(self, path: str) -> FileInfo | None:
        return await asyncio.to_thread(self._stat, path)

    async def mkdir(self, path: str) -> None:
        await asyncio.to_thread(self._mkdir, path)

    async def remove(self, path: str) -> bool:
        return await asyncio.to_thread(self._remove, path)

    # -- path resolution ---------------------------------------------------------------------------

    def _parts(self, path: str) -> tuple[str, builtins.list[str]]:
        """The normalised relative path and its components; refuses what cannot be inside."""
        if not isinstance(path, str):
            raise InvalidRequest(f"path {path!r}: not a string", field="path")
        if "\0" in path:
            raise _bad(path, "contains a NUL byte")
        if path.startswith("/"):
            raise _bad(path, "absolute paths are not allowed")
        norm = posixpath.normpath(path or ".")
        if norm == ".." or norm.startswith("../"):
            raise _bad(path, "'..' leaves the workspace")
        return norm, ([] if norm == "." else norm.split("/"))

    def _inside(self, target: str) -> builtins.list[str] | None:
        """An absolute symlink target as components under the root, or None when it is outside."""
        norm = posixpath.normpath(target)
        root = str(self.root)
        if norm == root:
            return []
        if norm.startswith(root.rstrip("/") + "/"):
            return norm[len(root.rstrip("/")) + 1:].split("/")
        return None

    def _walk(self, path: str, parts: builtins.list[str], *, follow: bool,
              make_parents: bool = False) -> tuple[int, str | None]:
        """(descriptor of the parent directory, final name), the name None when the path is the
        root or ends in a directory reached through a symlink. The final name is not a symlink when
        `follow` (it may not exist). The caller closes the descriptor."""
        fd = os.open(self.root, _DIR_FLAGS)
        stack: builtins.list[int] = []  # descriptors of the directories above `fd`, for a symlink's `..`
        todo: builtins.list[str] = [*reversed(parts)]
        hops = 0
        try:
            while todo:
                name = todo.pop()
                if name in ("", "."):
                    continue
                if name == "..":
                    if not stack:
                        raise _bad(path, "a symlink leads out of the workspace")
                    os.close(fd)
                    fd = stack.pop()
                    continue
                final = not todo
                if final and not follow:
                    return fd, name
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    if final:
                        return fd, name
                    if not make_parents:
                        raise _missing(path) from None
                    self._mkdir_at(fd, name)
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if st_.S_ISLNK(st.st_mode):
                    hops += 1
                    if hops > _MAX_SYMLINKS:
                        raise _bad(path, "too many levels of symlinks")
                    target = os.readlink(name, dir_fd=fd)
                    if target.startswith("/"):
                        inside = self._inside(target)
                        if inside is None:
                            raise _bad(path, "a symlink leads out of the workspace")
                        for f in stack:
                            os.close(f)
                        stack.clear()
                        os.close(fd)
                        fd = -1
                        fd = os.open(self.root, _DIR_FLAGS)
                        todo.extend(reversed(inside))
                    else:
                        todo.extend(reversed(target.split("/")))
                    continue
                if final:
                    return fd, name
                if not st_.S_ISDIR(st.st_mode):
                    raise _bad(path, f"{name!r} is not a directory")
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:  # replaced by a symlink or removed since the stat
                    raise _bad(path, f"changed while being resolved ({exc.strerror})") from None
                stack.append(fd)
                fd = sub
            return fd, None
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        finally:
            for f in stack:
                os.close(f)

    def _mkdir_at(self, dir_fd: int, name: str) -> None:
        try:
            os.mkdir(name, 0o777, dir_fd=dir_fd)
        except FileExistsError:
            return
        if self._owner is not None:
            os.chown(name, *self._owner, dir_fd=dir_fd, follow_symlinks=False)

    def _check_links(self, path: str, st: os.stat_result) -> None:
        if self._owner is not None and st.st_nlink > 1 and st.st_uid != self._owner[0]:
            raise _bad(path, "a hard link to a file the workspace does not own")

    # -- operations (in a worker thread) -----------------------------------------------------------

    def _open_final(self, path: str, flags: int, *, make_parents: bool = False) -> int:
        _, parts = self._parts(path)
        dfd, name = self._walk(path, parts, follow=True, make_parents=make_parents)
        try:
            if name is None:
                raise _bad(path, "is a directory")
            try:
                return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666, dir_fd=dfd)
            except FileNotFoundError:
                raise _missing(path) from None
            except IsADirectoryError:
                raise _bad(path, "is a directory") from None
            except OSError as exc:  # ELOOP: became a symlink after the walk; ENXIO: a FIFO; ...
                raise _bad(path, f"cannot be opened ({exc.strerror})") from None
        finally:
            os.close(dfd)

    def _read(self, path: str, max_bytes: int | None) -> bytes:
        fd = self._open_final(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            if st_.S_ISDIR(st.st_mode):
                raise _bad(path, "is a directory")
            if not st_.S_ISREG(st.st_mode):
                raise _bad(path, "is not a regular file")
            self._check_links(path, st)
            want = st.st_size if max_bytes is None else max(0, max_bytes)
            chunks: builtins.list[bytes] = []
            got = 0
            while max_bytes is None or got < want:
                chunk = os.read(fd, _READ_CHUNK if max_bytes is None else min(_READ_CHUNK, want - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _write(self, path: str, data: bytes) -> int:
        fd = self._open_final(path, os.O_WRONLY | os.O_CREAT, make_parents=True)
        try:
            st = os.fstat(fd)
            if not st_.S_ISREG(st.st_mode):
                raise _bad(path, "is not a regular file")
            self._check_links(path, st)
            if self._owner is not None and (st.st_uid, st.st_gid) != self._owner:
                os.fchown(fd, *self._owner)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            return len(data)
        finally:
            os.close(fd)

    def _list(self, path: str, recursive: bool, limit: int) -> builtins.list[FileInfo]:
        norm, parts = self._parts(path)
        dfd, name = self._walk(path, parts, follow=True)
        try:
            if name is None:
                fd = os.dup(dfd)
            else:
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                except FileNotFoundError:
                    raise _missing(path) from None
                except NotADirectoryError:
                    raise _bad(path, "is not a directory") from None
                except OSError as exc:
                    raise _bad(path, f"cannot be opened ({exc.strerror})") from None
        finally:
            os.close(dfd)
        out: builtins.list[FileInfo] = []
        try:
            self._list_dir(fd, "" if norm == "." else norm, _MAX_LIST_DEPTH if recursive else 0, max(0, limit), out)
        finally:
            os.close(fd)
        return out

    def _list_dir(self, fd: int, prefix: str, depth: int, limit: int, out: builtins.list[FileInfo]) -> None:
        """Append the entries under `fd`, entering `depth` more levels of directories (not symlinks)."""
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
            stats: builtins.list[tuple[str, os.stat_result]] = []
            for entry in entries:
                try:
                    stats.append((entry.name, entry.stat(follow_symlinks=False)))
                except FileNotFoundError:  # removed meanwhile
                    continue
        for name, st in stats:
            if len(out) >= limit:
                return
            rel = _join(prefix, name)
            out.append(_info(rel, st))
            if depth > 0 and st_.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:  # removed or replaced meanwhile
                    continue
                try:
                    self._list_dir(sub, rel, depth - 1, limit, out)
                finally:
                    os.close(sub)

    def _stat(self, path: str) -> FileInfo | None:
        norm, parts = self._parts(path)
        try:
            dfd, name = self._walk(path, parts, follow=False)
        except NotFound:
            return None
        try:
            try:
                st = os.fstat(dfd) if name is None else os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                return None
            return _info(norm, st)
        finally:
            os.close(dfd)

    def _mkdir(self, path: str) -> None:
        _, parts = self._parts(path)
        dfd, name = self._walk(path, parts, follow=True, make_parents=True)
        try:
            if name is None:
                return
            self._mkdir_at(dfd, name)
            if not st_.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                raise _bad(path, "exists and is not a directory")
        finally:
            os.close(dfd)

    def _remove(self, path: str) -> bool:
        _, parts = self._parts(path)
        if not parts:
            raise _bad(path, "the workspace root cannot be removed")
        try:
            dfd, name = self._walk(path, parts, follow=False)
        except NotFound:
            return False
        try:
            if name is None:  # only for a path the walk ended on a directory through a symlink
                raise _bad(path, "the workspace root cannot be removed")
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                return False
            if st_.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=dfd)  # uses descriptors: does not follow symlinks
            else:
                os.unlink(name, dir_fd=dfd)
            return True
        finally:
            os.close(dfd)
