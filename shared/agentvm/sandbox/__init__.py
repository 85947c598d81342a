"""The Sandbox layer: a container's Workspace (its files) and the Runtime its tools run on."""

from agentvm.sandbox.limits import Limits, ProcessResult
from agentvm.sandbox.runtime import SAFE_PATH, Runtime, tool_env
from agentvm.sandbox.workspace import Workspace

__all__ = ["SAFE_PATH", "Limits", "ProcessResult", "Runtime", "Workspace", "tool_env"]
