"""The Process port on this machine: a subprocess with limits, a scrubbed env and a wall-clock timeout,
inside bubblewrap when bubblewrap works here.

What stands between a tool and the host, in layers (each used when this machine offers it):

* **Always**: exactly the env it is given (`tool_env`: nothing of the server's), its own session and
  process group (killed as a whole at the timeout and when the command exits, so background children
  do not outlive the call), a cwd confined to the root, rlimits (CPU seconds, address space, file
  size, no core dumps), stdout/stderr kept up to `output_bytes` and the process killed once it has
  written `output_kill_at` bytes, and a lower CPU priority (nice `TOOL_NICENESS`), so that a tool
  that spins cannot slow the server answering everyone else.
* **Server running as root**: the tool runs as an unprivileged uid (`run_as`; by default the owner
  of the workspace root, or nobody 65534 when root owns it, which is then handed to that uid) with
  no capabilities, no supplementary groups and `no_new_privs` (setuid binaries do not elevate).
  With a 0o700 workspace, it then cannot read `/root`, the server's config and credentials, the
  server's `/proc/<pid>/environ`, or another workspace owned by another uid.
* **Processes** (fork bombs): a per-call `pids` cgroup (`pids.max`) when a writable cgroup v1 `pids`
  hierarchy or cgroup v2 with the pids controller is available; its members are also killed at the
  end, even the ones that left the process group. Otherwise RLIMIT_NPROC, which counts every process
  of the uid (so all the concurrent calls of one `run_as` uid share it), and which does not apply to
  root: as root without a cgroup, only the uid drop makes it work.
* **bubblewrap** (`isolation="auto"` when it is installed and works, probed once): the tool sees only
  /usr (and the /bin, /lib… links), an allow-list of harmless /etc files (`_ETC`), its workspace
  (read-write, at the same path), a private /tmp, its own /proc and a minimal /dev; no network, its
  own pid/ipc/uts namespaces; it dies with the server. As root, bubblewrap itself runs as root (no
  user namespace) and drops to `run_as` with setpriv inside.
* **Network, as root without bubblewrap**: an empty network namespace (`unshare --net`, or unshare(2)
  in the `preexec_fn`): no listening socket of the server, no loopback service is reachable.

* **The whole call's memory and disk** (`call_guard.py`): `memory_bytes` holds for all the call's
  processes together (a per-call memory cgroup where the host delegates one, else a watchdog summing
  their memory), and with a `DiskPolicy` the workspace quota and the server's disk reserve hold while
  the call runs (RLIMIT_FSIZE lowered to what remains of the quota, a watchdog measuring the workspace).

Fail closed (`tool_sandbox.py`): with neither bubblewrap nor root, `run` and `sandboxed_argv` raise
`SandboxUnavailable` unless the operator opted in (`unsafe_unsandboxed`); only then do tools run as the
server's own user, with its network, confined by nothing but the env, the limits and the FileSystem.
Without bubblewrap, a tool can read whatever its uid can: world-readable host files (/etc, /usr,
/home/* when so permitted, /tmp); a process that calls `setsid` escapes the process-group kill unless
a cgroup holds it. `no_new_privs` needs util-linux's setpriv (the `preexec_fn` launcher cannot set it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from agentvm.adapters.local.call_guard import CallGuard, joining, memory_cgroups
from agentvm.adapters.local.cgroups import PidsCgroups
from agentvm.adapters.local.tool_sandbox import Host, Isolation, ToolSandbox, assess, netns_entry, probe_unshare
from agentvm.domain.sandbox_limits import Limits, ProcessResult
from agentvm.errors import AgentVMError, InvalidRequest, SandboxUnavailable
from agentvm.sandbox.quota import DiskPolicy

log = logging.getLogger(__name__)

Launcher = Literal["auto", "exec", "preexec"]

DEFAULT_RUN_AS = (65534, 65534)  # nobody:nogroup
_READ_CHUNK = 64 << 10
_DRAIN_S = 1.0  # after the command ends: how long its pipes may stay open (a process that escaped)
#: How much lower a tool's CPU priority is than the server's (of 19): under contention the server gets
#: ~90% of a core against a tool that spins (CFS weights 1024 : 110).
TOOL_NICENESS = 10
_REAP_S = 5.0  # how long a SIGKILLed process may take to be reaped
_CG_JOIN = 'echo $$ > "$0" && exec "$@"'  # sh -c: move this shell into a cgroup, then become the command
# /etc entries a sandboxed tool gets (read-only, when present): an allow-list, everything else of /etc
# is absent (it may hold host secrets: shadow, gshadow, sudoers, ssh keys, service credentials).
# TLS: OpenSSL's config and the CA roots (Node and Python read them at start); name service and resolver
# files (the tool has no network, but libc and runtimes read them); time zone; the dynamic linker's
# cache; Debian's alternatives (awk, editor...). passwd and group hold no secrets (hashes live in
# shadow/gshadow): they let `id`, `ls -l` and runtimes map uids to names.
_ETC = ("passwd", "group", "nsswitch.conf", "hosts", "resolv.conf", "host.conf", "gai.conf", "localtime", "timezone",
        "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates",
        "ca-certificates.conf", "pki", "mime.types", "protocols", "services", "os-release", "debian_version",
        "gitconfig")
_CPU_SIG: dict[int, str] = {signal.SIGXCPU.value: "cpu", signal.SIGXFSZ.value: "file_size"}

_background: set[asyncio.Task[None]] = set()


def _spawn_background(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


# -- what this host offers (probed once per server process) -------------------------------------------


_host: Host | None = None
_host_lock = threading.Lock()
_warned = False  # the one "no bubblewrap" warning
_warned_roots: set[Path] = set()  # workspaces warned about (a runner is made per turn)


def probe_host(*, refresh: bool = False) -> Host:
    """What this machine offers, probed once (blocking: call it in a worker thread)."""
    global _host
    with _host_lock:
        if _host is None or refresh:
            _host = _probe()
        return _host


def reap_dead_tools() -> None:
    """Kill the tool processes that servers which died left running, and remove their cgroups
    (`PidsCgroups.reap`). Blocking; `avm serve` calls it at start-up (the first tool call would)."""
    if sys.platform.startswith("linux"):
        PidsCgroups.find()
        memory_cgroups()


def _probe() -> Host:
    privileged = os.geteuid() == 0
    prlimit, setpriv = shutil.which("prlimit"), shutil.which("setpriv")
    sh = shutil.which("sh") or "/bin/sh"
    cgroups = PidsCgroups.find() if sys.platform.startswith("linux") else None
    bwrap = shutil.which("bwrap")
    problem = None
    if bwrap is None:
        problem = "bwrap is not installed"
    elif privileged and setpriv is None:
        problem = "setpriv (util-linux) is missing, needed to leave root inside bwrap"
        bwrap = None
    else:
        problem = _probe_bwrap(bwrap, privileged, setpriv)
        if problem is not None:
            bwrap = None
    unshare, unshare_problem = probe_unshare(shutil.which("unshare")) if privileged else (None, "not root")
    return Host(privileged=privileged, prlimit=prlimit, setpriv=setpriv, sh=sh, bwrap=bwrap,
                bwrap_problem=problem, cgroups=cgroups, nice=shutil.which("nice"), unshare=unshare,
                unshare_problem=unshare_problem,
                memory=memory_cgroups()[0] if sys.platform.startswith("linux") else None)


def _probe_bwrap(bwrap: str, privileged: bool, setpriv: str | None) -> str | None:
    """None when bwrap runs `true` the way run() would use it, else the reason it does not."""
    with tempfile.TemporaryDirectory(prefix="avm-bwrap-probe-") as tmp:
        argv = [bwrap, *_bwrap_args(tmp, tmp, privileged=privileged), "--"]
        if privileged and setpriv is not None:
            argv += _setpriv_args(setpriv, DEFAULT_RUN_AS)
        argv.append("true")
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=10, check=False, cwd=tmp,
                                  env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.SubprocessError) as exc:
            return f"bwrap could not run: {exc}"
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        return f"bwrap does not work here: {lines[-1] if lines else f'exit {proc.returncode}'}"
    return None


def _bwrap_args(root: str, workdir: str, *, privileged: bool) -> list[str]:
    if privileged:
        # bwrap runs as root without a user namespace (so the tool's uid is a real host uid that
        # RLIMIT_NPROC and file permissions apply to); it keeps only what setpriv needs to drop to
        # `run_as`, plus reading its way to the cwd, all cleared by that setuid.
        ns = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
              "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
              "--cap-add", "CAP_SETPCAP", "--cap-add", "CAP_DAC_READ_SEARCH"]
    else:
        ns = ["--unshare-all"]
    args = [*ns, "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    # /etc itself 0755: bwrap makes a bind's missing parents 0700 root, which the tool's uid could not
    # traverse (Node then fails to read its OpenSSL config, the bash tool sees no /etc at all).
    args += ["--perms", "0755", "--dir", "/etc"]
    for name in _ETC:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    # The workspace at its own path; its parents are made explicitly (mode 0755: the ones bwrap makes
    # for a bind's destination are 0700 root, which the tool's uid could not traverse for $HOME).
    for parent in reversed(Path(root).parents):
        if str(parent) not in ("/", "/tmp"):
            args += ["--dir", str(parent)]
    args += ["--bind", root, root, "--chdir", workdir]
    return args


def _setpriv_args(setpriv: str, run_as: tuple[int, int]) -> list[str]:
    uid, gid = run_as
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--"]


def _user_tasks(uid: int) -> int | None:
    """Processes and threads of `uid` now (Linux), or None when they cannot be counted."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    count = 0
    for name in names:
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/status", "rb") as f:
                m = re.search(rb"^Threads:\s+(\d+)", f.read(), re.M)
            count += int(m.group(1)) if m else 1
        except OSError:
            continue
    return count


