"""`avm`: serve the emulator, chat with it, issue API keys for a cloud deployment, smoke-test a deployment."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import AliasChoices, ValidationError

from agentvm import __version__
from agentvm.errors import AgentVMError, InvalidRequest

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the one-process AgentVM emulator")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to bind (default 8080; 0 picks a free port)")
    p.add_argument("--data-dir", type=Path, help="where data is kept (default ~/.agentvm)")
    p.add_argument("--script", type=Path, help="script file for the offline scripted driver")
    p.add_argument("--flush-ms", type=int, help="text-delta coalescing window in ms (default 0)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    p.add_argument("--unsafe-unsandboxed-tools", action="store_true", default=None,
                   help="UNSAFE: on a host without bubblewrap and not running as root, run tools anyway, as "
                        "this server's own user (they can read its keys and database); default: refuse them")


_FLAGS = {"host": "--host", "port": "--port", "data_dir": "--data-dir", "script_path": "--script",
          "stream_flush_ms": "--flush-ms", "log_level": "--log-level",
          "unsafe_unsandboxed_tools": "--unsafe-unsandboxed-tools"}


def _settings_from(args: argparse.Namespace) -> object:
    from agentvm.config import Settings

    overrides = {k: v for k, v in {
        "host": args.host, "port": args.port, "data_dir": args.data_dir, "script_path": args.script,
        "stream_flush_ms": args.flush_ms, "log_level": args.log_level,
        "unsafe_unsandboxed_tools": args.unsafe_unsandboxed_tools}.items() if v is not None}
    try:
        return Settings(**overrides)
    except ValidationError as exc:  # one line naming the setting and where it came from (flag or variable)
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        raise InvalidRequest(f"invalid setting {name} ({_source(Settings, name, overrides)}): {err['msg']}",
                             field=name) from None


def _source(settings: type[BaseSettings], name: str, flags: dict[str, Any]) -> str:
    if name in flags:
        return _FLAGS[name]
    field = settings.model_fields.get(name)
    alias = field.validation_alias if field is not None else None
    if isinstance(alias, AliasChoices):
        names = [str(c) for c in alias.choices]
        return next((n for n in names if n in os.environ), names[0])
    return f"AVM_{name.upper()}"


async def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from agentvm.adapters.local.local_env import ProcessEnv
    from agentvm.adapters.local.sqlite_integrity import check_database
    from agentvm.adapters.local.sqlite_keys import usable_keys
    from agentvm.config import Settings
    from agentvm.ids import now_ms
    from agentvm.logs import setup_logging
    from agentvm.services.config import check_startup
    from avm.app import auth_mode, banner, build_runtime, is_loopback, uvicorn_config

    settings = _settings_from(args)
    assert isinstance(settings, Settings)
    # JSON lines to stderr and to <data_dir>/logs/avm.log (10 MB, 5 old files kept; docs/observability.md)
    setup_logging(settings.log_level, log_file=settings.data_dir / "logs" / "avm.log")
    # a damaged database stops start-up here with one line (which file, what to do), before anything reads it
    check_database(settings.database_path(), budget_s=settings.db_check_s)
    # a bad config file or environment variable: one line naming the key, before anything is built
    await check_startup(settings, ProcessEnv(), file=settings.config_file or settings.data_dir / "config.yaml")
    if auth_mode(settings) == "open" and not is_loopback(settings.host):
        print(f"avm serve: refusing to listen on {settings.host} without API keys (AVM_AUTH=open is for "
              "loopback addresses only)", file=sys.stderr)
        return 2
    if auth_mode(settings) == "keys" and usable_keys(settings.database_path(), now_ms()) == 0:
        print(f"avm serve: refusing to listen on {settings.host}: a public address requires API keys, and "
              f"none are configured. Create one with `avm keys create --tenant <name> --scope admin --data-dir "
              f"{settings.data_dir}`, or bind 127.0.0.1 (the default) for the open local mode.", file=sys.stderr)
        return 2
    rt = build_runtime(settings)
    config = uvicorn_config(rt)
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        port = settings.port
        for s in server.servers:
            for sock in s.sockets:
                port = sock.getsockname()[1]
        banner(rt, port)

    await rt.config.load_file()  # read once here (checked above), before anything listens
    task = asyncio.get_running_loop().create_task(announce())
    await server.serve()
    task.cancel()
    return 0 if server.started else 1


def _run(entry: Callable[[argparse.Namespace], Coroutine[Any, Any, int]], args: argparse.Namespace) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.run(entry(args))
    return uvloop.run(entry(args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="avm", description="AgentVM: host AI agents at the lowest cost.")
    parser.add_argument("--version", action="version", version=f"avm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    from avm import chat, config_cmd, doctor, keys, sessions_cmd, usage_cmd

    chat.register(sub)
    doctor.register(sub)
    keys.register(sub)
    config_cmd.register(sub)
    sessions_cmd.register(sub)
    usage_cmd.register(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _run(_serve, args)
        if args.command == "chat":
            return _run(chat.run_chat, args)
        if args.command == "keys":
            return _run(keys.run_keys, args)
        if args.command == "config":
            return _run(config_cmd.run_config, args)
        if args.command == "sessions":
            return _run(sessions_cmd.run_sessions, args)
        if args.command == "usage":
            return _run(usage_cmd.run_usage, args)
        if args.command == "budgets":
            return _run(usage_cmd.run_budgets, args)
        if args.command == "doctor":
            return _run(doctor.run_doctor, args)
    except KeyboardInterrupt:
        return 130
    except ValidationError as exc:
        err = exc.errors()[0]
        print(f"avm: invalid setting {'.'.join(str(p) for p in err['loc'])}: {err['msg']}", file=sys.stderr)
        return 2
    except AgentVMError as exc:
        print(f"avm: {exc.message}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
