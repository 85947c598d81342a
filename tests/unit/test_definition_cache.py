"""DefinitionCache (hosting/definition_cache.py): when a cached image and agent may be used."""

from __future__ import annotations

from agentvm.domain.models import Agent, Image
from agentvm.hosting.definition_cache import DefinitionCache


def image(iid: str = "i1") -> Image:
    return Image("t", iid, "c", "s", "name", 0, 0)


AGENT = Agent("t", "a1", "i1", "c", "name", 0)


def test_an_entry_is_good_for_its_counter_its_image_and_the_ttl() -> None:
    now = [0.0]
    cache = DefinitionCache(60, clock=lambda: now[0])
    cache.put("t", "s1", 3, image(), AGENT)
    assert cache.get("t", "s1", "i1", 3) == (image(), AGENT)
    assert cache.get("t", "s2", "i1", 3) is None  # per session
    now[0] = 60.0
    assert cache.get("t", "s1", "i1", 3) is not None  # the bound itself
    assert cache.get("t", "s1", "i1", 4) is None  # the counter moved: the entry is dropped
    assert len(cache) == 0
    cache.put("t", "s1", 3, image(), AGENT)
    assert cache.get("t", "s1", "i2", 3) is None  # the session names another image
    cache.put("t", "s1", 3, image(), AGENT)
    now[0] = 120.001
    assert cache.get("t", "s1", "i1", 3) is None  # older than the TTL
    assert (cache.hits, cache.misses) == (2, 4)


def test_no_agent_or_no_ttl_keeps_nothing_and_forget_drops() -> None:
    cache = DefinitionCache(60)
    cache.put("t", "s1", 0, image(), AGENT)
    cache.put("t", "s1", 0, image(), None)  # the agent is gone: the old entry goes too
    assert cache.get("t", "s1", "i1", 0) is None
    cache.put("t", "s1", 0, image(), AGENT)
    cache.forget("t", "s1")
    assert len(cache) == 0
    off = DefinitionCache(0)
    off.put("t", "s1", 0, image(), AGENT)
    assert len(off) == 0


def test_the_least_recently_used_session_goes_first() -> None:
    cache = DefinitionCache(60, max_entries=2)
    for sid in ("s1", "s2"):
        cache.put("t", sid, 0, image(), AGENT)
    assert cache.get("t", "s1", "i1", 0) is not None  # s1 used: s2 is now the oldest
    cache.put("t", "s3", 0, image(), AGENT)
    assert [cache.get("t", sid, "i1", 0) is not None for sid in ("s1", "s2", "s3")] == [True, False, True]
