"""`avm config get [KEY]`, `avm config set KEY VALUE`, `avm config unset KEY`: the config center of a
running server, over its HTTP API (so a change applies to the next turn without a restart)."""

from __future__ import annotations

import json
from typing import Any

import click

from agentvm_client.management import ManagementClient
from avm.runner import Args, Group, run
from avm.server_args import server_options
from avm.server_call import over_server


@click.group(cls=Group, short_help="read or change the server's configuration",
             help="The config center of a running server, over its HTTP API: a change applies to the next turn "
                  "without a restart (docs/configuration.md).")
@server_options
def config(**_: Any) -> None:
    pass


@config.command(help="Every key, or one, with its value and where it comes from.")
@click.argument("key", required=False)
@server_options
def get(**_: Any) -> int:
    return run(run_config)


@config.command("set", help="Set a key (VALUE is JSON, or a plain string).")
@click.argument("key")
@click.argument("value")
@server_options
def set_(**_: Any) -> int:
    return run(run_config)


@config.command(help="Remove a key set with `set` (the lower layers apply again).")
@click.argument("key")
@server_options
def unset(**_: Any) -> int:
    return run(run_config)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _line(key: str, entry: dict[str, Any]) -> str:
    value = json.dumps(entry.get("value"))
    return f"{key} = {value}  ({entry.get('source') or 'unset'}; applies at {entry.get('appliesAt')})"


async def run_config(args: Args) -> int:
    async def work(avm: ManagementClient) -> int:
        if args.action == "get":
            body = await avm.config.get(args.key)
        elif args.action == "set":
            body = await avm.config.set(args.key, _value(args.value))
        else:
            body = await avm.config.unset(args.key)
        if "values" in body:
            for key, entry in body["values"].items():
                print(_line(key, entry))
        else:
            print(_line(body["key"], body))
        return 0
    return await over_server(args, "config", work, timeout=10)
