"""The command router answers every malformed frame without dying (property-based)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.api.ws_hub import Connection, LocalHub
from agentvm.api.ws_router import CommandRouter
from agentvm.domain.models import Principal
from agentvm.drivers.scripted import ScriptedDriver
from agentvm.engine.runner import EngineOptions
from agentvm.hosting.local_host import SessionRegistry
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.protocol.commands import COMMANDS
from agentvm.services.use_cases import UseCases

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_values = st.recursive(scalars,
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                           max_leaves=12)
field_names = st.sampled_from(["containerId", "imageId", "agentId", "content", "config", "updates", "requestId",
                               "sessionId", "x"])
request_frames = st.builds(
    lambda name, data, rid: {"type": f"{name}_request", "data": {**data, **({"requestId": rid} if rid else {})}},
    st.sampled_from([*COMMANDS, "nope"]), st.dictionaries(field_names, json_values, max_size=5),
    st.one_of(st.none(), st.text(min_size=1, max_size=8)))


def run(coro: Any) -> Any:
    return asyncio.new_event_loop().run_until_complete(coro)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(request_frames, min_size=1, max_size=6))
def test_every_request_with_a_request_id_gets_exactly_one_response(tmp_path: Path,
                                                                   frames: list[dict[str, Any]]) -> None:
    async def scenario() -> None:
        store = SqliteStore(":memory:")
        await store.open()
        hub = LocalHub()
        deps = RuntimePorts(store=store, fanout=hub, driver=ScriptedDriver(),
                            options=EngineOptions(default_model="scripted", max_tokens=100))
        services = UseCases(deps, SessionRegistry(deps))
        router = CommandRouter(services, hub)
        conn = Connection("conn_t", "local", max_queue=10_000, wrap=False)
        hub.register(conn)
        p = Principal("local")
        for frame in frames:
            await router.handle_frame(p, conn.id, json.dumps(frame))
        await asyncio.sleep(0)
        await services.sessions.shutdown()
        await store.close()
        sent = [json.loads(f) for f in conn.queue]
        for frame in frames:
            rid = frame["data"].get("requestId")
            responses = [e for e in sent if e.get("category") == "response" and e["data"].get("requestId") == rid]
            if isinstance(rid, str) and rid:
                same_id = sum(1 for f in frames if f["data"].get("requestId") == rid)
                assert len(responses) == same_id, (frame, sent)
        for e in sent:
            assert "Traceback" not in json.dumps(e)
            if e["type"] == "system_error":
                assert e["data"]["message"]

    run(scenario())
