"""LLM drivers: scripted (offline), anthropic (official SDK)."""
