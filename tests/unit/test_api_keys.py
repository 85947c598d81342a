"""API keys: token format, parsing, verification, the Authenticator and token extraction."""

from __future__ import annotations

import dataclasses
import hmac
import logging
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentvm.auth.api_keys import (
    EXPIRED,
    INVALID_TOKEN,
    MISSING_TOKEN,
    REVOKED,
    ApiKey,
    Authenticator,
    extract_token,
    new_key,
    parse_token,
    verify,
)
from agentvm.domain.models import Principal
from agentvm.errors import InvalidRequest, Unauthorized

NOW = 1_700_000_000_000
TOKEN_RE = re.compile(r"avmk_[0-9a-f]{12}\.[A-Za-z0-9_-]{43}")


class FakeKeys:
    """An in-memory KeyStore that counts lookups."""

    def __init__(self) -> None:
        self.keys: dict[str, ApiKey] = {}
        self.lookups: list[str] = []

    async def put_key(self, key: ApiKey) -> None:
        self.keys[key.key_id] = key

    async def get_key(self, key_id: str) -> ApiKey | None:
        self.lookups.append(key_id)
        return self.keys.get(key_id)

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        return sorted((k for k in self.keys.values() if k.tenant_id == tenant_id), key=lambda k: -k.created_at)

    async def revoke_key(self, tenant_id: str, key_id: str, at_ms: int) -> bool:
        key = self.keys.get(key_id)
        if key is None or key.tenant_id != tenant_id:
            return False
        self.keys[key_id] = dataclasses.replace(key, revoked_at=key.revoked_at or at_ms)
        return True


class Clock:
    def __init__(self, now_s: float = NOW / 1000) -> None:
        self.now = now_s

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def keys() -> FakeKeys:
    return FakeKeys()


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def _stored(keys: FakeKeys, tenant: str = "t1", **kwargs: Any) -> tuple[ApiKey, str]:
    key, token = new_key(tenant, now_ms=NOW, **kwargs)
    await keys.put_key(key)
    return key, token


async def _reject(auth: Authenticator, token: str | None) -> str:
    with pytest.raises(Unauthorized) as info:
        await auth.authenticate(token)
    assert info.value.code == "unauthorized"
    assert info.value.http_status == 401
    return info.value.message


# ---- minting ---------------------------------------------------------------------------------


def test_new_key_token_format_and_record() -> None:
    key, token = new_key("t1", ("user", "admin", "user"), name="ci", expires_at=NOW + 1000, now_ms=NOW)
    assert TOKEN_RE.fullmatch(token), token
    key_id, secret = token.split(".")
    assert key.key_id == key_id
    assert key.tenant_id == "t1"
    assert key.scopes == ("admin", "user")
    assert (key.created_at, key.expires_at, key.revoked_at, key.name) == (NOW, NOW + 1000, None, "ci")
    # Only a salted hash is stored: the secret appears in no field.
    assert all(secret not in str(value) for value in dataclasses.astuple(key))
    assert re.fullmatch(r"[0-9a-f]{64}", key.secret_hash)
    assert re.fullmatch(r"[0-9a-f]{32}", key.salt)
    assert verify(key, secret, NOW)


def test_new_keys_are_unique_and_salted() -> None:
    minted = [new_key("t1", now_ms=NOW) for _ in range(50)]
    assert len({k.key_id for k, _ in minted}) == 50
    assert len({k.salt for k, _ in minted}) == 50
    assert len({t for _, t in minted}) == 50
    assert all(k.scopes == ("user",) for k, _ in minted)


