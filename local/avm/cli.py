"""`avm`: serve the emulator, chat with it, issue API keys for a cloud deployment, smoke-test a deployment.

The command line is click's: one command or group per module (avm/serve_cmd.py, chat.py, doctor.py,
keys.py, usage_cmd.py, budgets_cmd.py, config_cmd.py, sessions_cmd.py), help on each (`-h`), `avm
--version`, and shell completion (`eval "$(_AVM_COMPLETE=bash_source avm)"`; zsh_source, fish_source).
A mistake on the command line is one line naming the flag, exit code 2."""

from __future__ import annotations

import os
import sys

import click

from agentvm import __version__
from avm import budgets_cmd, chat, config_cmd, doctor, keys, serve_cmd, sessions_cmd, usage_cmd
from avm.runner import Group

PROG = "avm"
COMPLETE_VAR = "_AVM_COMPLETE"


@click.group(cls=Group, help="AgentVM: host AI agents at the lowest cost.",
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name=PROG, message="%(prog)s %(version)s")
def avm() -> None:
    pass


for _command in (serve_cmd.serve, chat.chat, doctor.doctor, keys.keys, config_cmd.config, sessions_cmd.sessions,
                 usage_cmd.usage, budgets_cmd.budgets):
    avm.add_command(_command)


def one_line(exc: click.UsageError) -> str:
    """A command-line mistake as `avm <command>: <what> (see avm <command> --help)`."""
    path = exc.ctx.command_path if exc.ctx is not None else PROG
    message = " ".join(exc.format_message().split()).rstrip(".")
    return f"{path}: {message} (see {path} --help)"


def main(argv: list[str] | None = None) -> int:
    """Run `avm` with these arguments (default: the process's); the exit code."""
    instruction = os.environ.get(COMPLETE_VAR)
    if instruction:  # the shell asks for a completion script or for the completions of a line
        from click.shell_completion import shell_complete

        return shell_complete(avm, {}, PROG, COMPLETE_VAR, instruction)
    try:
        code = avm.main(args=argv, prog_name=PROG, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # `avm keys`: what it offers
        exc.show()
        return 2
    except click.UsageError as exc:
        print(one_line(exc), file=sys.stderr)
        return 2
    except click.Abort:
        return 130
    except click.ClickException as exc:
        print(f"{PROG}: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
