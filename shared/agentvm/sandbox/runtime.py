"""What tools run on: a workspace's files, a scrubbed environment, a process runner, a cwd."""

from __future__ import annotations

import posixpath
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING

from agentvm.domain.sandbox_limits import Limits, ProcessResult
from agentvm.sandbox.workspace import Workspace

if TYPE_CHECKING:
    from agentvm.ports import ProcessRunner

# Only system directories: nothing a user (or the server's virtualenv) put first on its own PATH.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def tool_env(home: str, *, tmpdir: str | None = None) -> dict[str, str]:
    """The whole environment a tool gets: PATH (a fixed safe list), HOME, TMPDIR (workspace temp/), LANG=C.UTF-8,
    TERM=dumb — nothing from the server's own environment (no LLM key, no AWS credentials, no AVM_*).

    `home` is the workspace root; TMPDIR defaults to its temp/."""
    return {
        "PATH": SAFE_PATH,
        "HOME": home,
        "TMPDIR": tmpdir if tmpdir is not None else posixpath.join(home, "temp"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }


class Runtime:
    """What tools run on: a workspace's files, a scrubbed environment, a process runner, a cwd."""

    workspace: Workspace
    process: ProcessRunner
    env: dict[str, str]
    cwd: str

    def __init__(self, workspace: Workspace, process: ProcessRunner, *, env: Mapping[str, str] | None = None,
                 cwd: str = ".") -> None:
        self.workspace = workspace
        self.process = process
        self.env = dict(env) if env is not None else tool_env(str(workspace.root))
        self.cwd = cwd
        self.shell = shutil.which("bash", path=self.env.get("PATH", SAFE_PATH)) or "/bin/sh"

    async def exec(self, command: str, *, limits: Limits) -> ProcessResult:
        """Run `bash -c command` (or /bin/sh without bash) in `cwd` with `env`."""
        return await self.process.run([self.shell, "-c", command], cwd=self.cwd, env=self.env, limits=limits)