def test_same_secret_hashes_differently_under_another_salt() -> None:
    key, token = new_key("t1", now_ms=NOW)
    _, secret = token.split(".")
    other, _ = new_key("t1", now_ms=NOW)
    assert not verify(dataclasses.replace(key, salt=other.salt), secret, NOW)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"scopes": ("root",)}, "scopes"),
    ({"scopes": ("user", "superuser")}, "scopes"),
    ({"scopes": ()}, "scopes"),
    ({"scopes": "user"}, "scopes"),
    ({"expires_at": NOW}, "expires_at"),
    ({"name": "x" * 201}, "name"),
])
def test_new_key_refuses_bad_input(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        new_key("t1", now_ms=NOW, **kwargs)
    assert info.value.field == field


def test_new_key_refuses_an_empty_tenant() -> None:
    with pytest.raises(InvalidRequest) as info:
        new_key("", now_ms=NOW)
    assert info.value.field == "tenant_id"


# ---- parsing ---------------------------------------------------------------------------------


def test_parse_token_splits_a_minted_token() -> None:
    key, token = new_key("t1", now_ms=NOW)
    assert parse_token(token) == (key.key_id, token.split(".")[1])


@pytest.mark.parametrize("token", [
    "",
    ".",
    "avmk_0123456789ab",  # no dot
    "avmk_0123456789ab.",  # empty secret
    ".secret",
    "avmk_0123.secret",  # id too short
    "avmk_0123456789abc.secret",  # id too long
    "avmk_0123456789AB.secret",  # uppercase id
    "xxxx_0123456789ab.secret",  # wrong prefix
    "0123456789ab.secret",
    "avmk_0123456789ab.sec.ret",  # a second dot
    "avmk_0123456789ab.sec ret",
    " avmk_0123456789ab.secret",
    "avmk_0123456789ab.secret\n",
    "avmk_0123456789ab.sécret",  # non-ascii
    "avmk_0123456789ab." + "a" * 300,  # too long
])
def test_parse_token_rejects_malformed(token: str) -> None:
    assert parse_token(token) is None


def test_parse_token_length_limit_is_inclusive() -> None:
    head = "avmk_0123456789ab."
    assert parse_token(head + "a" * (256 - len(head))) is not None
    assert parse_token(head + "a" * (257 - len(head))) is None


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="avmk_0123456789abcdef.-XYZé \x00"),
                 st.builds(lambda s: "avmk_0123456789ab." + s, st.text())))
def test_parse_token_never_raises(token: str) -> None:
    parsed = parse_token(token)
    if parsed is not None:
        key_id, secret = parsed
        assert f"{key_id}.{secret}" == token
        assert re.fullmatch(r"avmk_[0-9a-f]{12}", key_id)
        assert re.fullmatch(r"[A-Za-z0-9_-]+", secret)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789abcdef", min_size=12, max_size=12),
       st.text(alphabet="ABCxyz019_-", min_size=1, max_size=200))
def test_parse_token_accepts_well_formed(hex_id: str, secret: str) -> None:
    assert parse_token(f"avmk_{hex_id}.{secret}") == (f"avmk_{hex_id}", secret)


# ---- verification ----------------------------------------------------------------------------


def test_verify_checks_secret_revocation_and_expiry() -> None:
    key, token = new_key("t1", expires_at=NOW + 100, now_ms=NOW)
    secret = token.split(".")[1]
    assert verify(key, secret, NOW)
    assert verify(key, secret, NOW + 99)
    assert not verify(key, secret, NOW + 100)  # expiry is exclusive
    assert not verify(key, secret[:-1], NOW)
    assert not verify(key, secret + "x", NOW)
    assert not verify(key, "", NOW)
    assert not verify(key, "\ud800", NOW)  # a lone surrogate does not raise
    assert not verify(dataclasses.replace(key, revoked_at=NOW), secret, NOW)


def test_verify_always_compares_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # api_keys calls it through the module
    key, token = new_key("t1", expires_at=NOW + 1, now_ms=NOW)
    secret = token.split(".")[1]
    assert verify(key, secret, NOW)
    # Revoked or expired keys still go through the full comparison: state does not shortcut timing.
    assert not verify(dataclasses.replace(key, revoked_at=NOW), secret, NOW)
    assert not verify(key, secret, NOW + 5)
    assert not verify(key, "wrong", NOW)
    assert len(calls) == 4
    assert all(len(a) == len(b) == 64 for a, b in calls)


