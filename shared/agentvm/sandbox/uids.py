"""One uid per container for its tools, when the server runs as root.

Bubblewrap hides other workspaces from a tool; without it (not installed, or not usable here) the
uid is what keeps one container's tools out of another's files: every workspace root is 0o700 and
owned by its container's uid. The allocation is durable (a small JSON file written atomically), so a
container keeps its uid, and so the ownership of its files, across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

FIRST_TOOL_UID = 200_000  # far above the uids and gids of real accounts; no /etc/passwd entry needed
MAX_TOOL_UIDS = 1_000_000


class ToolUids:
    def __init__(self, path: Path, *, first: int = FIRST_TOOL_UID, count: int = MAX_TOOL_UIDS) -> None:
        self.path = path
        self.first = first
        self.count = count
        self._lock = asyncio.Lock()
        self._map: dict[str, int] | None = None

    async def uid_for(self, key: str) -> int:
        """The uid of `key` (a container), allocated on first use."""
        async with self._lock:
            if self._map is None:
                self._map = await asyncio.to_thread(self._load)
            uid = self._map.get(key)
            if uid is None:
                uid = self.first + len(self._map)
                if uid >= self.first + self.count:
                    raise RuntimeError(f"no tool uid left ({self.count} allocated in {self.path})")
                self._map[key] = uid
                await asyncio.to_thread(self._save, dict(self._map))
            return uid

    def _load(self) -> dict[str, int]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        if not isinstance(raw, dict) or not all(isinstance(v, int) for v in raw.values()):
            raise RuntimeError(f"{self.path}: not a map of container keys to uids; fix or remove it")
        return {str(k): int(v) for k, v in raw.items()}

    def _save(self, data: dict[str, int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(data, f, indent=0, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        with contextlib.suppress(OSError):
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def hand_over(root: Path, old: tuple[int, int], new: tuple[int, int]) -> int:
    """Give every file under `root` owned by `old` to `new` (a workspace made before it had its own
    uid); symlinks are changed themselves, never followed. Returns how many entries changed."""
    changed = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
                if (st.st_uid, st.st_gid) == old:
                    os.chown(path, *new, follow_symlinks=False)
                    changed += 1
            except FileNotFoundError:
                continue
    return changed
