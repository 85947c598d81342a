"""Which tool sandbox this host gives, and whether tools may run here at all: fail closed.

A sandbox *isolates* when it keeps a tool away from the server's own files, environment and loopback
services (its API, with which a tool could change what every tenant pays):

* ``bubblewrap``: bubblewrap works here; the tool sees only system directories and its workspace, no
  network, its own pid namespace (as root it also runs as the container's own uid).
* ``uid``: no bubblewrap, but the server runs as root: the tool runs as the container's own uid
  (files: 0o600/0o700 keep it out) in its own empty network namespace (`unshare --net`, util-linux),
  so it reaches no loopback service.
* ``unsafe-unsandboxed``: neither, and the operator opted in (`AVM_UNSAFE_UNSANDBOXED_TOOLS=1`,
  `avm serve --unsafe-unsandboxed-tools`): tools run as the server's own user with its network.
  They can read its keys, database and logs and call its API. Shouted at start-up and on /health.
* ``unavailable``: neither, no opt-in: images with sandbox tools are refused (image_create,
  image_update, message_send) and the process runner starts nothing.

`sandbox_isolation=none` never means unconfined by itself: as root it is the ``uid`` mode; as
another user it needs the opt-in like a host without bubblewrap. `sandbox_isolation=bwrap` requires
bubblewrap and the opt-in does not replace it.
"""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentvm.errors import SandboxUnavailable

__all__ = ["Host", "Isolation", "SandboxMode", "SandboxUnavailable", "ToolSandbox", "assess", "bwrap_usable",
           "netns_entry", "probe_unshare"]

if TYPE_CHECKING:
    from agentvm.adapters.local.call_guard import MemoryCgroups
    from agentvm.adapters.local.cgroups import PidsCgroups

Isolation = Literal["auto", "bwrap", "none"]
SandboxMode = Literal["bubblewrap", "uid", "unsafe-unsandboxed", "unavailable"]

_CLONE_NEWNET = 0x40000000  # <sched.h>
UNSAFE_ENV = "AVM_UNSAFE_UNSANDBOXED_TOOLS"
UNSAFE_FLAG = "--unsafe-unsandboxed-tools"
FIX = (f"Install bubblewrap (`apt-get install bubblewrap`), run the server as root (tools then run as a "
       f"per-container uid in their own network namespace), or accept unconfined tools with {UNSAFE_ENV}=1 "
       f"(`avm serve {UNSAFE_FLAG}`): they can then read everything the server's user can and call its API.")


@dataclass(frozen=True, slots=True)
class ToolSandbox:
    """What tools get on this host. `why`: what is missing when the mode does not isolate."""

    mode: SandboxMode
    why: str | None = None
    bwrap_required: bool = False  # sandbox_isolation=bwrap: only bubblewrap is a fix

    @property
    def isolating(self) -> bool:
        return self.mode in ("bubblewrap", "uid")

    @property
    def refusal(self) -> str | None:
        """Why sandbox tools are refused and how to fix it (None: they may run)."""
        if self.mode != "unavailable":
            return None
        if self.bwrap_required:
            return (f"this server has no isolating tool sandbox: {self.why}. Install bubblewrap "
                    "(`apt-get install bubblewrap`) or set AVM_SANDBOX_ISOLATION=auto.")
        return f"this server has no isolating tool sandbox: {self.why}. {FIX}"

    @property
    def warning(self) -> str | None:
        """The start-up banner's WARNING line (and /health's) when tools run unconfined."""
        if self.mode != "unsafe-unsandboxed":
            return None
        return (f"tools run UNSANDBOXED ({UNSAFE_ENV}=1): {self.why}; a tool can read the server's keys, "
                "database and logs and call its API on loopback")

    def health(self) -> dict[str, Any]:
        """Fields /health adds when tools run unconfined (the opt-in); nothing otherwise (a host that
        refuses sandbox tools says so at start-up and in each refusal)."""
        if self.mode == "unsafe-unsandboxed":
            return {"sandbox": self.mode, "warnings": [self.warning]}
        return {}


