"""The AgentX wire model: envelope, commands, events and message objects (pydantic)."""