# ---- the authenticator -----------------------------------------------------------------------


async def test_authenticate_returns_the_principal(keys: FakeKeys, clock: Clock) -> None:
    key, token = await _stored(keys, "tenant-a")
    auth = Authenticator(keys, clock=clock)
    assert await auth.authenticate(token) == Principal("tenant-a", key.key_id)
    assert await auth.authenticate(f"  {token} ") == Principal("tenant-a", key.key_id)
    assert (await auth.authenticate_key(token)).scopes == ("user",)


@pytest.mark.parametrize("token", [None, "", "   "])
async def test_missing_token(keys: FakeKeys, clock: Clock, token: str | None) -> None:
    assert await _reject(Authenticator(keys, clock=clock), token) == MISSING_TOKEN
    assert "Authorization: Bearer" in MISSING_TOKEN and "?token=" in MISSING_TOKEN


async def test_malformed_unknown_and_wrong_secret_look_identical(keys: FakeKeys, clock: Clock) -> None:
    key, token = await _stored(keys)
    auth = Authenticator(keys, clock=clock)
    unknown, _ = new_key("t1", now_ms=NOW)
    candidates = ["garbage", "avmk_0123456789ab", f"{unknown.key_id}.{token.split('.')[1]}",
                  f"{key.key_id}.wrongsecret", token[:-1]]
    for bad in candidates:
        message = await _reject(auth, bad)
        assert message == INVALID_TOKEN
        assert bad not in message
    # A malformed token never reaches the store.
    assert keys.lookups == [unknown.key_id, key.key_id]


async def test_revoked_and_expired_are_told_only_to_the_secret_holder(keys: FakeKeys, clock: Clock) -> None:
    revoked, revoked_token = await _stored(keys)
    await keys.revoke_key("t1", revoked.key_id, NOW)
    expiring, expiring_token = await _stored(keys, expires_at=NOW + 10_000)
    auth = Authenticator(keys, clock=clock)

    assert await _reject(auth, revoked_token) == REVOKED
    assert await _reject(auth, f"{revoked.key_id}.nottheirsecret") == INVALID_TOKEN

    assert await auth.authenticate(expiring_token) == Principal("t1", expiring.key_id)
    clock.now += 10.0
    assert await _reject(auth, expiring_token) == EXPIRED
    assert await _reject(auth, f"{expiring.key_id}.nottheirsecret") == INVALID_TOKEN


