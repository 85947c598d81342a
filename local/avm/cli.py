"""`avm`: serve the emulator, chat with it, issue API keys for a cloud deployment, smoke-test a deployment."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ValidationError

from agentvm import __version__
from agentvm.errors import AgentVMError


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
    from avm import chat, config_cmd, doctor, keys, serve_cmd, sessions_cmd, usage_cmd

    serve_cmd.register(sub)
    serve_cmd.one_line_errors(parser, "avm")  # `avm serve --bogus` is reported by this parser

    chat.register(sub)
    doctor.register(sub)
    keys.register(sub)
    config_cmd.register(sub)
    sessions_cmd.register(sub)
    usage_cmd.register(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _run(serve_cmd.run_serve, args)
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
