"""AgentVM: a low-cost runtime hosting AI agents behind the AgentX WebSocket protocol."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("agentvm")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

__all__ = ["__version__"]