async def test_rejections_never_log_the_token(keys: FakeKeys, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    key, token = await _stored(keys)
    secret = token.split(".")[1]
    auth = Authenticator(keys, clock=clock)
    caplog.set_level(logging.DEBUG, logger="agentvm.auth")
    for bad in (f"{key.key_id}.{secret}x", f"avmk_ffffffffffff.{secret}", f"{secret}.{secret}"):
        await _reject(auth, bad)
    await keys.revoke_key("t1", key.key_id, NOW)
    auth.invalidate(key.key_id)
    await _reject(auth, token)
    assert len(caplog.records) == 4
    reasons = [getattr(r, "reason", None) for r in caplog.records]
    assert reasons == ["wrong_secret", "unknown", "malformed", "revoked"]
    for record in caplog.records:
        dumped = record.getMessage() + repr(vars(record))
        assert secret not in dumped


async def test_cache_reuses_the_record_but_rechecks_secret_and_expiry(keys: FakeKeys, clock: Clock) -> None:
    key, token = await _stored(keys, expires_at=NOW + 30_000)
    auth = Authenticator(keys, cache_s=60.0, clock=clock)
    for _ in range(3):
        assert await auth.authenticate(token) == Principal("t1", key.key_id)
    assert keys.lookups == [key.key_id]

    assert await _reject(auth, f"{key.key_id}.wrong") == INVALID_TOKEN  # cached record, secret still checked
    clock.now += 30.0
    assert await _reject(auth, token) == EXPIRED  # cached record, expiry still checked
    assert keys.lookups == [key.key_id]


async def test_cache_expires_after_cache_s(keys: FakeKeys, clock: Clock) -> None:
    key, token = await _stored(keys)
    auth = Authenticator(keys, cache_s=60.0, clock=clock)
    await auth.authenticate(token)
    await keys.revoke_key("t1", key.key_id, NOW)
    clock.now += 59.9
    assert await auth.authenticate(token) == Principal("t1", key.key_id)  # revocation not seen yet
    assert len(keys.lookups) == 1
    clock.now += 0.1
    assert await _reject(auth, token) == REVOKED
    assert len(keys.lookups) == 2


async def test_invalidate_drops_the_cached_record(keys: FakeKeys, clock: Clock) -> None:
    key, token = await _stored(keys)
    auth = Authenticator(keys, clock=clock)
    await auth.authenticate(token)
    await keys.revoke_key("t1", key.key_id, NOW)
    auth.invalidate(key.key_id)
    auth.invalidate("avmk_ffffffffffff")  # unknown ids are fine
    assert await _reject(auth, token) == REVOKED


async def test_unknown_keys_are_not_cached(keys: FakeKeys, clock: Clock) -> None:
    auth = Authenticator(keys, clock=clock)
    key, token = new_key("t1", now_ms=NOW)
    assert await _reject(auth, token) == INVALID_TOKEN
    await keys.put_key(key)  # created afterwards: found at once, no negative cache
    assert await auth.authenticate(token) == Principal("t1", key.key_id)
    assert keys.lookups == [key.key_id, key.key_id]


async def test_cache_is_bounded(keys: FakeKeys, clock: Clock) -> None:
    auth = Authenticator(keys, clock=clock, max_cached=2)
    stored = [await _stored(keys) for _ in range(3)]
    for _, token in stored:
        await auth.authenticate(token)
    await auth.authenticate(stored[2][1])
    await auth.authenticate(stored[1][1])
    assert len(keys.lookups) == 3
    await auth.authenticate(stored[0][1])  # the least recently stored entry was evicted
    assert len(keys.lookups) == 4


# ---- extracting the token --------------------------------------------------------------------


@pytest.mark.parametrize(("headers", "query", "expected"), [
    ({"Authorization": "Bearer abc"}, None, "abc"),
    ({"authorization": "bearer   abc  "}, None, "abc"),
    ({"AUTHORIZATION": "BEARER abc"}, {}, "abc"),
    ({"Authorization": "\tBearer\tabc\t"}, None, "abc"),
    ({"Authorization": "Bearer abc"}, {"token": "fromquery"}, "abc"),  # the header wins
    ({"Authorization": "Basic dXNlcjpwdw=="}, {"token": "q"}, "q"),
    ({"Authorization": "Bearer"}, {"token": "q"}, "q"),
    ({"Authorization": "Bearer   "}, None, None),
    ({"X-Other": "Bearer abc"}, None, None),
    (None, {"token": " q "}, "q"),
    (None, {"token": ""}, None),
    (None, {"token": "   "}, None),
    (None, {"tok": "q"}, None),
    ({}, {}, None),
    (None, None, None),
])
def test_extract_token(headers: dict[str, str] | None, query: dict[str, str] | None, expected: str | None) -> None:
    assert extract_token(headers, query) == expected


async def test_extracted_token_authenticates(keys: FakeKeys, clock: Clock) -> None:
    key, token = await _stored(keys)
    auth = Authenticator(keys, clock=clock)
    for headers, query in (({"authorization": f"Bearer {token}"}, None), (None, {"token": token})):
        assert await auth.authenticate(extract_token(headers, query)) == Principal("t1", key.key_id)
