"""API keys: minting, parsing, verifying, and authenticating a request's token.

A token is `<key_id>.<secret>`, shown to the user once. `key_id` (`avmk_` + 12 hex chars) is the
public half: it names the key record, so a lookup is one GetItem and never a scan over hashes. Only
a salted hash of the secret is stored.

The hash is a single HMAC-SHA256 keyed with a per-key random salt, not a slow password hash
(bcrypt, scrypt, argon2): the secret is 256 bits from `secrets`, so brute force is hopeless however
fast the hash is, and a slow hash would only add tens of milliseconds to every `$connect`. This is
how GitHub and Stripe treat their tokens too. The salt still makes two leaked tables incomparable.

Failures never say which part of a token was wrong: a malformed token, an unknown key and a wrong
secret all read "API key not valid". Revocation and expiry are reported only to a caller that proved
it holds the secret, so a key id alone reveals nothing, not even that the key exists.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from agentvm.domain.models import ApiKey, Principal
from agentvm.errors import Forbidden, InvalidRequest, Unauthorized

if TYPE_CHECKING:
    from agentvm.ports import KeyStore

log = logging.getLogger(__name__)

KEY_ID_PREFIX: Final = "avmk_"
# user: the tenant's data; admin: also its keys and budgets; operator: the deployment itself (its
# configuration, /metrics), made only by whoever runs the deployment (`avm keys create --scope operator`)
SCOPES: Final = frozenset({"admin", "user", "operator"})
OPERATOR_ONLY = "This needs an operator key: the configuration belongs to the deployment, not to a tenant"


def require_operator(key: ApiKey) -> None:
    if "operator" not in key.scopes:
        raise Forbidden(OPERATOR_ONLY)
MAX_TOKEN_LENGTH: Final = 256
MAX_NAME_LENGTH: Final = 200

# a WebSocket upgrade takes either; HTTP reads the header only (`http_token`)
MISSING_TOKEN: Final = "API key required: send `Authorization: Bearer <key>` or `?token=<key>`"
MISSING_HTTP_TOKEN: Final = "API key required: send the header `Authorization: Bearer <key>`"
INVALID_TOKEN: Final = "API key not valid"
REVOKED: Final = "API key revoked"
EXPIRED: Final = "API key expired"

_KEY_ID = re.compile(r"avmk_[0-9a-f]{12}")
_SECRET = re.compile(r"[A-Za-z0-9_-]+")  # the alphabet of secrets.token_urlsafe


def new_key(tenant_id: str, scopes: Sequence[str] = ("user",), *, name: str | None = None,
            expires_at: int | None = None, now_ms: int | None = None) -> tuple[ApiKey, str]:
    """Mint a key: the record to store (salted hash only) and the token to show the user once."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if not tenant_id:
        raise InvalidRequest("tenant_id must not be empty", field="tenant_id")
    if isinstance(scopes, str):  # a bare "user" would otherwise be read as the scopes u, s, e, r
        raise InvalidRequest("scopes must be a list of scope names", field="scopes")
    unknown = sorted(set(scopes) - SCOPES)
    if unknown or not scopes:
        raise InvalidRequest(f"scopes must be a non-empty subset of {sorted(SCOPES)}; got {sorted(set(scopes))}",
                             field="scopes")
    if expires_at is not None and expires_at <= now:
        raise InvalidRequest("expires_at must be in the future", field="expires_at")
    if name is not None and len(name) > MAX_NAME_LENGTH:
        raise InvalidRequest(f"name must be at most {MAX_NAME_LENGTH} characters", field="name")
    key_id = KEY_ID_PREFIX + secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    key = ApiKey(key_id=key_id, tenant_id=tenant_id, salt=salt, secret_hash=_hash(salt, secret),
                 scopes=tuple(sorted(set(scopes))), created_at=now, expires_at=expires_at, name=name)
    return key, f"{key_id}.{secret}"