@dataclass(frozen=True, slots=True)
class Host:
    """What this host offers tools (local_process.probe_host: probed once per server process)."""

    privileged: bool  # the server runs as root: tools are dropped to an unprivileged uid
    prlimit: str | None
    setpriv: str | None
    sh: str
    bwrap: str | None  # a bwrap that works here, as this runner would use it
    bwrap_problem: str | None  # why not, when it is not usable
    cgroups: PidsCgroups | None
    nice: str | None = None  # coreutils' nice, for the exec chain
    unshare: str | None = None  # util-linux's unshare, when `unshare --net` works here (as root)
    unshare_problem: str | None = None  # why not
    memory: MemoryCgroups | None = None  # per-call memory cgroups (call_guard.py), when this host delegates them

    @property
    def exec_launcher(self) -> bool:
        """util-linux's prlimit and setpriv set the limits and drop the uid in an exec chain; without
        them the child does it in a `preexec_fn` (macOS, busybox systems)."""
        return self.prlimit is not None and (self.setpriv is not None or not self.privileged)


def bwrap_usable(host: Host) -> bool:
    """Would the runner use bubblewrap here (as root it needs the exec launcher: setpriv inside it)?"""
    return host.bwrap is not None and (not host.privileged or host.exec_launcher)


def assess(host: Host, isolation: Isolation, *, unsafe: bool = False, private_network: bool = True,
           uses_bwrap: bool | None = None) -> ToolSandbox:
    """The tool sandbox this host gives with these settings. `private_network`: tools must not share
    this process's network (it listens on loopback: `avm serve`); the container task's worker listens
    on nothing, so there a uid drop without a network namespace still isolates. `uses_bwrap`: what
    the runner decided (its launcher may rule bubblewrap out), else what this host allows."""
    bwrap = bwrap_usable(host) if uses_bwrap is None else uses_bwrap
    if isolation != "none" and bwrap:
        return ToolSandbox("bubblewrap")
    if isolation == "bwrap":
        return ToolSandbox("unavailable", f"sandbox_isolation is 'bwrap' but bubblewrap is not usable "
                                          f"({host.bwrap_problem or 'it needs util-linux prlimit and setpriv'})",
                           bwrap_required=True)
    if host.privileged and (host.unshare is not None or not private_network):
        return ToolSandbox("uid")
    missing = ("sandbox_isolation is 'none'" if isolation == "none"
               else f"bubblewrap is not usable ({host.bwrap_problem or 'it needs util-linux prlimit and setpriv'})")
    if host.privileged:
        why = (f"{missing}, and tools cannot get their own network namespace ({host.unshare_problem}), so they "
               "could reach the server's API on loopback")
    else:
        why = f"{missing}, and the server does not run as root (tools would run as its own user)"
    return ToolSandbox("unsafe-unsandboxed" if unsafe else "unavailable", why)


def probe_unshare(unshare: str | None) -> tuple[str | None, str | None]:
    """(unshare, None) when `unshare --net` gives a process its own network namespace here (it needs
    CAP_SYS_ADMIN: an unprivileged container or Fargate does not grant it), else (None, why not)."""
    if unshare is None:
        return None, "unshare (util-linux) is not installed"
    try:
        proc = subprocess.run([unshare, "--net", "--", "true"], capture_output=True, timeout=10, check=False,
                              env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"unshare could not run: {exc}"
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        return None, f"unshare --net does not work here: {lines[-1] if lines else f'exit {proc.returncode}'}"
    return unshare, None


def netns_entry() -> Callable[[], None]:
    """For a `preexec_fn` (the launcher without util-linux): enter an empty network namespace, as root,
    before the uid drop; raises when it cannot (the command then does not start). libc is looked up
    here, before the fork."""
    unshare = ctypes.CDLL(None, use_errno=True).unshare

    def enter() -> None:
        if unshare(_CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")

    return enter
