"""Identifier generation in one place, with readable prefixes.

Server ids follow the reference format `<prefix>_<epoch-ms base36>_<random base36>`; message ids use
decimal milliseconds like the reference (`msg_<ms>_<7 base36>`).
"""

from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int) -> str:
    if n == 0:
        return "0"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(_ALPHABET[r])
    return "".join(reversed(out))


def _rand(k: int) -> str:
    # One system call for the whole suffix (secrets.choice makes one per character).
    return "".join(_ALPHABET[b % 36] for b in secrets.token_bytes(k))


# The last millisecond an ISO 8601 date can name (9999-12-31T23:59:59.999Z): the bound of an epoch-ms
# time a client passes (beyond 2^63 it would not even fit the stores' integers).
MAX_EPOCH_MS = 253_402_300_799_999


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _new(prefix: str, rand_len: int = 8) -> str:
    return f"{prefix}_{_base36(now_ms())}_{_rand(rand_len)}"


def image_id() -> str:
    return _new("img")


def session_id() -> str:
    return _new("sess")


def agent_id() -> str:
    return _new("agent")


def turn_id() -> str:
    return _new("turn")


def call_id() -> str:
    """A token API call (its usage record is `<call id>#llm#1`)."""
    return _new("call")


def connection_id() -> str:
    return _new("conn")


def message_id() -> str:
    return f"msg_{now_ms()}_{_rand(10)}"


def resource_id() -> str:
    return _new("res")


def lease_owner(role: str, request_id: str) -> str:
    """A lease owner: the holder's role and its invocation's id (a Lambda request id names the
    leases of that invocation, so its failure record names them too: hosting/turn_failure.py)."""
    return f"{role}:{request_id}"
