"""A cloud runner's cached image and agent (hosting/definition_cache.py) on moto: a warm runner's
next turn of a session reads neither again; a destroyed agent, a deleted image and the TTL each make
the next turn see what is stored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import Agent, Image, LeaseHandoff, Principal, Session, Turn, TurnStatus
from agentvm.drivers.scripted import ScriptedDriver
from agentvm.hosting.definition_cache import DefinitionCache
from agentvm.hosting.leased_host import LeasedSessions
from agentvm.ids import agent_id, image_id, session_id

TENANT = "t-defs"


class NoDispatch:
    """The test runs the session itself, with the lease `send` handed on (kept per session)."""

    handoffs: ClassVar[dict[str, LeaseHandoff | None]] = {}

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        if handoff is not None:  # a message queued behind it dispatches without one
            self.handoffs[session_id] = handoff


class Counted:
    """Counts the store's reads of images and agents (a runner reads both with one request)."""

    def __init__(self, rt: cloud_runtime.CloudRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        store = rt.store
        originals = {name: getattr(store, name) for name in ("get_image", "get_agent_for_image",
                                                             "get_image_and_agent")}

        def counting(name: str) -> Any:
            async def read(*args: Any) -> Any:
                self.reads += 1 if name == "get_image_and_agent" else 100  # the separate reads: not expected
                return await originals[name](*args)
            return read

        for name in originals:
            monkeypatch.setattr(store, name, counting(name))

    def take(self) -> int:
        out, self.reads = self.reads, 0
        return out


@pytest.fixture
def rt(cloud: cloud_runtime.CloudRuntime) -> Iterator[cloud_runtime.CloudRuntime]:
    cloud._driver = ScriptedDriver()
    yield cloud


def setup_image(rt: cloud_runtime.CloudRuntime) -> tuple[Image, Agent]:
    iid, sid, cid = image_id(), session_id(), "c-" + image_id()
    image = Image(TENANT, iid, cid, sid, "first name", 1, 1, system_prompt="be brief")
    cloud_runtime.run(rt.store.create_image(image, Session(TENANT, sid, iid, cid, 1, 1)))
    agent = cloud_runtime.run(rt.store.put_agent(Agent(TENANT, agent_id(), iid, cid, image.name, 1)))
    return image, agent


def send(rt: cloud_runtime.CloudRuntime, image: Image, agent: Agent, text: str) -> Turn:
    inv = rt.invocation(TENANT, role="ws_default")
    sessions = LeasedSessions(inv.deps, fanout=inv.fanout, leases=rt.leases, dispatcher=NoDispatch(),
                              owner=inv.owner)
    try:
        return cloud_runtime.run(sessions.send(Principal(TENANT), None, image, agent.agent_id, text))
    finally:
        cloud_runtime.run(inv.fanout.close())


def run_turns(rt: cloud_runtime.CloudRuntime, image: Image) -> list[Turn]:
    handoff = NoDispatch.handoffs.pop(image.session_id, None)
    return cloud_runtime.run(rt.run_session(TENANT, image.session_id, role="chat_turn", handoff=handoff))


def stored_turn(rt: cloud_runtime.CloudRuntime, image: Image, turn: Turn) -> Turn:
    [found] = cloud_runtime.run(rt.leases.get_turns(TENANT, image.session_id, {turn.turn_id}))
    return found


def test_a_warm_runner_reads_the_image_and_agent_once_per_session(rt: cloud_runtime.CloudRuntime,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted(rt, monkeypatch)
    image, agent = setup_image(rt)
    for n in range(3):
        send(rt, image, agent, f"hello {n}")
        [ran] = run_turns(rt, image)
        assert ran.status == TurnStatus.COMPLETED
        assert counted.take() == (1 if n == 0 else 0)
    assert isinstance(rt.definitions, DefinitionCache)
    assert (rt.definitions.hits, rt.definitions.misses) == (2, 1)


def test_a_destroyed_agent_runs_no_queued_turn_although_it_was_cached(rt: cloud_runtime.CloudRuntime,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    image, agent = setup_image(rt)
    send(rt, image, agent, "hello")
    run_turns(rt, image)  # the agent is cached now
    queued = send(rt, image, agent, "are you there?")
    # what AgentService.destroy does first: delete the record, then expire the sessions' caches
    assert cloud_runtime.run(rt.store.delete_agent(TENANT, agent.agent_id))
    cloud_runtime.run(rt.leases.bump_definitions(TENANT, image.session_id))
    counted = Counted(rt, monkeypatch)
    assert run_turns(rt, image) == []
    assert counted.take() == 1  # read again: the counter moved
    dropped = stored_turn(rt, image, queued)
    assert (dropped.status, dropped.error_code) == (TurnStatus.INTERRUPTED, "agent_stopped")


def test_without_the_counter_bump_the_cached_agent_would_run_it(rt: cloud_runtime.CloudRuntime) -> None:
    """The counter is what makes the previous test pass (this one shows the cache is really used)."""
    image, agent = setup_image(rt)
    send(rt, image, agent, "hello")
    run_turns(rt, image)
    send(rt, image, agent, "are you there?")
    assert cloud_runtime.run(rt.store.delete_agent(TENANT, agent.agent_id))
    [ran] = run_turns(rt, image)
    assert ran.status == TurnStatus.COMPLETED


def test_a_deleted_image_serves_no_turn_whatever_is_cached(rt: cloud_runtime.CloudRuntime,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    image, agent = setup_image(rt)
    send(rt, image, agent, "hello")
    run_turns(rt, image)
    send(rt, image, agent, "still there?")
    assert cloud_runtime.run(rt.store.delete_image(TENANT, image.image_id))
    counted = Counted(rt, monkeypatch)
    assert run_turns(rt, image) == []  # the session item went with the image: no lease, no turn
    assert counted.take() == 0


def test_an_image_edit_reaches_the_first_turn_after_the_ttl(rt: cloud_runtime.CloudRuntime,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    cache = DefinitionCache(rt.settings.definition_cache_s, clock=lambda: now[0])
    monkeypatch.setattr(rt, "definitions", cache)
    image, agent = setup_image(rt)
    send(rt, image, agent, "hello")
    run_turns(rt, image)
    cloud_runtime.run(rt.store.update_image(TENANT, image.image_id, name="second name", description="edited",
                                            updated_at=2))
    counted = Counted(rt, monkeypatch)
    now[0] += rt.settings.definition_cache_s  # the bound itself: still the cached copy
    send(rt, image, agent, "one")
    run_turns(rt, image)
    assert counted.take() == 0
    now[0] += 0.001  # past the bound: read again
    send(rt, image, agent, "two")
    run_turns(rt, image)
    assert counted.take() == 1
    entry = cache.get(TENANT, image.session_id, image.image_id, 0)
    assert entry is not None and (entry[0].name, entry[0].description) == ("second name", "edited")


def test_definition_cache_s_zero_reads_both_for_every_turn(cloud: cloud_runtime.CloudRuntime,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cloud.settings, "definition_cache_s", 0)
    cloud.__dict__.pop("definitions", None)
    cloud._driver = ScriptedDriver()
    counted = Counted(cloud, monkeypatch)
    image, agent = setup_image(cloud)
    for _ in range(2):
        send(cloud, image, agent, "hello")
        run_turns(cloud, image)
        assert counted.take() == 1
    assert cloud.definitions is None
