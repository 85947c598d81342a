"""`--url` and `--token` of the `avm` commands that talk to a running server: accepted before the
action (`avm config --url U get`) and after it (`avm config get --url U`)."""

from __future__ import annotations

import argparse

from agentvm.config import ClientSettings


def add_server_options(parser: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """On the command (`defaults`: from $AVM_URL / $AVM_TOKEN) and again on each action, where an
    absent option leaves the command's value alone."""
    if defaults:
        env = ClientSettings()
        url: object = env.url
        token: object = env.token.get_secret_value() if env.token else None
    else:
        url = token = argparse.SUPPRESS
    parser.add_argument("--url", default=url, help="the server (its ws:// URL or http:// base; default: $AVM_URL)")
    parser.add_argument("--token", default=token, help="API key (default: $AVM_TOKEN)")


def add_action(actions: argparse._SubParsersAction[argparse.ArgumentParser], name: str, *,
               help: str) -> argparse.ArgumentParser:
    """One action of a command; it takes the server options too."""
    action = actions.add_parser(name, help=help)
    add_server_options(action, defaults=False)
    return action
