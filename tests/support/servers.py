"""Run AgentVM for tests: in-process (uvicorn in the test's loop) or as a real `avm serve` process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from agentvm.config import Settings
from agentvm.ports import Driver
from avm.app import Runtime, build_runtime, uvicorn_config

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class InProcess:
    runtime: Runtime
    port: int

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def in_process(data_dir: Path, *, driver: Driver | None = None, free_bytes: Callable[[], int] | None = None,
                     **settings: Any) -> AsyncIterator[InProcess]:
    port = free_port()
    cfg = Settings(host="127.0.0.1", port=port, data_dir=data_dir, **settings)
    rt = build_runtime(cfg, driver=driver, free_bytes=free_bytes)
    config = uvicorn_config(rt)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(server.serve())
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if task.done():
        task.result()
    try:
        yield InProcess(rt, port)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)



@contextlib.asynccontextmanager
async def with_anthropic_driver(data_dir: Path, kind: str, settings: dict[str, Any]) -> AsyncIterator[InProcess]:
    """`avm serve` in-process with an Anthropic key (in `settings`, with its base URL): the `sdk` kind runs
    the driver `avm serve` builds itself, the `lite` kind the one the function tier's composition root
    builds."""
    from agentvm.cloud.runtime import build_driver as build_function_tier_driver
    from avm.app import build_driver as build_serve_driver

    if kind == "sdk":
        driver = build_serve_driver(Settings(**settings))
    else:
        driver = build_function_tier_driver(Settings(**settings), str(settings["llm_api_key"]))
    assert type(driver).__name__ == {"sdk": "AnthropicDriver", "lite": "AnthropicLiteDriver"}[kind]
    try:
        async with in_process(data_dir, driver=driver, **settings) as srv:
            yield srv
    finally:
        await driver.aclose()  # type: ignore[attr-defined]

@dataclass
class ServeProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_serve(data_dir: Path, *args: str, env: dict[str, str] | None = None,
                port: int | None = None, timeout: float = 20.0) -> ServeProcess:
    """Start `avm serve` as a real process and wait until /health answers."""
    port = port or free_port()
    log_path = data_dir.parent / f"serve-{port}-{time.monotonic_ns()}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("AVM_", "LLM_", "ANTHROPIC_"))}
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "avm.cli", "serve", "--port", str(port), "--data-dir", str(data_dir), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
    sp = ServeProcess(proc, port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"avm serve exited with {proc.returncode}:\n{sp.log()}")
        try:
            if httpx.get(f"{sp.http}/health", timeout=0.5).status_code == 200:
                return sp
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    stop_serve(sp)
    raise RuntimeError(f"avm serve did not start:\n{sp.log()}")


def await_startup_record(sp: ServeProcess, deadline: float) -> None:
    """The server binds its port before it logs its start-up record (the banner, at INFO): /health can
    answer a moment before the log says what started. For a test that reads the record."""
    while time.monotonic() < deadline:
        text = sp.log()
        if '"event":"startup"' in text or "listening on" in text:
            return
        time.sleep(0.02)


def stop_serve(sp: ServeProcess, *, kill: bool = False) -> int:
    if sp.proc.poll() is None:
        sp.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            sp.proc.wait(20)
        except subprocess.TimeoutExpired:
            sp.proc.kill()
            sp.proc.wait(5)
    return int(sp.proc.returncode)


@contextlib.contextmanager
def serve(data_dir: Path, *args: str, **kwargs: Any) -> Iterator[ServeProcess]:
    sp = start_serve(data_dir, *args, **kwargs)
    try:
        yield sp
    finally:
        stop_serve(sp)


def avm(*argv: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AVM_", "LLM_", "ANTHROPIC_"))}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "avm.cli", *argv], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


def create_key(data: Path, tenant: str, *scopes: str) -> str:
    """A key made with the CLI in `avm serve`'s database before the server starts; its token."""
    done = avm("keys", "create", "--tenant", tenant, "--data-dir", str(data), *(f"--scope={s}" for s in scopes))
    assert done.returncode == 0, done.stderr
    return done.stdout.split("token (shown once, keep it secret): ")[1].split()[0]
