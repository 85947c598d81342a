"""How an `avm` command runs: click's classes of its commands and groups (a usage mistake names the
command it was made in), its parameters (and those of the groups above it, `avm sessions --url U
list`) as one `Args`, its coroutine on uvloop, and a user's mistake found while running it (a bad
setting, an InvalidRequest) as one line with exit code 2."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import click
from click.shell_completion import CompletionItem

#: a command's parameters by name, as click parsed them; `action`: the name of the command run
#: (`create` of `avm keys create`)
Args = SimpleNamespace

Entry = Callable[[Args], Coroutine[Any, Any, int]]


class _NamedMistakes:
    """click's parser raises some usage errors (`--port` without its value) without the context they
    happened in; this gives them it, so that the line says `avm serve: …`, not `avm: …`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)  # type: ignore[misc, no-any-return]
        except click.UsageError as exc:
            if exc.ctx is None:
                exc.ctx = ctx
            raise


class _ShortHelp:
    """`-h` as well as `--help` on every command, also one whose context has no parent (click keeps a
    command's help option once made, so it must not depend on who made the first context)."""

    def __init__(self, *args: Any, context_settings: dict[str, Any] | None = None, **kwargs: Any) -> None:
        settings = {"help_option_names": ["-h", "--help"], **(context_settings or {})}
        super().__init__(*args, context_settings=settings, **kwargs)  # type: ignore[call-arg]


class Command(_ShortHelp, _NamedMistakes, click.Command):
    pass


class Group(_ShortHelp, _NamedMistakes, click.Group):
    command_class = Command
    group_class = type  # a group's groups are of this class too


def complete_dir(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Shell completion of a directory flag whose value is checked later (by the command, in its words)."""
    return [CompletionItem(incomplete, type="dir")]


def complete_file(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(incomplete, type="file")]


def arguments(ctx: click.Context) -> Args:
    """The command's parameters; one it does not have or left unset comes from its groups (the nearest
    first): `--url` is accepted on `avm config` and on `avm config get`."""
    params = dict(ctx.params)
    parent = ctx.parent
    while parent is not None:
        for name, value in parent.params.items():
            if params.get(name) is None:
                params[name] = value
        parent = parent.parent
    return Args(action=ctx.info_name, **params)


def run(entry: Entry) -> int:
    """Run `entry` with the current command's arguments; its exit code."""
    from pydantic import ValidationError

    from agentvm.errors import AgentVMError

    args = arguments(click.get_current_context())
    try:
        return _loop(entry, args)
    except KeyboardInterrupt:
        return 130
    except ValidationError as exc:
        err = exc.errors()[0]
        print(f"avm: invalid setting {'.'.join(str(p) for p in err['loc'])}: {err['msg']}", file=sys.stderr)
        return 2
    except AgentVMError as exc:
        print(f"avm: {exc.message}", file=sys.stderr)
        return 2


def _loop(entry: Entry, args: Args) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.run(entry(args))
    return uvloop.run(entry(args))
