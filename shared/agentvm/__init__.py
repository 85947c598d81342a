"""AgentVM: a low-cost runtime hosting AI agents behind the AgentX WebSocket protocol."""

# A literal, not importlib.metadata: reading package metadata costs ~36 ms of Lambda cold start.
# pyproject.toml takes the version from here.
__version__ = "0.1.0"

__all__ = ["__version__"]
