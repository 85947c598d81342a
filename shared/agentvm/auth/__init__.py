"""Authentication: API keys (tokens, their salted hashes, and the authenticator the routes call)."""
