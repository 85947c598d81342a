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
from agentvm.adapters.aws.dynamodb_resources import DynamoResources
from agentvm.adapters.aws.dynamodb_search import DynamoSearch
from agentvm.adapters.aws.dynamodb_session_log import DynamoSessionLog
from agentvm.adapters.aws.dynamodb_turns import DynamoTurns


class DynamoDBStore(DynamoContainers, DynamoImages, DynamoAgents, DynamoSessionLog, DynamoTurns, DynamoSearch,
                    DynamoResources):
    """`Store` on DynamoDB: every repository on one `DynamoTable` (one client, one clock). The client
    is created once by `open()` and reused until `close()`."""


if TYPE_CHECKING:
    from agentvm.ports import Store

    def _implements_store(store: DynamoDBStore) -> Store:  # mypy checks the port's signatures
        return store