# -- the runner ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Output:
    """stdout and stderr as read: the first `keep` bytes of both kept, the rest only counted."""

    keep: int
    kill_at: int
    total: int = 0
    kept: int = 0
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    over: asyncio.Event = field(default_factory=asyncio.Event)  # set past `kill_at`

    def add(self, buf: bytearray, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - self.kept
        if room > 0:
            part = data[:room]
            buf += part
            self.kept += len(part)
        if self.total > self.kill_at:
            self.over.set()


async def _pump(stream: asyncio.StreamReader | None, out: _Output, buf: bytearray) -> None:
    if stream is None:
        return
    while True:
        data = await stream.read(_READ_CHUNK)
        if not data:
            return
        out.add(buf, data)


async def _exit_status(proc: asyncio.subprocess.Process) -> int:
    """The process's exit status as soon as it is reaped. (`Process.wait()` on Python 3.11 also
    waits for its pipes to close, which a background child still holding them would delay.)"""
    delay = 0.001
    while True:
        if proc.returncode is not None:
            return proc.returncode
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


async def _feed(stream: asyncio.StreamWriter | None, data: bytes) -> None:
    if stream is None:
        return
    try:
        stream.write(data)
        await stream.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        with contextlib.suppress(OSError):
            stream.close()


@dataclass(frozen=True, slots=True)
class _Plan:
    argv: list[str]
    workdir: str
    preexec: Callable[[], None] | None
    cgroup: Path | None
    guard: CallGuard | None = None  # the whole call's memory and disk (None: a long-running process)


class LocalProcessRunner:
    """ProcessRunner for one workspace root on this machine (see the module docstring).

    `isolation`: "auto" uses bubblewrap when it works here (else, as root, the uid drop and a network
    namespace); "bwrap" requires it; "none" never uses it. With no isolating sandbox runs are refused
    unless `unsafe_unsandboxed`; `private_network` False: the uid drop isolates without a network
    namespace (the worker, which listens on nothing; tool_sandbox.py). `run_as` (uid, gid): who tools
    run as when the server is root (default: the root directory's owner, or nobody). `pids_cgroup`:
    use a per-call pids cgroup when one is available. `launcher`: "exec" (prlimit/setpriv/sh chain),
    "preexec" (a `preexec_fn` in the child), "auto" the former when util-linux is there.
    `memory_cgroup`: hold a call's memory in a per-call memory cgroup when one is available (else a
    watchdog does); `disk`: the workspace quota and disk reserve its calls are held to (`call_guard.py`)."""

    def __init__(self, root: Path, *, isolation: Isolation = "auto", run_as: tuple[int, int] | None = None,
                 pids_cgroup: bool = True, launcher: Launcher = "auto", unsafe_unsandboxed: bool = False,
                 private_network: bool = True, memory_cgroup: bool = True,
                 disk: DiskPolicy | None = None) -> None:
        self.root = Path(os.path.realpath(root))
        self.isolation: Isolation = isolation
        self.pids_cgroup = pids_cgroup
        self.launcher: Launcher = launcher
        self.unsafe_unsandboxed = unsafe_unsandboxed
        self.private_network = private_network
        self.memory_cgroup = memory_cgroup
        self.disk = disk
        self._run_as_arg = run_as
        self.run_as: tuple[int, int] | None = None  # resolved at first use
        self.sandbox: ToolSandbox | None = None  # what this runner gives tools, known at first use
        self._ready = False

    # -- setup ---------------------------------------------------------------------------------------

    async def _prepare(self) -> Host:
        host = await asyncio.to_thread(probe_host)
        if not self._ready:
            await asyncio.to_thread(self._prepare_root, host)
            self._ready = True
        return host

    def _prepare_root(self, host: Host) -> None:
        global _warned
        if not self.root.is_dir():
            raise AgentVMError(f"workspace root {str(self.root)!r} does not exist")
        uses_bwrap = self._uses_bwrap(host)
        sandbox = assess(host, self.isolation, unsafe=self.unsafe_unsandboxed, private_network=self.private_network,
                         uses_bwrap=uses_bwrap)
        if sandbox.refusal is not None:
            raise SandboxUnavailable(f"Tools cannot run: {sandbox.refusal}")
        self.sandbox = sandbox
        if sandbox.mode == "unsafe-unsandboxed" and not _warned:
            _warned = True
            log.warning(f"UNSAFE: {sandbox.warning}")
        elif self.isolation == "auto" and not uses_bwrap and not _warned:
            _warned = True
            extra = " and an unprivileged uid" if host.privileged else ""
            netns = ", in its own network namespace" if host.unshare is not None else ", with this host's network"
            reason = host.bwrap_problem or "it needs util-linux's prlimit and setpriv as root"
            log.warning(
                f"bubblewrap not usable ({reason}): the tool sandbox relies on rlimits, "
                f"a scrubbed environment and path confinement{extra} only{netns}; tools can read what "
                f"their uid can read on this host")
        if not host.privileged:
            return
        st = os.stat(self.root)
        if self._run_as_arg is not None:
            self.run_as = self._run_as_arg
        elif st.st_uid != 0:
            self.run_as = (st.st_uid, st.st_gid)
        else:
            self.run_as = DEFAULT_RUN_AS
        if (st.st_uid, st.st_gid) != self.run_as:  # hand the workspace to the uid tools run as
            owner = (st.st_uid, st.st_gid)
            for path in (self.root, *(self.root / d for d in ("temp", "projects", "output"))):
                with contextlib.suppress(FileNotFoundError):
                    if (os.lstat(path).st_uid, os.lstat(path).st_gid) == owner:
                        os.chown(path, *self.run_as, follow_symlinks=False)
            log.info("workspace handed to the tool uid", extra={"root": str(self.root), "uid": self.run_as[0]})
        if not uses_bwrap and self.root not in _warned_roots:
            blocked = _unreachable_ancestor(self.root, *self.run_as)
            if blocked is not None:
                _warned_roots.add(self.root)
                log.warning(
                    f"uid {self.run_as[0]} cannot traverse {blocked}: tools still start in the workspace, "
                    f"but absolute paths into it ($HOME, $TMPDIR) fail for them; keep workspaces under a "
                    f"directory other users may traverse (o+x)")

    def _uses_bwrap(self, host: Host) -> bool:
        if self.isolation == "none":
            return False
        if self.isolation == "bwrap" and host.bwrap is None:
            raise SandboxUnavailable(f"bubblewrap was required but is not usable: {host.bwrap_problem}. Install "
                                     "bubblewrap (`apt-get install bubblewrap`) or set AVM_SANDBOX_ISOLATION=auto.")
        if host.bwrap is None:
            return False
        # As root, bwrap needs the exec chain (setpriv inside it); the preexec_fn would drop the uid first.
        if host.privileged and not self._exec_launcher(host):
            if self.isolation == "bwrap":
                raise AgentVMError("bubblewrap as root needs the exec launcher (util-linux prlimit and setpriv)")
            return False
        return True

    def _exec_launcher(self, host: Host) -> bool:
        if self.launcher == "auto":
            return host.exec_launcher
        if self.launcher == "exec" and not host.exec_launcher:
            raise AgentVMError("the exec launcher needs util-linux's prlimit (and setpriv as root)")
        return self.launcher == "exec"

    def _workdir(self, cwd: str) -> str:
        """The absolute cwd, which must be a directory inside the root."""
        if "\0" in cwd:
            raise InvalidRequest(f"cwd {cwd!r}: contains a NUL byte", field="cwd")
        if cwd.startswith("/"):
            raise InvalidRequest(f"cwd {cwd!r}: absolute paths are not allowed", field="cwd")
        norm = posixpath.normpath(cwd or ".")
        if norm == ".." or norm.startswith("../"):
            raise InvalidRequest(f"cwd {cwd!r}: '..' leaves the workspace", field="cwd")
        real = os.path.realpath(self.root / norm)
        root = str(self.root)
        if real != root and not real.startswith(root.rstrip("/") + "/"):
            raise InvalidRequest(f"cwd {cwd!r}: a symlink leads out of the workspace", field="cwd")
        if not os.path.isdir(real):
            raise InvalidRequest(f"cwd {cwd!r}: not a directory", field="cwd")
        return real

    # -- run -----------------------------------------------------------------------------------------

    async def run(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], limits: Limits,
                  stdin: bytes | None = None) -> ProcessResult:
        if not argv:
            raise InvalidRequest("argv is empty", field="argv")
        host = await self._prepare()
        plan = await asyncio.to_thread(self._plan, host, list(argv), cwd, limits)
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *plan.argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=plan.workdir, env=dict(env),
                start_new_session=True, preexec_fn=plan.preexec)
        except (OSError, subprocess.SubprocessError) as exc:
            if plan.cgroup is not None and host.cgroups is not None:
                host.cgroups.remove_now(plan.cgroup)
            if plan.guard is not None:
                await plan.guard.finish()
            message = f"{argv[0]}: {exc.strerror if isinstance(exc, OSError) else exc}\n".encode()
            return ProcessResult(exit_code=127, stdout=b"", stderr=message, output_bytes=0, truncated=False,
                                 killed=None, duration_ms=int((time.monotonic() - started) * 1000))

        out = _Output(limits.output_bytes, limits.output_kill_at)
        pumps = [asyncio.ensure_future(_pump(proc.stdout, out, out.stdout)),
                 asyncio.ensure_future(_pump(proc.stderr, out, out.stderr))]
        feeder = asyncio.ensure_future(_feed(proc.stdin, stdin)) if stdin is not None else None
        exited = asyncio.ensure_future(_exit_status(proc))
        over = asyncio.ensure_future(out.over.wait())
        guard = plan.guard
        watched = [over]  # what ends the call early: its output, and a whole-call limit (call_guard.py)
        if guard is not None:
            guard.start(proc.pid)
            watched.append(asyncio.ensure_future(guard.tripped.wait()))
        killed: str | None = None
        try:
            done, _ = await asyncio.wait({exited, *watched}, timeout=limits.timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if exited not in done:
                if guard is not None and guard.reason is not None:
                    killed = guard.reason
                else:
                    killed = "output_limit" if out.over.is_set() else "timeout"
            # Whatever is left of the tool goes: the whole tree at a limit, background children after.
            self._kill(proc.pid, plan, host)
            returncode = await asyncio.wait_for(asyncio.shield(exited), _REAP_S)
            # The rest of the output; and the transport closes once the pipes do (unless a process that
            # escaped both the process group and the cgroup still holds them).
            closed = asyncio.ensure_future(proc.wait())
            await asyncio.wait([*pumps, closed], timeout=_DRAIN_S)
        except BaseException:  # cancelled (an interrupted turn): kill, and clean up in the background
            self._kill(proc.pid, plan, host)
            _spawn_background(self._cleanup(plan, host, [*pumps, *watched, exited], feeder))
            if guard is not None:
                guard.abandon()
                _spawn_background(guard.finish())
            raise
        await self._cleanup(plan, host, [*pumps, *watched, closed], feeder)
        if guard is not None:
            await guard.finish()
            if killed is None:
                killed = guard.verdict(returncode)
        duration_ms = int((time.monotonic() - started) * 1000)

        exit_code: int | None = returncode
        if killed is None:
            if returncode < 0:
                sig = -returncode
                killed = _CPU_SIG.get(sig, f"signal:{sig}")
            elif returncode > 128 and returncode - 128 in _CPU_SIG:
                # a shell (or bwrap) reporting that its child died of SIGXCPU / SIGXFSZ
                killed = _CPU_SIG[returncode - 128]
        if killed is not None:
            exit_code = None
        return ProcessResult(exit_code=exit_code, stdout=bytes(out.stdout), stderr=bytes(out.stderr),
                             output_bytes=out.total, truncated=out.total > out.kept, killed=killed,
                             duration_ms=duration_ms, workspace_bytes=guard.workspace_bytes if guard else None)

    async def sandboxed_argv(self, argv: Sequence[str], *, cwd: str, limits: Limits) -> tuple[list[str], str]:
        """The argv and absolute workdir that start a long-running process (an MCP stdio server) with a
        tool call's confinement: prlimit's rlimits, the uid drop (setpriv) when the server is root, and
        bubblewrap when this runner uses it (no network then). No pids cgroup, which nothing would remove
        while the process lives: RLIMIT_NPROC bounds its processes instead. The caller spawns the argv
        in the workdir with the env it chooses, in a new session, and kills its process group at the end.

        `cwd` is relative to the root (as for `run`) or an absolute path inside it. Without util-linux's
        prlimit the process gets no rlimits (a warning is logged), and as root that is refused: the
        uid drop needs setpriv, and a user-configured command must not run as root."""
        if not argv:
            raise InvalidRequest("argv is empty", field="argv")
        host = await self._prepare()
        if not self._exec_launcher(host):
            if host.privileged:
                raise AgentVMError("cannot start a sandboxed process as root without util-linux's prlimit and "
                                   "setpriv: they drop it to an unprivileged uid")
            log.warning("no exec launcher (util-linux's prlimit): a long-running sandboxed process gets no rlimits",
                        extra={"command": argv[0]})

        def plan() -> _Plan:  # without a cgroup: the launcher chain (or, without prlimit, what it wraps)
            rel = os.path.relpath(os.path.realpath(cwd), self.root) if os.path.isabs(cwd) else cwd
            return self._plan(replace(host, cgroups=None), list(argv), rel, limits, guarded=False)

        planned = await asyncio.to_thread(plan)
        return planned.argv, planned.workdir

    def _kill(self, pid: int, plan: _Plan, host: Host) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        if plan.cgroup is not None and host.cgroups is not None:
            host.cgroups.kill_all(plan.cgroup)
        if plan.guard is not None:
            plan.guard.kill()

    async def _cleanup(self, plan: _Plan, host: Host, tasks: list[asyncio.Future[Any]],
                       feeder: asyncio.Future[None] | None) -> None:
        for task in [*tasks, *([feeder] if feeder is not None else [])]:
            if not task.done():
                task.cancel()
        if plan.cgroup is not None and host.cgroups is not None and not host.cgroups.remove_now(plan.cgroup):
            _spawn_background(host.cgroups.remove(plan.cgroup))  # its processes are still being reaped

    def _plan(self, host: Host, argv: list[str], cwd: str, limits: Limits, *, guarded: bool = True) -> _Plan:
        """The argv to spawn (and the preexec_fn): cgroup, rlimits, bwrap or a network namespace, uid
        drop, command."""
        workdir = self._workdir(cwd)
        bwrap = self._uses_bwrap(host)
        exec_launcher = self._exec_launcher(host)
        netns = not bwrap and host.privileged and host.unshare is not None  # entered before the uid drop
        cgroups = host.cgroups if self.pids_cgroup else None
        cgroup: Path | None = None
        if cgroups is not None:
            try:
                cgroup = cgroups.create(limits.processes + (2 if bwrap else 0))
            except OSError as exc:
                log.warning(f"no pids cgroup for this tool call ({exc}): RLIMIT_NPROC only")
        guard = CallGuard.prepare(self.root, limits, disk=self.disk, pids_cgroup=cgroup,
                                  memory=host.memory if self.memory_cgroup else None) if guarded else None
        fsize = guard.file_size_bytes if guard is not None else limits.file_size_bytes  # what the quota leaves
        nproc: int | None = None
        if cgroup is None:
            if self.run_as is not None:
                nproc = limits.processes  # the tool's uid; shared by its concurrent calls
            else:  # our own uid: every process of ours counts, so allow that many more
                mine = _user_tasks(os.getuid())
                nproc = None if mine is None else mine + limits.processes
        rlimits: list[tuple[int, int, int]] = [
            (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),
            (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
            (resource.RLIMIT_FSIZE, fsize, fsize),
            (resource.RLIMIT_CORE, 0, 0),
        ]
        if nproc is not None:
            rlimits.append((resource.RLIMIT_NPROC, nproc, nproc))

        inner = argv
        if self.run_as is not None and exec_launcher:
            assert host.setpriv is not None
            inner = [*_setpriv_args(host.setpriv, self.run_as), *argv]
        if bwrap:
            assert host.bwrap is not None
            inner = [host.bwrap, *_bwrap_args(str(self.root), workdir, privileged=host.privileged), "--", *inner]
        if not exec_launcher:
            procs = str(cgroup / "cgroup.procs") if cgroup is not None else None
            setup = _child_setup(procs, rlimits, self.run_as, netns=netns)
            return _Plan(inner, workdir, joining(guard.join, setup) if guard and guard.join else setup, cgroup, guard)
        if netns and host.unshare is not None:
            inner = [host.unshare, "--net", "--", *inner]
        assert host.prlimit is not None
        names = {resource.RLIMIT_CPU: "cpu", resource.RLIMIT_AS: "as", resource.RLIMIT_FSIZE: "fsize",
                 resource.RLIMIT_CORE: "core", resource.RLIMIT_NPROC: "nproc"}
        niced = [host.nice, "-n", str(TOOL_NICENESS)] if host.nice is not None else []
        chain = [host.prlimit, *(f"--{names[r]}={soft}:{hard}" for r, soft, hard in rlimits), "--", *niced, *inner]
        if cgroup is not None:
            chain = [host.sh, "-c", _CG_JOIN, str(cgroup / "cgroup.procs"), *chain]
        for procs_file in guard.join if guard is not None else []:
            chain = [host.sh, "-c", _CG_JOIN, str(procs_file), *chain]
        return _Plan(chain, workdir, None, cgroup, guard)


def _child_setup(procs: str | None, rlimits: list[tuple[int, int, int]],
                 run_as: tuple[int, int] | None, *, netns: bool = False) -> Callable[[], None]:
    """A preexec_fn (runs in the forked child): join the cgroup, set the rlimits, enter an empty network
    namespace, leave root. A failure raises: the command does not start (fail closed)."""
    enter_netns = netns_entry() if netns else None  # looked up before the fork

    def setup() -> None:
        if procs is not None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        for res, soft, hard in rlimits:
            with contextlib.suppress(OSError, ValueError):  # e.g. RLIMIT_AS on macOS
                resource.setrlimit(res, (soft, hard))
        with contextlib.suppress(OSError):
            os.nice(TOOL_NICENESS)
        if enter_netns is not None:
            enter_netns()
        if run_as is not None:
            os.setgroups([])
            os.setresgid(run_as[1], run_as[1], run_as[1])
            os.setresuid(run_as[0], run_as[0], run_as[0])

    return setup


def _unreachable_ancestor(root: Path, uid: int, gid: int) -> Path | None:
    """The first directory above `root` that `uid` may not traverse, or None."""
    for parent in reversed(root.parents):
        try:
            st = os.stat(parent)
        except OSError:
            return parent
        if st.st_uid == uid:
            ok = st.st_mode & stat.S_IXUSR
        elif st.st_gid == gid:
            ok = st.st_mode & stat.S_IXGRP
        else:
            ok = st.st_mode & stat.S_IXOTH
        if not ok:
            return parent
    return None
