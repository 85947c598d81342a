"""Tools the model can call: the built-in ones on a container's workspace (MCP servers come next)."""
