"""Test support: a stock-like AgentX client and server runners."""
