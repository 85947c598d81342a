"""The `history_archive` function (moto): a stream batch of TTL removals, in the Lambda event format,
becomes the session's archive object, and the session's export is the same after TTL removed the
archived items from the table."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from agentvm.adapters.aws.s3_history_archive import decode_items
from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import Image, Principal, Session
from tests.adapters.test_history_archive import raw, record, sk, ttl_delete, turn_checkpoint
from tests.cloud.conftest import cloud_runtime_on
from tests.support.cloud_edge import load_handler


@pytest.fixture
def cloud(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[cloud_runtime.CloudRuntime]:
    bucket = f"agentvm-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    with cloud_runtime_on(monkeypatch, moto_endpoint, AVM_BUCKET=bucket, AVM_CHAT_TURN_FUNCTION="chat_turn") as rt:
        yield rt


def test_archived_history_reads_and_exports_as_before_ttl_removed_it(cloud: cloud_runtime.CloudRuntime,
                                                                       moto_endpoint: str) -> None:
    """The cloud's read path (ws_default's use cases: `image_messages`, the turns) and the session
    export service over the cloud runtime's ports, before and after TTL moved turn 1 to the archive."""
    from agentvm.services.session_archive import SessionArchive

    store = cloud.store
    cloud_runtime.run(store.create_image(Image("t1", "i1", "c1", "sess_i1", "n", 1, 1, None, None, {}),
                                         Session("t1", "sess_i1", "i1", "c1", 1, 1)))
    for n in (1, 2):
        cloud_runtime.run(store.commit(turn_checkpoint("sess_i1", n, seq=10 * n)))
    inv = cloud.invocation("t1", role="ws_default")
    uses = cloud.router(inv).s
    p = Principal("t1")
    archives = SessionArchive(inv.deps, uses.images, uses.image_sessions)

    def read() -> tuple[list[str], list[str], dict[str, Any]]:
        messages = cloud_runtime.run(uses.image_sessions.messages(p, "sess_i1"))
        turns = cloud_runtime.run(uses.image_sessions.turns(p, "sess_i1"))
        return ([m.message_id for m in messages], [t.turn_id for t in turns],
                cloud_runtime.run(archives.export(p, "sess_i1")))

    before = read()
    assert before[:2] == (["m_u1", "m_a1", "m_u2", "m_a2"], ["turn1", "turn2"])

    # TTL removes turn 1's items (the session's first hot window ended); the stream delivers them
    def name(item: dict[str, Any]) -> str:  # a message by its id (its key is time-ordered), else its key
        return f"MSG#{item['message_id']['S']}" if "message_id" in item else sk(item)

    items = [i for i in cloud_runtime.run(raw(store, "SESS#t1#sess_i1")) if name(i) in (
        "MSG#m_u1", "MSG#m_a1", "TURN#turn1", "EVB#00000000000000000011")]
    out = load_handler("history_archive").handler({"Records": [record(i, n) for n, i in enumerate(items)]}, None)
    assert out["sessions"] == 1 and out["items"] == 3 and out["skipped"] == 0
    [key] = out["objects"]
    assert key.startswith("archive/t1/sess_i1/0000000000001000-")
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    body = s3.get_object(Bucket=cloud.settings.bucket, Key=key)["Body"].read()
    assert sorted(name(i) for i in decode_items(body)) == ["MSG#m_a1", "MSG#m_u1", "TURN#turn1"]
    cloud_runtime.run(ttl_delete(store, items))
    assert sorted(name(i) for i in cloud_runtime.run(raw(store, "SESS#t1#sess_i1")) if sk(i).startswith("MSG#")) == [
        "MSG#m_a2", "MSG#m_u2"]

    after = read()
    assert after[:2] == before[:2]
    assert after[2]["messages"] == before[2]["messages"] and after[2]["turns"] == before[2]["turns"]
    assert after[2]["checksum"] == before[2]["checksum"]  # the same content, archived and hot merged
