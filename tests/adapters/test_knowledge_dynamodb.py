"""`knowledge_search` on the cloud's store: a published knowledge resource on DynamoDB (moto), read by
another tenant's image and searched in place, as chat_turn does in the function tier."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import botocore.session
import pytest

from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.domain.models import Principal
from agentvm.services.resources import ResourceService
from agentvm.tools.knowledge import knowledge_tools
from tests.tools.test_knowledge import CORPUS


@pytest.fixture
async def store(aws_env: None, aws_session: botocore.session.Session,
                moto_endpoint: str) -> AsyncIterator[DynamoDBStore]:
    s = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=aws_session, endpoint_url=moto_endpoint)
    await s.open()
    await s.create_table()
    yield s
    await s.close()


async def test_search_over_a_published_knowledge_resource(store: DynamoDBStore) -> None:
    resources = ResourceService(store)
    await resources.register(Principal("publisher"), kind="knowledge", name="handbook", version="1.0.0",
                             content=CORPUS, published=True)
    await resources.register(Principal("publisher"), kind="knowledge", name="secret-notes", version="1.0.0",
                             content={"documents": [{"id": "x", "text": "refund refund refund"}]})
    pinned = (await resources.resolve(Principal("reader"), "resource://knowledge/handbook@^1")).pinned
    tools = knowledge_tools(store, "reader", {"knowledge": [pinned]})
    assert tools is not None and tools.needs_sandbox("knowledge_search") is False
    outcome = await tools.run("knowledge_search", {"query": "refund for a return", "limit": 1})
    assert outcome.output.startswith("[1] resource://knowledge/handbook@1.0.0 › refunds (Refund policy)\n")
    assert "\n[2]" not in outcome.output
    # another tenant's private knowledge cannot be pinned or searched by the reader
    hidden = knowledge_tools(store, "reader", {"knowledge": ["resource://knowledge/secret-notes@1.0.0"]})
    assert hidden is not None
    missing = await hidden.run("knowledge_search", {"query": "refund"})
    assert (missing.is_error, missing.output) == (
        True, "knowledge_search: resource://knowledge/secret-notes@1.0.0 is no longer available")
    bad = await tools.run("knowledge_search", {"query": "  "})
    assert (bad.is_error, bad.output) == (True, "knowledge_search: query: must be a non-empty string")
