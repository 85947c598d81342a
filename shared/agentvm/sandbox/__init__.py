"""The Sandbox layer: a container's Workspace (its files) and the Runtime its tools run on."""

from agentvm.sandbox.runtime import SAFE_PATH, Runtime, tool_env
from agentvm.sandbox.workspace import Workspace

__all__ = ["SAFE_PATH", "Runtime", "Workspace", "tool_env"]
