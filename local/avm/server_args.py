"""`--url` and `--token` of the `avm` commands that talk to a running server: accepted on the command
(`avm config --url U get`) and on its action (`avm config get --url U`); absent on both, they are
$AVM_URL and $AVM_TOKEN (`server`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from agentvm.config import ClientSettings

F = TypeVar("F", bound=Callable[..., object])


def server_options(command: F) -> F:
    command = click.option("--token", metavar="KEY", help="API key (default: $AVM_TOKEN)")(command)
    return click.option("--url", metavar="URL",
                        help="the server (its ws:// URL or http:// base; default: $AVM_URL, else "
                             "ws://127.0.0.1:8080/ws)")(command)


def env_token() -> str | None:
    token = ClientSettings().token
    return token.get_secret_value() if token else None


def server(url: str | None, token: str | None) -> tuple[str, str | None]:
    """The server and key given, else those of the environment."""
    return ClientSettings().url if url is None else url, env_token() if token is None else token
