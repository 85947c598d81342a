"""Embedded adapters for `avm serve`: SQLite, files, in-process gateway."""
