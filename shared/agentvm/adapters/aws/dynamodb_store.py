"""The Store port on one DynamoDB table: a façade over the table's repositories.

The table's layout, its request counts per operation and why it has this shape are in
`dynamodb_table`; each repository is a module of its own (`dynamodb_containers`, `dynamodb_images`,
`dynamodb_agents`, `dynamodb_session_log`, `dynamodb_turns`, `dynamodb_search`,
`dynamodb_resources`), the items' codecs are in `dynamodb_items` and `dynamodb_event_blocks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentvm.adapters.aws.dynamodb_agents import DynamoAgents
from agentvm.adapters.aws.dynamodb_containers import DynamoContainers
from agentvm.adapters.aws.dynamodb_images import DynamoImages
from agentvm.adapters.aws.dynamodb_items import _agent, _image, _image_pk, _s
from agentvm.adapters.aws.dynamodb_resources import DynamoResources
from agentvm.adapters.aws.dynamodb_search import DynamoSearch
from agentvm.adapters.aws.dynamodb_session_log import DynamoSessionLog
from agentvm.adapters.aws.dynamodb_turns import DynamoTurns
from agentvm.domain.models import Agent, Image


class DynamoDBStore(DynamoContainers, DynamoImages, DynamoAgents, DynamoSessionLog, DynamoTurns, DynamoSearch,
                    DynamoResources):
    """`Store` on DynamoDB: every repository on one `DynamoTable` (one client, one clock). The client
    is created once by `open()` and reused until `close()`."""

    async def get_image_and_agent(self, tenant_id: str, image_id: str) -> tuple[Image | None, Agent | None]:
        # the image's partition holds `AGENT`, `IMG` and its sessions' `SESS#…` entries: the range
        # AGENT..IMG is exactly the two items, read (consistently) for one unit when they fit in 4 KB
        items = await self._query(KeyConditionExpression="PK = :pk AND SK BETWEEN :a AND :i", ConsistentRead=True,
                                  ExpressionAttributeValues={":pk": _s(_image_pk(tenant_id, image_id)),
                                                             ":a": _s("AGENT"), ":i": _s("IMG")})
        by_sk = {i["SK"]["S"]: i for i in items}
        if "IMG" not in by_sk:
            return None, None
        return _image(by_sk["IMG"]), _agent(by_sk["AGENT"]) if "AGENT" in by_sk else None


if TYPE_CHECKING:
    from agentvm.ports import Store

    def _implements_store(store: DynamoDBStore) -> Store:  # mypy checks the port's signatures
        return store
