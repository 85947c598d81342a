"""`avm config get [KEY]`, `avm config set KEY VALUE`, `avm config unset KEY`: the config center of a
running server, over its HTTP API (so a change applies to the next turn without a restart)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from agentvm_client.management import ManagementClient
from avm.server_args import add_action, add_server_options
from avm.server_call import over_server


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("config", help="read or change the server's configuration")
    add_server_options(p)
    actions = p.add_subparsers(dest="config_command", required=True)
    g = add_action(actions, "get", help="every key, or one, with its value and where it comes from")
    g.add_argument("key", nargs="?")
    s = add_action(actions, "set", help="set a key (VALUE is JSON, or a plain string)")
    s.add_argument("key")
    s.add_argument("value")
    u = add_action(actions, "unset", help="remove a key set with `set` (the lower layers apply again)")
    u.add_argument("key")


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _line(key: str, entry: dict[str, Any]) -> str:
    value = json.dumps(entry.get("value"))
    return f"{key} = {value}  ({entry.get('source') or 'unset'}; applies at {entry.get('appliesAt')})"


async def run_config(args: argparse.Namespace) -> int:
    async def work(avm: ManagementClient) -> int:
        if args.config_command == "get":
            body = await avm.config.get(args.key)
        elif args.config_command == "set":
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
