"""LocalFileSystem: the port's operations, and confinement to the root."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from agentvm.adapters.local.local_fs import LocalFileSystem
from agentvm.errors import InvalidRequest, NotFound
from tests.sandbox.conftest import needs_root


@pytest.fixture
def roots(base: Path) -> tuple[Path, Path]:
    ws, other = base / "ws", base / "other"
    ws.mkdir()
    other.mkdir()
    (other / "secret.txt").write_text("other container's secret")
    return ws, other


@pytest.fixture
def fs(roots: tuple[Path, Path]) -> LocalFileSystem:
    return LocalFileSystem(roots[0])


async def test_write_read_stat_list_remove(fs: LocalFileSystem, roots: tuple[Path, Path]) -> None:
    assert await fs.write_bytes("projects/app/main.py", b"print('hi')\n") == 12
    assert (roots[0] / "projects/app/main.py").read_bytes() == b"print('hi')\n"
    assert await fs.read_bytes("projects/app/main.py") == b"print('hi')\n"
    assert await fs.read_bytes("./projects//app/../app/main.py", max_bytes=5) == b"print"
    assert await fs.write_bytes("projects/app/main.py", b"x") == 1  # replaced, not appended
    assert await fs.read_bytes("projects/app/main.py") == b"x"

    info = await fs.stat("projects/app/main.py")
    assert info is not None and (info.path, info.kind, info.size) == ("projects/app/main.py", "file", 1)
    assert info.modified_ms > 0
    folder = await fs.stat("projects/app")
    assert folder is not None and folder.kind == "dir"
    root = await fs.stat(".")
    assert root is not None and root.kind == "dir" and root.path == "."
    assert await fs.stat("projects/missing") is None
    assert await fs.stat("missing/deeper") is None

    await fs.mkdir("projects/app/src/pkg")
    await fs.mkdir("projects/app/src/pkg")  # exists: fine
    await fs.write_bytes("projects/app/src/pkg/b.txt", b"bb")
    await fs.write_bytes("projects/app/src/a.txt", b"a")
    assert [(i.path, i.kind) for i in await fs.list("projects/app")] == [
        ("projects/app/main.py", "file"), ("projects/app/src", "dir")]
    assert [i.path for i in await fs.list("projects", recursive=True)] == [
        "projects/app", "projects/app/main.py", "projects/app/src", "projects/app/src/a.txt",
        "projects/app/src/pkg", "projects/app/src/pkg/b.txt"]
    assert len(await fs.list(".", recursive=True, limit=3)) == 3
    assert [i.path for i in await fs.list()] == ["projects"]

    assert await fs.remove("projects/app/main.py") is True
    assert await fs.remove("projects/app/main.py") is False
    assert await fs.remove("projects/app") is True  # a whole tree
    assert not (roots[0] / "projects/app").exists()
    assert await fs.remove("nowhere/at/all") is False


async def test_errors_name_the_path_and_reason(fs: LocalFileSystem) -> None:
    await fs.write_bytes("f.txt", b"f")
    with pytest.raises(NotFound, match=re.escape("path 'missing.txt': no such file")):
        await fs.read_bytes("missing.txt")
    with pytest.raises(InvalidRequest, match=re.escape("path 'f.txt': is not a directory")):
        await fs.list("f.txt")
    with pytest.raises(InvalidRequest, match=re.escape("path '.': is a directory")):
        await fs.read_bytes(".")
    with pytest.raises(InvalidRequest, match=re.escape("'f.txt' is not a directory")):
        await fs.write_bytes("f.txt/inner", b"x")
    with pytest.raises(InvalidRequest, match="exists and is not a directory"):
        await fs.mkdir("f.txt")
    with pytest.raises(InvalidRequest, match="the workspace root cannot be removed"):
        await fs.remove(".")
    os.mkfifo(fs.root / "fifo")
    with pytest.raises(InvalidRequest, match="not a regular file"):  # and does not block on the FIFO
        await fs.read_bytes("fifo")


@pytest.mark.parametrize(("path", "reason"), [
    ("/etc/passwd", "path '/etc/passwd': absolute paths are not allowed"),
    ("../x", "path '../x': '..' leaves the workspace"),
    ("..", "path '..': '..' leaves the workspace"),
    ("a/../../other/secret.txt", "'..' leaves the workspace"),
    ("a\0b", "contains a NUL byte"),
])
async def test_lexical_escapes_are_refused(fs: LocalFileSystem, path: str, reason: str) -> None:
    for op in (fs.read_bytes(path), fs.write_bytes(path, b"x"), fs.list(path), fs.stat(path), fs.mkdir(path),
               fs.remove(path)):
        with pytest.raises(InvalidRequest, match=re.escape(reason)) as info:
            await op
        assert info.value.field == "path"


async def test_symlinks_out_of_the_root_are_refused(fs: LocalFileSystem, roots: tuple[Path, Path]) -> None:
    ws, other = roots
    (ws / "etc").symlink_to("/etc")
    (ws / "passwd").symlink_to("/etc/passwd")
    (ws / "sibling").symlink_to("../other")  # the next container's workspace, relative
    (ws / "sibling_abs").symlink_to(other)  # and absolute
    (ws / "sub").mkdir()
    (ws / "sub" / "up").symlink_to("../../other/secret.txt")
    escape = "a symlink leads out of the workspace"
    for path in ("etc/passwd", "passwd", "sibling/secret.txt", "sibling_abs/secret.txt", "sub/up"):
        with pytest.raises(InvalidRequest, match=re.escape(f"path '{path}': {escape}")):
            await fs.read_bytes(path)
        with pytest.raises(InvalidRequest, match=escape):
            await fs.write_bytes(path, b"pwned")
    with pytest.raises(InvalidRequest, match=escape):
        await fs.write_bytes("sibling/new.txt", b"pwned")
    with pytest.raises(InvalidRequest, match=escape):
        await fs.list("sibling")
    with pytest.raises(InvalidRequest, match=escape):
        await fs.mkdir("sibling/newdir")
    with pytest.raises(InvalidRequest, match=escape):
        await fs.stat("etc/passwd")
    assert (other / "secret.txt").read_text() == "other container's secret"
    assert not (other / "new.txt").exists() and not (other / "newdir").exists()

    # The link itself is an entry of the workspace: stat shows it, remove deletes only the link.
    info = await fs.stat("passwd")
    assert info is not None and info.kind == "symlink"
    assert await fs.remove("sibling") is True
    assert (other / "secret.txt").exists()
    # Listing does not enter symlinked directories.
    assert "etc/passwd" not in [i.path for i in await fs.list(".", recursive=True)]


async def test_symlinks_that_stay_inside_are_followed(fs: LocalFileSystem, roots: tuple[Path, Path]) -> None:
    ws = roots[0]
    await fs.write_bytes("projects/real/data.txt", b"data")
    (ws / "rel").symlink_to("projects/real")
    (ws / "abs").symlink_to(ws / "projects/real")
    (ws / "projects" / "up").symlink_to("../projects/real/data.txt")
    (ws / "dangling").symlink_to("projects/new/file.txt")
    assert await fs.read_bytes("rel/data.txt") == b"data"
    assert await fs.read_bytes("abs/data.txt") == b"data"
    assert await fs.read_bytes("projects/up") == b"data"
    assert [i.path for i in await fs.list("rel")] == ["rel/data.txt"]
    await fs.write_bytes("dangling", b"created through the link")
    assert (ws / "projects/new/file.txt").read_bytes() == b"created through the link"
    (ws / "loop1").symlink_to("loop2")
    (ws / "loop2").symlink_to("loop1")
    with pytest.raises(InvalidRequest, match="too many levels of symlinks"):
        await fs.read_bytes("loop1")


@needs_root
async def test_owner_gets_what_the_server_writes(base: Path, tool_uid: int) -> None:
    fs = LocalFileSystem(base, owner=(tool_uid, tool_uid))
    await fs.write_bytes("a/b/c.txt", b"x")
    await fs.mkdir("d/e")
    for rel in ("a", "a/b", "a/b/c.txt", "d", "d/e"):
        st = os.stat(base / rel)
        assert (st.st_uid, st.st_gid) == (tool_uid, tool_uid), rel


@needs_root
async def test_hard_link_to_a_host_file_is_refused(base: Path, tool_uid: int) -> None:
    ws = base / "ws"
    ws.mkdir()
    host_file = base / "host-secret"
    host_file.write_text("root's")
    os.link(host_file, ws / "linked")  # root can; a tool cannot (fs.protected_hardlinks)
    fs = LocalFileSystem(ws, owner=(tool_uid, tool_uid))
    with pytest.raises(InvalidRequest, match="a hard link to a file the workspace does not own"):
        await fs.read_bytes("linked")
    with pytest.raises(InvalidRequest, match="hard link"):
        await fs.write_bytes("linked", b"overwritten")
    assert host_file.read_text() == "root's"