def parse_token(token: str) -> tuple[str, str] | None:
    """Split a token into (key_id, secret); None for anything malformed. Never raises."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        return None
    key_id, dot, secret = token.partition(".")
    if not dot or _KEY_ID.fullmatch(key_id) is None or _SECRET.fullmatch(secret) is None:
        return None
    return key_id, secret


def verify(key: ApiKey, secret: str, now_ms: int) -> bool:
    """True when the secret matches and the key is neither revoked nor expired.

    The hash comparison runs in full whatever the key's state, so timing does not tell a revoked
    key from a wrong secret.
    """
    matches = _secret_matches(key, secret)
    return matches and not key.revoked and not key.expired(now_ms)


def extract_token(headers: Mapping[str, str] | None, query: Mapping[str, str] | None) -> str | None:
    """The token of a request: `Authorization: Bearer <t>` (any header case) first, else `?token=`."""
    for name, value in (headers or {}).items():
        if name.lower() != "authorization" or not isinstance(value, str):
            continue
        parts = value.split(None, 1)
        if len(parts) == 2 and parts[0].lower() == "bearer" and parts[1].strip():
            return parts[1].strip()
    param = (query or {}).get("token")
    if isinstance(param, str) and param.strip():
        return param.strip()
    return None


def http_token(headers: Mapping[str, str]) -> str:
    """The token of an HTTP request, from `Authorization: Bearer` only (a key in a URL ends up in
    access logs): `Unauthorized` without one."""
    token = extract_token(headers, None)
    if token is None:
        raise Unauthorized(MISSING_HTTP_TOKEN)
    return token


class Authenticator:
    """Turns a request's token into a `Principal`, or raises `Unauthorized`.

    Key records are cached for `cache_s` (a warm Lambda serves many `$connect`s from one lookup), so
    a revocation takes effect in other processes within `cache_s`; `invalidate` drops a record at
    once in this one. A cached record still has its secret, revocation and expiry checked on every
    call. Only found records are cached, so unknown ids cannot fill the cache.
    """

    def __init__(self, keys: KeyStore, *, cache_s: float = 60.0, clock: Callable[[], float] = time.time,
                 max_cached: int = 1024) -> None:
        self._keys = keys
        self._cache_s = cache_s
        self._clock = clock
        self._max_cached = max_cached
        self._cache: OrderedDict[str, tuple[ApiKey, float]] = OrderedDict()

    async def authenticate(self, token: str | None) -> Principal:
        key = await self.authenticate_key(token)
        return Principal(key.tenant_id, key.key_id)

    async def authenticate_key(self, token: str | None) -> ApiKey:
        """Like `authenticate`, but the whole key record (its scopes, name, ...)."""
        if token is None or not token.strip():
            raise Unauthorized(MISSING_TOKEN)
        parsed = parse_token(token.strip())
        if parsed is None:
            log.info("api key rejected", extra={"reason": "malformed"})
            raise Unauthorized(INVALID_TOKEN)
        key_id, secret = parsed
        key = await self._lookup(key_id)
        if key is None:
            _secret_matches(_DUMMY, secret)  # same work as for a known key: timing does not reveal existence
            log.info("api key rejected", extra={"key_id": key_id, "reason": "unknown"})
            raise Unauthorized(INVALID_TOKEN)
        if not _secret_matches(key, secret):
            log.info("api key rejected", extra={"key_id": key_id, "reason": "wrong_secret"})
            raise Unauthorized(INVALID_TOKEN)
        if key.revoked:
            log.info("api key rejected", extra={"key_id": key_id, "reason": "revoked"})
            raise Unauthorized(REVOKED)
        if key.expired(int(self._clock() * 1000)):
            log.info("api key rejected", extra={"key_id": key_id, "reason": "expired"})
            raise Unauthorized(EXPIRED)
        return key

    def invalidate(self, key_id: str) -> None:
        """Forget a cached record (after this process revoked or changed the key)."""
        self._cache.pop(key_id, None)

    async def _lookup(self, key_id: str) -> ApiKey | None:
        now = self._clock()
        cached = self._cache.get(key_id)
        if cached is not None and now - cached[1] < self._cache_s:
            return cached[0]
        key = await self._keys.get_key(key_id)
        if key is None or key.key_id != key_id:
            self._cache.pop(key_id, None)
            return None
        self._cache[key_id] = (key, now)
        self._cache.move_to_end(key_id)
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)
        return key


def _hash(salt: str, secret: str) -> str:
    return hmac.new(salt.encode(), secret.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def _secret_matches(key: ApiKey, secret: str) -> bool:
    expected = key.secret_hash.encode("utf-8", "surrogatepass")
    return hmac.compare_digest(_hash(key.salt, secret).encode(), expected)


# Hashed against when the key id is unknown; no secret matches it (its hash is not a hex digest).
_DUMMY: Final = ApiKey(key_id=KEY_ID_PREFIX + "0" * 12, tenant_id="", salt="0" * 32, secret_hash="-" * 64,
                       scopes=(), created_at=0)
