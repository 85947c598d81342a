"""`avm serve`: its flags, the checks that turn a user's mistake into one line with the fix (exit 2,
no traceback), and the start of the server (the runtime itself is wired in avm/app.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from agentvm.errors import InvalidRequest
from avm.runner import Args, Command, complete_dir, complete_file, run

if TYPE_CHECKING:
    from agentvm.config import Settings


class StartupRefused(Exception):
    """A user's mistake found before the server starts: `avm serve: <line>` on stderr, exit code 2."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


#: setting -> its flag of `avm serve`
FLAGS = {"host": "--host", "port": "--port", "data_dir": "--data-dir", "script_path": "--script",
         "stream_flush_ms": "--flush-ms", "log_level": "--log-level", "log_format": "--log-format",
         "unsafe_unsandboxed_tools": "--unsafe-unsandboxed-tools"}


@click.command(cls=Command, short_help="run the one-process AgentVM emulator",
               help="Run the one-process AgentVM emulator: the HTTP API, the AgentX WebSocket, the chat API and "
                    "the console on one port. Flag values are checked at start-up: a bad one is one line naming "
                    "the flag, exit code 2.")
@click.option("--host", metavar="ADDRESS", help="address to bind (default 127.0.0.1)")
@click.option("--port", metavar="PORT", help="port to bind (default 8080; 0 picks a free port)")
@click.option("--data-dir", metavar="DIR", shell_complete=complete_dir,
              help="where data is kept (default ~/.agentvm; created if missing)")
@click.option("--script", metavar="FILE", shell_complete=complete_file,
              help="script file for the offline scripted driver")
@click.option("--flush-ms", metavar="MS", help="text-delta coalescing window in ms, 0 to 5000 (default 0)")
@click.option("--log-level", metavar="LEVEL", help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default INFO)")
@click.option("--log-format", metavar="FORMAT", help="stderr lines: auto (console on a terminal, else json), "
                                                    "console or json; the log file is always JSON (default auto)")
@click.option("--unsafe-unsandboxed-tools", is_flag=True, default=None,
              help="UNSAFE: on a host without bubblewrap and not running as root, run tools anyway, as this "
                   "server's own user (they can read its keys and database); default: refuse them")
def serve(**_: Any) -> int:
    # values are taken as text and checked by `settings_from`: a bad one gets one line naming its flag
    # and what it accepts
    return run(run_serve)


def flag_values(args: Args) -> dict[str, Any]:
    """The settings the command line gave (absent flags: left to the environment and the defaults)."""
    given = {"host": args.host, "port": args.port, "data_dir": args.data_dir, "script_path": args.script,
             "stream_flush_ms": args.flush_ms, "log_level": args.log_level, "log_format": args.log_format,
             "unsafe_unsandboxed_tools": args.unsafe_unsandboxed_tools}
    return {k: v for k, v in given.items() if v is not None}


def _accepts(name: str) -> str | None:
    """What a flagged setting accepts, in plain words (None: a setting no flag of `avm serve` sets, or
    one whose text is checked later: --host when binding, --data-dir and --script before start-up)."""
    from agentvm.config import LOG_LEVELS, Settings

    if name in ("port", "stream_flush_ms"):
        low, high = _bounds(Settings, name)
        unit = " of milliseconds" if name == "stream_flush_ms" else ""
        extra = " (0 picks a free port)" if name == "port" else ""
        return f"must be a whole number{unit} from {low} to {high}{extra}"
    return {"log_level": f"not a log level; use {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}",
            "log_format": "must be auto, console or json",
            "unsafe_unsandboxed_tools": "must be true or false"}.get(name)


def _bounds(settings: type[Settings], name: str) -> tuple[object, object]:
    low = high = None
    for rule in settings.model_fields[name].metadata:
        low = getattr(rule, "ge", low)
        high = getattr(rule, "le", high)
    return low, high


def settings_from(flags: dict[str, Any]) -> Settings:
    """Settings from these flag values over the environment. A bad value of a serve flag's setting
    (given as the flag or its variable): StartupRefused naming the flag (or variable), the value and
    what is accepted; any other setting: InvalidRequest naming the setting and its variable."""
    from pydantic import ValidationError

    from agentvm.config import Settings

    try:
        return Settings(**flags)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        source = _source(name, flags)
        accepts = _accepts(name)
        if accepts is not None:
            shown = flags[name] if name in flags else os.environ.get(source, "")
            raise StartupRefused(f"{source}{' ' if name in flags else '='}{_quoted(str(shown))}: {accepts}") from None
        raise InvalidRequest(f"invalid setting {name} ({source}): {err['msg']}", field=name) from None


def _quoted(value: str) -> str:
    import shlex

    return shlex.quote(value)


def _source(name: str, flags: dict[str, Any]) -> str:
    """Where a setting's value came from: its flag, else the environment variable that holds it."""
    from pydantic import AliasChoices

    from agentvm.config import Settings

    if name in flags:
        return FLAGS[name]
    field = Settings.model_fields.get(name)
    alias = field.validation_alias if field is not None else None
    if isinstance(alias, AliasChoices):
        names = [str(c) for c in alias.choices]
        return next((n for n in names if n in os.environ), names[0])
    return f"AVM_{name.upper()}"


def _named(name: str, flags: dict[str, Any], value: object) -> str:
    """`--data-dir /x`, `AVM_DATA_DIR=/x`, or `/x (the default --data-dir)`."""
    if name in flags:
        return f"{FLAGS[name]} {value}"
    variable = _source(name, flags)
    if variable in os.environ:
        return f"{variable}={value}"
    return f"{value} (the default {FLAGS[name]})"


