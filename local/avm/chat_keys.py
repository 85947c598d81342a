"""The keys of `avm chat` as its help states them, and where its history is kept. Kept apart from the
terminal modules so that `avm --help` and the other subcommands do not load prompt_toolkit or rich."""

from __future__ import annotations

import os
from pathlib import Path

MULTILINE_HELP = "Alt-Enter (or Esc Enter), or a trailing \\ then Enter, starts a new line"
KEYS_HELP = f"Ctrl-C interrupts a reply (at the prompt: clears the line); {MULTILINE_HELP}."


def default_history_path() -> Path:
    """$XDG_DATA_HOME/agentvm/chat-history (by default ~/.local/share/agentvm/chat-history)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "agentvm" / "chat-history"
