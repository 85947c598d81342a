"""The built-in tools: `bash`, `read_file`, `write_file`, `edit_file`, `list_files`.

Each works on a `Runtime` (a container's workspace, a scrubbed environment, a process runner), has
the JSON schema the model sees, and validates its input itself: a bad call is answered with an error
result naming the field, which the model can correct. Output larger than the preview limit is kept
whole in the workspace (`output/tool-<id>.txt`) and the model gets the beginning with a note on where
the rest is, so a big result never blows up the context, the history or a 32 KB cloud frame.

With a `DiskPolicy` (sandbox/quota.py), `write_file` and `edit_file` are refused when they would take
the workspace over its quota, and the tools that write (`bash`, `write_file`, `edit_file`) are refused
while the server's free disk space is under its reserve; a result names the limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentvm.domain.sandbox_limits import Limits, ProcessResult
from agentvm.drivers.base import ToolOutcome
from agentvm.errors import InvalidRequest
from agentvm.sandbox.quota import DiskPolicy, size_text
from agentvm.sandbox.runtime import Runtime

JSON = dict[str, Any]

BUILTIN_TOOLS = ("bash", "read_file", "write_file", "edit_file", "list_files")
DEFAULT_PREVIEW_BYTES = 16 * 1024
MAX_LIST_ENTRIES = 1000
MAX_READ_BYTES = 10 << 20
FULL_SLACK_BYTES = 64 << 10  # a workspace within this of its quota is said to be full


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    schema: JSON

    def definition(self) -> JSON:
        return {"name": self.name, "description": self.description, "input_schema": self.schema}


def _schema(properties: JSON, required: list[str]) -> JSON:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_PATH = {"type": "string", "description": "Path relative to the workspace root (no absolute paths, no '..')."}

SPECS: dict[str, ToolSpec] = {
    "bash": ToolSpec("bash", (
        "Run a shell command in the workspace (bash -c). Returns the exit code and the output. No network; "
        "limited CPU time, memory and run time."), _schema({
            "command": {"type": "string", "description": "The command line."},
            "timeout_s": {"type": "number", "description": "Run time limit in seconds (at most the server's)."},
        }, ["command"])),
    "read_file": ToolSpec("read_file", "Read a text file of the workspace; optionally a range of lines.", _schema({
        "path": _PATH,
        "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)."},
        "limit": {"type": "integer", "minimum": 1, "description": "How many lines to read."},
    }, ["path"])),
    "write_file": ToolSpec("write_file", "Create or overwrite a file of the workspace with the given text.", _schema({
        "path": _PATH, "content": {"type": "string", "description": "The whole new content."},
    }, ["path", "content"])),
    "edit_file": ToolSpec("edit_file", (
        "Replace an exact string in a file of the workspace. `old_string` must occur exactly once unless "
        "`replace_all` is true."), _schema({
            "path": _PATH,
            "old_string": {"type": "string", "description": "The exact text to replace."},
            "new_string": {"type": "string", "description": "The replacement."},
            "replace_all": {"type": "boolean", "description": "Replace every occurrence."},
        }, ["path", "old_string", "new_string"])),
    "list_files": ToolSpec("list_files", "List a directory of the workspace.", _schema({
        "path": {**_PATH, "description": "Directory relative to the workspace root (default: the root)."},
        "recursive": {"type": "boolean", "description": "Include subdirectories."},
    }, [])),
}


def _str(input_: Mapping[str, Any], name: str, *, required: bool = True, allow_empty: bool = True) -> str | None:
    value = input_.get(name)
    if value is None:
        if required:
            raise InvalidRequest(f"{name}: field required", field=name)
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{name}: must be a string", field=name)
    if not allow_empty and not value:
        raise InvalidRequest(f"{name}: must not be empty", field=name)
    return value


def _int(input_: Mapping[str, Any], name: str) -> int | None:
    value = input_.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"{name}: must be a positive integer", field=name)
    return value


def _bool(input_: Mapping[str, Any], name: str) -> bool:
    value = input_.get(name, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name}: must be true or false", field=name)
    return value


def _no_extra(name: str, input_: Mapping[str, Any]) -> None:
    extra = sorted(set(input_) - set(SPECS[name].schema["properties"]))
    if extra:
        raise InvalidRequest(f"{extra[0]}: not a parameter of {name}", field=extra[0])


def check_builtin_names(names: Sequence[object]) -> tuple[str, ...]:
    """The names, each a built-in tool; else InvalidRequest naming the first unknown one."""
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        raise InvalidRequest(f"tools: unknown tool '{unknown[0]}' (built-in: {', '.join(BUILTIN_TOOLS)})",
                             field="tools")
    return tuple(str(n) for n in names)


class BuiltinTools:
    """The `ToolRunner` of one turn: the image's enabled built-in tools on its container's runtime."""

    def __init__(self, runtime: Runtime, enabled: tuple[str, ...], *, limits: Limits | None = None,
                 preview_bytes: int = DEFAULT_PREVIEW_BYTES, disk: DiskPolicy | None = None) -> None:
        check_builtin_names(enabled)
        self.runtime = runtime
        self.enabled = enabled
        self.limits = limits or Limits()
        self.preview_bytes = preview_bytes
        self.disk = disk  # the workspace quota and the disk reserve (the runner holds its calls to them too)
        self._handlers: dict[str, Callable[[Mapping[str, Any]], Awaitable[ToolOutcome]]] = {
            "bash": self._bash, "read_file": self._read_file, "write_file": self._write_file,
            "edit_file": self._edit_file, "list_files": self._list_files}

    @staticmethod
    def definitions(enabled: tuple[str, ...]) -> list[JSON]:
        return [SPECS[n].definition() for n in enabled if n in SPECS]

    def schemas(self) -> list[JSON]:
        return self.definitions(self.enabled)

    def needs_sandbox(self, name: str) -> bool:
        return name in self.enabled

    async def run(self, name: str, input_: JSON) -> ToolOutcome:
        if name not in self.enabled:
            return ToolOutcome(f"Tool '{name}' is not available to this agent.", is_error=True)
        if not isinstance(input_, dict):
            return ToolOutcome(f"{name}: the input must be an object", is_error=True)
        try:
            _no_extra(name, input_)
            return await self._handlers[name](input_)
        except InvalidRequest as exc:
            return ToolOutcome(f"{name}: {exc.message}", is_error=True)

    # ---- the tools -----------------------------------------------------------------------------

    async def _bash(self, input_: Mapping[str, Any]) -> ToolOutcome:
        command = _str(input_, "command", allow_empty=False)
        assert command is not None
        limits = self.limits
        timeout = input_.get("timeout_s")
        if timeout is not None:
            if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
                raise InvalidRequest("timeout_s: must be a positive number of seconds", field="timeout_s")
            limits = dataclasses.replace(limits, timeout_s=min(float(timeout), limits.timeout_s))
        refused = await self._reserve_refusal("bash")
        if refused is not None:
            return refused
        result = await self.runtime.exec(command, limits=limits)
        text = _bash_text(result, limits, self.disk)
        return ToolOutcome(await self._fit(text), is_error=result.exit_code != 0)

    async def _read_file(self, input_: Mapping[str, Any]) -> ToolOutcome:
        path = _str(input_, "path", allow_empty=False)
        assert path is not None
        offset, limit = _int(input_, "offset"), _int(input_, "limit")
        fs = self.runtime.workspace.fs
        info = await fs.stat(path)
        if info is None:
            return ToolOutcome(f"read_file: path '{path}': no such file", is_error=True)
        if info.kind != "file":
            return ToolOutcome(f"read_file: path '{path}': is a {info.kind}, not a file", is_error=True)
        data = await fs.read_bytes(path, max_bytes=MAX_READ_BYTES)
        if b"\0" in data[:8192]:
            return ToolOutcome(f"read_file: path '{path}': a binary file of {info.size:,} bytes", is_error=True)
        text = data.decode("utf-8", errors="replace")
        if offset is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = (offset or 1) - 1
            text = "".join(lines[start:start + limit] if limit is not None else lines[start:])
        elif info.size > MAX_READ_BYTES:
            text += f"\n[read_file: only the first {MAX_READ_BYTES:,} of {info.size:,} bytes were read]"
        return ToolOutcome(await self._fit(text))

    async def _write_file(self, input_: Mapping[str, Any]) -> ToolOutcome:
        path, content = _str(input_, "path", allow_empty=False), _str(input_, "content")
        assert path is not None and content is not None
        data = content.encode()
        refused = await self._write_refusal("write_file", path, len(data))
        if refused is not None:
            return refused
        written = await self.runtime.workspace.fs.write_bytes(path, data)
        return ToolOutcome(f"Wrote {written:,} bytes to {path}")

    async def _edit_file(self, input_: Mapping[str, Any]) -> ToolOutcome:
        path = _str(input_, "path", allow_empty=False)
        old, new = _str(input_, "old_string", allow_empty=False), _str(input_, "new_string")
        assert path is not None and old is not None and new is not None
        replace_all = _bool(input_, "replace_all")
        fs = self.runtime.workspace.fs
        if await fs.stat(path) is None:
            return ToolOutcome(f"edit_file: path '{path}': no such file", is_error=True)
        try:
            text = (await fs.read_bytes(path, max_bytes=MAX_READ_BYTES)).decode("utf-8")
        except UnicodeDecodeError:
            return ToolOutcome(f"edit_file: path '{path}': not a UTF-8 text file", is_error=True)
        count = text.count(old)
        if count == 0:
            return ToolOutcome(f"edit_file: old_string: not found in {path}", is_error=True)
        if count > 1 and not replace_all:
            return ToolOutcome(f"edit_file: old_string: found {count} times in {path}; make it unique or set "
                               "replace_all", is_error=True)
        data = text.replace(old, new).encode()
        refused = await self._write_refusal("edit_file", path, len(data))
        if refused is not None:
            return refused
        await fs.write_bytes(path, data)
        return ToolOutcome(f"Replaced {count if replace_all else 1} occurrence(s) in {path}")

    async def _list_files(self, input_: Mapping[str, Any]) -> ToolOutcome:
        path = _str(input_, "path", required=False, allow_empty=False) or "."
        recursive = _bool(input_, "recursive")
        fs = self.runtime.workspace.fs
        info = await fs.stat(path)
        if info is None or info.kind != "dir":
            return ToolOutcome(f"list_files: path '{path}': no such directory", is_error=True)
        entries = await fs.list(path, recursive=recursive, limit=MAX_LIST_ENTRIES + 1)
        lines = [f"{e.path}/" if e.kind == "dir" else f"{e.path} ({e.size:,} bytes)" for e in
                 entries[:MAX_LIST_ENTRIES]]
        if len(entries) > MAX_LIST_ENTRIES:
            lines.append(f"[list_files: only the first {MAX_LIST_ENTRIES} entries are shown]")
        return ToolOutcome("\n".join(lines) if lines else "(empty directory)")

    # ---- disk ------------------------------------------------------------------------------------

    async def _reserve_refusal(self, tool: str) -> ToolOutcome | None:
        problem = self.disk.reserve_problem() if self.disk is not None else None
        if problem is None:
            return None
        return ToolOutcome(f"{tool}: refused: {problem}; tools that write are paused until space is freed",
                           is_error=True)

    async def _write_refusal(self, tool: str, path: str, new_bytes: int) -> ToolOutcome | None:
        problem = await self._disk_problem(new_bytes, path)
        return None if problem is None else ToolOutcome(f"{tool}: refused: {problem}", is_error=True)

    async def _disk_problem(self, new_bytes: int, path: str | None = None) -> str | None:
        """Why the server may not write `new_bytes` (over `path`) into the workspace now, or None."""
        if self.disk is None:
            return None
        info = await self.runtime.workspace.fs.stat(path) if path is not None else None
        replaced = info.size if info is not None and info.kind == "file" else 0
        return await asyncio.to_thread(self.disk.write_problem, self.runtime.workspace.root, new_bytes,
                                       replaced_bytes=replaced)

    # ---- output size -----------------------------------------------------------------------------

    async def _fit(self, text: str) -> str:
        """The text, or its beginning with a note when it is larger than the preview limit; the whole
        text is then kept in the workspace where the model can read it in parts."""
        data = text.encode()
        if len(data) <= self.preview_bytes:
            return text
        preview = data[: self.preview_bytes].decode("utf-8", errors="ignore")
        problem = await self._disk_problem(len(data))
        if problem is not None:
            return f"{preview}\n[output truncated: {len(data):,} bytes in total; the rest was not kept: {problem}]"
        name = f"output/tool-{uuid.uuid4().hex[:12]}.txt"
        await self.runtime.workspace.fs.write_bytes(name, data)
        return (f"{preview}\n[output truncated: {len(data):,} bytes in total; the whole output is in {name} "
                "(read it with read_file and offset/limit)]")


def _bash_text(result: ProcessResult, limits: Limits, disk: DiskPolicy | None = None) -> str:
    """Status and notes first (a preview of a long output keeps them), then stdout, then stderr."""
    out = result.stdout.decode("utf-8", errors="replace")
    err = result.stderr.decode("utf-8", errors="replace")
    parts = ["killed" if result.exit_code is None else f"exit code {result.exit_code}"]
    if result.killed == "timeout":
        parts.append(f"[killed: the command ran longer than {limits.timeout_s:g} s]")
    elif result.killed == "output_limit":
        parts.append(f"[killed: the command wrote more than {limits.output_kill_at:,} bytes]")
    elif result.killed == "memory":
        parts.append(f"[killed: the call's memory limit of {size_text(limits.memory_bytes)} was reached]")
    elif result.killed == "disk_quota":
        quota = disk.quota_text if disk is not None and disk.quota_bytes is not None else "the workspace quota"
        parts.append(f"[killed: {quota} was reached; remove files to make room]")
    elif result.killed == "disk_reserve":
        reserve = f" of {size_text(disk.reserve_bytes)}" if disk is not None else ""
        parts.append(f"[killed: the server's disk is nearly full (under the reserve{reserve} kept for its "
                     f"database); tools that write are paused until space is freed]")
    elif result.killed is not None:
        parts.append(f"[killed: {result.killed}]")
    used = result.workspace_bytes
    if disk is not None and disk.quota_bytes is not None and used is not None:
        if used > disk.quota_bytes:
            parts.append(f"[workspace: {size_text(used)} used, over {disk.quota_text}: writes fail until files "
                         f"are removed]")
        elif used + FULL_SLACK_BYTES >= disk.quota_bytes:  # a write stopped at the quota leaves it about full
            parts.append(f"[workspace: {size_text(used)} used, {disk.quota_text} is reached: a write past it "
                         f"fails (\"File size limit exceeded\")]")
    if result.truncated:
        parts.append(f"[output: {result.output_bytes:,} bytes written, only the first {limits.output_bytes:,} kept]")
    if out:
        parts.append(out.rstrip("\n"))
    if err:
        parts.append(f"[stderr]\n{err.rstrip(chr(10))}")
    return "\n".join(parts)
