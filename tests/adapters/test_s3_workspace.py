"""S3Workspace against the session's moto server: round trips, incremental pushes, unsafe keys and
symlinks that must never lead outside the local directory."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agentvm.adapters.aws.s3_workspace import S3Workspace, SyncStats, workspace_prefix
from agentvm.errors import InvalidRequest
from tests.adapters.conftest import bucket_keys

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

pytestmark = pytest.mark.usefixtures("aws_env")

PREFIX = "workspaces/t1/c1/"


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file under root (not through symlinks), by relative path."""
    out: dict[str, bytes] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def paths(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def write(root: Path, rel: str, data: bytes, mode: int = 0o644) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


async def get(s3: S3Client, bucket: str, key: str) -> bytes:
    resp = await s3.get_object(Bucket=bucket, Key=key)
    body = resp["Body"]
    data = body.read()  # botocore's blocking body (the awaitable client wraps botocore)
    assert isinstance(data, bytes)
    return data


def test_prefix_escapes_ids_and_refuses_dot_segments(s3: S3Client) -> None:
    assert workspace_prefix("t1", "c1") == "workspaces/t1/c1/"
    assert workspace_prefix("a/b", "50%") == "workspaces/a%2Fb/50%25/"
    for bad in ("", ".", "..", "x\x00"):
        with pytest.raises(InvalidRequest):
            workspace_prefix("t1", bad)
    assert S3Workspace.for_container("b", "t", "c", s3).prefix == "workspaces/t/c/"
    assert S3Workspace("b", "/workspaces/t/c", s3).prefix == "workspaces/t/c/"
    for bad in ("", "/", "a//b", "a/../b"):
        with pytest.raises(ValueError):
            S3Workspace("b", bad, s3)


async def test_push_then_pull_round_trip(s3: S3Client, bucket: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = {"README.md": b"# hi\n", "projects/app/main.py": b"print('x')\n", "projects/app/run.sh": b"#!/bin/sh\n",
             "output/empty.txt": b"", "temp/blob.bin": bytes(range(256)) * 4000, "name with spaces/ü.txt": b"u"}
    for rel, data in files.items():
        write(src, rel, data)
    (src / "projects/app/run.sh").chmod(0o755)
    (src / "emptydir").mkdir()

    stats = await S3Workspace(bucket, PREFIX, s3).push(src)
    assert stats == SyncStats(uploaded=6, bytes_uploaded=sum(len(d) for d in files.values()))
    assert await bucket_keys(s3, bucket) == sorted(PREFIX + rel for rel in files)
    head = await s3.head_object(Bucket=bucket, Key=PREFIX + "projects/app/run.sh")
    assert head["Metadata"]["mode"] == "755" and len(head["Metadata"]["sha256"]) == 64

    dst = tmp_path / "dst" / "nested"  # created by pull
    workspace = S3Workspace(bucket, PREFIX, s3)
    assert await workspace.pull(dst) == 6
    assert tree(dst) == files
    assert (dst / "projects/app/run.sh").stat().st_mode & 0o777 == 0o755
    assert (dst / "README.md").stat().st_mode & 0o777 == 0o644
    # nothing changed since the pull: nothing to upload
    assert await workspace.push(dst) == SyncStats(unchanged=6)


async def test_push_uploads_changes_and_deletes_what_is_gone(s3: S3Client, bucket: str, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "keep.txt", b"same")
    write(root, "touched.txt", b"same content")
    write(root, "edit.txt", b"old")
    write(root, "gone/away.txt", b"bye")
    write(root, "mode.sh", b"echo")
    workspace = S3Workspace(bucket, PREFIX, s3)
    assert (await workspace.push(root)).uploaded == 5

    write(root, "edit.txt", b"new and longer")
    touched = root / "touched.txt"
    st = touched.stat()
    os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # mtime moves, content doesn't
    (root / "gone/away.txt").unlink()
    (root / "mode.sh").chmod(0o700)
    write(root, "new/file.txt", b"fresh")

    stats = await workspace.push(root)
    assert stats == SyncStats(uploaded=3, deleted=1, unchanged=2, bytes_uploaded=len(b"new and longer") + 4 + 5)
    assert await bucket_keys(s3, bucket) == sorted(
        PREFIX + k for k in ("keep.txt", "touched.txt", "edit.txt", "mode.sh", "new/file.txt"))
    assert await get(s3, bucket, PREFIX + "edit.txt") == b"new and longer"
    assert (await s3.head_object(Bucket=bucket, Key=PREFIX + "mode.sh"))["Metadata"]["mode"] == "700"
    assert await workspace.push(root) == SyncStats(unchanged=5)

    # a push from a fresh instance (no manifest) uploads everything and deletes nothing it did not know
    await s3.put_object(Bucket=bucket, Key=PREFIX + "written/elsewhere.txt", Body=b"x")
    assert (await S3Workspace(bucket, PREFIX, s3).push(root)).uploaded == 5
    assert PREFIX + "written/elsewhere.txt" in await bucket_keys(s3, bucket)


async def test_pull_skips_keys_that_would_escape(s3: S3Client, bucket: str, tmp_path: Path) -> None:
    evil = {PREFIX + "../../etc/x": b"1", PREFIX + "a/../../../x": b"2", PREFIX + "./x": b"3",
            PREFIX + "a//b": b"4", PREFIX + "/abs": b"5", PREFIX + "..": b"6"}
    for key, data in evil.items():
        await s3.put_object(Bucket=bucket, Key=key, Body=data)
    await s3.put_object(Bucket=bucket, Key=PREFIX + "ok/fine.txt", Body=b"ok")
    await s3.put_object(Bucket=bucket, Key=PREFIX + "folder/", Body=b"")  # a console "folder" marker
    await s3.put_object(Bucket=bucket, Key="workspaces/t1/c10/other.txt", Body=b"not ours")
    assert set(evil) <= set(await bucket_keys(s3, bucket)), "the store kept the keys verbatim"

    ws = tmp_path / "a" / "b" / "ws"
    before = paths(tmp_path)
    assert await S3Workspace(bucket, PREFIX, s3).pull(ws) == 1
    assert tree(ws) == {"ok/fine.txt": b"ok"}
    created = paths(tmp_path) - before
    assert all(p == ws or ws in p.parents or p in ws.parents for p in created), created
    assert not (tmp_path / "etc").exists() and not (tmp_path / "x").exists()


async def test_pull_never_writes_through_a_symlink(s3: S3Client, bucket: str, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_bytes(b"original")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "dirlink").symlink_to(outside, target_is_directory=True)
    (ws / "filelink").symlink_to(outside / "target.txt")
    for rel, data in {"dirlink/target.txt": b"pwned", "dirlink/new.txt": b"pwned", "filelink": b"replaced",
                      "real/ok.txt": b"ok"}.items():
        await s3.put_object(Bucket=bucket, Key=PREFIX + rel, Body=data)

    assert await S3Workspace(bucket, PREFIX, s3).pull(ws) == 2
    assert tree(outside) == {"target.txt": b"original"}
    assert not (ws / "filelink").is_symlink()  # the link itself was replaced by the stored file
    assert (ws / "filelink").read_bytes() == b"replaced"
    assert (ws / "real/ok.txt").read_bytes() == b"ok"
    assert (ws / "dirlink").is_symlink()


async def test_pull_skips_path_conflicts(s3: S3Client, bucket: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws, "file", b"local file")
    (ws / "dir").mkdir()
    for rel in ("file/under", "dir", "fine"):
        await s3.put_object(Bucket=bucket, Key=PREFIX + rel, Body=b"x")
    assert await S3Workspace(bucket, PREFIX, s3).pull(ws) == 1
    assert tree(ws) == {"file": b"local file", "fine": b"x"}
    assert not [p for p in ws.iterdir() if p.name.startswith(".avm-sync-")], "temporary files are cleaned up"


async def test_push_never_follows_symlinks_or_reads_special_files(s3: S3Client, bucket: str, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside, "secret.txt", b"secret")
    write(outside, "sub/more.txt", b"more")
    ws = tmp_path / "ws"
    write(ws, "real.txt", b"real")
    (ws / "secret_link").symlink_to(outside / "secret.txt")
    (ws / "dir_link").symlink_to(outside, target_is_directory=True)
    (ws / "dangling").symlink_to(tmp_path / "missing")
    os.mkfifo(ws / "fifo")

    stats = await S3Workspace(bucket, PREFIX, s3).push(ws)
    assert stats == SyncStats(uploaded=1, skipped=4, bytes_uploaded=4)
    assert await bucket_keys(s3, bucket) == [PREFIX + "real.txt"]


async def test_files_above_the_limit_are_skipped_and_their_stored_copy_kept(
        s3: S3Client, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ws = tmp_path / "ws"
    write(ws, "small.txt", b"12345")
    write(ws, "big.bin", b"1234")
    workspace = S3Workspace(bucket, PREFIX, s3, max_file_bytes=8)
    assert (await workspace.push(ws)).uploaded == 2
    write(ws, "big.bin", b"now far too large")
    with caplog.at_level(logging.WARNING, logger="agentvm.adapters.aws.s3_workspace"):
        stats = await workspace.push(ws)
    assert stats == SyncStats(unchanged=1, skipped=1)
    assert any("too large" in r.getMessage() for r in caplog.records)
    assert await get(s3, bucket, PREFIX + "big.bin") == b"1234"  # not deleted: the file still exists


async def test_many_files_in_parallel(s3: S3Client, bucket: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = {f"d{i % 7}/f{i}.txt": f"file {i}".encode() for i in range(60)}
    for rel, data in files.items():
        write(src, rel, data)
    assert (await S3Workspace(bucket, PREFIX, s3, concurrency=4).push(src)).uploaded == 60
    dst = tmp_path / "dst"
    assert await S3Workspace(bucket, PREFIX, s3, concurrency=4).pull(dst) == 60
    assert tree(dst) == files