def check_data_dir(path: Path, named: str) -> None:
    """The data directory exists (created here if missing) and this user can write in it."""
    if path.exists() and not path.is_dir():
        raise StartupRefused(f"{named} is a file, not a directory: pass a directory (it is created if missing)")
    if not path.exists():
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupRefused(f"{named} cannot be created ({exc.strerror}): pass a directory you can "
                                 "create or one that exists") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise StartupRefused(f"{named} is not writable by this user: change its permissions or pass another "
                             "--data-dir")


def check_script(path: Path, named: str) -> None:
    """The scripted driver's script is a file that parses (checked even when an API key makes it unused)."""
    from agentvm.drivers.scripted import ScriptedDriver

    if not path.is_file():
        raise StartupRefused(f"{named} is not a readable file: pass the path of a YAML or JSON script "
                             "(docs/configuration.md, script_path)")
    try:
        ScriptedDriver.from_file(path)
    except InvalidRequest as exc:
        problem = exc.message.removeprefix(f"{path}: ").removeprefix(f"script file {path}: ")
        raise StartupRefused(f"{named}: {' '.join(problem.split())}") from None


def bind(host: str, port: int, named_host: str) -> socket.socket:
    """The listening socket, bound here so that a busy port is one line before anything starts (and no
    other process can take the port between this check and the server)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts reuse the port
        sock.bind((host, port))
        sock.listen(2048)
    except socket.gaierror as exc:
        sock.close()
        raise StartupRefused(f"{named_host} is not an address of this machine (the name does not resolve: "
                             f"{exc.strerror}): pass an address such as 127.0.0.1") from None
    except OSError as exc:
        sock.close()
        import errno

        if exc.errno == errno.EADDRINUSE:
            raise StartupRefused(f"port {port} is in use: stop the other server or pass --port") from None
        if exc.errno == errno.EACCES:
            raise StartupRefused(f"port {port} needs more privileges than this user has: pass --port with a "
                                 "port above 1023") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise StartupRefused(f"{named_host} is not an address of this machine: pass --host 127.0.0.1 (the "
                                 "default) or one of its addresses") from None
        raise StartupRefused(f"cannot listen on {host} port {port}: {exc.strerror}") from None
    return sock


def console_logs(log_format: str) -> bool:
    """Readable console lines on stderr (else JSON): `auto` means when stderr is a terminal."""
    return log_format == "console" or (log_format == "auto" and sys.stderr.isatty())


def _check_auth(settings: Settings) -> None:
    from agentvm.adapters.local.sqlite_keys import usable_keys
    from agentvm.ids import now_ms
    from avm.app import auth_mode, is_loopback

    if auth_mode(settings) == "open" and not is_loopback(settings.host):
        raise StartupRefused(f"refusing to listen on {settings.host} without API keys (AVM_AUTH=open is for "
                             "loopback addresses only)")
    if auth_mode(settings) == "keys" and usable_keys(settings.database_path(), now_ms()) == 0:
        raise StartupRefused(
            f"refusing to listen on {settings.host}: a public address requires API keys, and none are "
            f"configured. Create one with `avm keys create --tenant <name> --scope admin --data-dir "
            f"{settings.data_dir}`, or bind 127.0.0.1 (the default) for the open local mode.")


async def run_serve(args: Args) -> int:
    try:
        return await _serve(args)
    except StartupRefused as refused:
        print(f"avm serve: {refused.line}", file=sys.stderr)
        return 2


async def _serve(args: Args) -> int:
    import uvicorn

    from agentvm.adapters.local.local_env import ProcessEnv
    from agentvm.adapters.local.sqlite_integrity import check_database
    from agentvm.logs import setup_logging
    from agentvm.observability import tracing
    from agentvm.services.config import check_startup
    from avm.app import banner, build_runtime, uvicorn_config

    flags = flag_values(args)
    settings = settings_from(flags)
    check_data_dir(settings.data_dir, _named("data_dir", flags, settings.data_dir))
    if settings.script_path is not None:
        check_script(settings.script_path, _named("script_path", flags, settings.script_path))
    # stderr: readable lines on a terminal (or --log-format console), else JSON; the file: JSON lines,
    # <data_dir>/logs/avm.log (10 MB, 5 old files kept; docs/observability.md)
    log_file = settings.data_dir / "logs" / "avm.log"
    try:
        setup_logging(settings.log_level, log_file=log_file, console=console_logs(settings.log_format))
    except OSError as exc:  # <data_dir>/logs is a file, say
        where = exc.filename or log_file
        raise StartupRefused(f"the log file {log_file} cannot be opened ({where}: {exc.strerror}): move that away "
                             "or pass another --data-dir") from None
    try:
        tracing.setup()  # the OTEL_* variables (docs/observability.md, "Traces"): a bad one is one line
    except tracing.TracingSetupError as exc:
        raise StartupRefused(str(exc)) from None
    # a damaged database stops start-up here with one line (which file, what to do), before anything reads it
    check_database(settings.database_path(), budget_s=settings.db_check_s)
    _check_auth(settings)
    sock = bind(settings.host, settings.port, _named("host", flags, settings.host))
    try:
        # a bad config file or environment variable: one line naming the key, before anything is built
        await check_startup(settings, ProcessEnv(), file=settings.config_file or settings.data_dir / "config.yaml")
        rt = build_runtime(settings)
        await rt.config.load_file()  # read once here (checked above), before anything listens
    except BaseException:
        sock.close()
        raise
    server = uvicorn.Server(uvicorn_config(rt))

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        banner(rt, sock.getsockname()[1])

    task = asyncio.get_running_loop().create_task(announce())
    await server.serve(sockets=[sock])
    task.cancel()
    return 0 if server.started else 1
