"""Transports: the AgentX WebSocket command router and the FastAPI app (HTTP)."""
