"""Agents (activation records) on the table (`AgentRepository`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from agentvm.adapters.aws.dynamodb_items import (
    Item,
    _agent,
    _conditional_failed,
    _failed_item,
    _image_pk,
    _k,
    _n,
    _s,
    _ts,
)
from agentvm.adapters.aws.dynamodb_table import GSI_BY_ID, GSI_CONTAINER, GSI_TENANT, DynamoTable
from agentvm.domain.models import Agent


class DynamoAgents(DynamoTable):
    """`AgentRepository` on DynamoDB: the agent item lives in its image's partition."""

    async def put_agent(self, agent: Agent) -> Agent:
        t, aid, cid = agent.tenant_id, agent.agent_id, agent.container_id
        created = _ts(agent.created_at)
        item: Item = {
            "PK": _s(_image_pk(t, agent.image_id)), "SK": _s("AGENT"),
            "G1PK": _s(f"TENANT#{_k(t)}#AGENT"), "G1SK": _s(f"{created}#{_k(aid)}"),
            "G2PK": _s(f"CONT#{_k(t)}#{_k(cid)}"), "G2SK": _s(f"AGENT#{created}#{_k(aid)}"),
            "G3PK": _s(f"AGENT#{_k(t)}#{_k(aid)}"),
            "tenant_id": _s(t), "agent_id": _s(aid), "image_id": _s(agent.image_id), "container_id": _s(cid),
            "name": _s(agent.name), "created_at": _n(agent.created_at),
        }
        try:
            await self.client.put_item(TableName=self.table_name, Item=item,
                                       ConditionExpression="attribute_not_exists(PK)",
                                       ReturnValuesOnConditionCheckFailure="ALL_OLD")
        except ClientError as exc:
            if not _conditional_failed(exc):
                raise
            existing = _failed_item(exc)
            if existing is None:  # an endpoint that does not return it
                existing = await self._get(_image_pk(t, agent.image_id), "AGENT")
            if existing is None:  # deleted in between: try again
                return await self.put_agent(agent)
            return _agent(existing)
        return agent

    async def get_agent(self, tenant_id: str, agent_id: str) -> Agent | None:
        found = await self._by_id(f"AGENT#{_k(tenant_id)}#{_k(agent_id)}")
        return _agent(found) if found is not None and found["agent_id"]["S"] == agent_id else None

    async def get_agent_for_image(self, tenant_id: str, image_id: str) -> Agent | None:
        item = await self._get(_image_pk(tenant_id, image_id), "AGENT")
        return _agent(item) if item else None

    async def list_agents(self, tenant_id: str, container_id: str | None = None) -> list[Agent]:
        if container_id is None:
            items = await self._query(IndexName=GSI_TENANT, KeyConditionExpression="G1PK = :pk",
                                      ExpressionAttributeValues={":pk": _s(f"TENANT#{_k(tenant_id)}#AGENT")})
        else:
            items = await self._query(
                IndexName=GSI_CONTAINER, KeyConditionExpression="G2PK = :pk AND begins_with(G2SK, :agent)",
                ExpressionAttributeValues={":pk": _s(f"CONT#{_k(tenant_id)}#{_k(container_id)}"),
                                           ":agent": _s("AGENT#")})
        return [_agent(i) for i in items]

    async def delete_agent(self, tenant_id: str, agent_id: str) -> bool:
        keys = await self._query(IndexName=GSI_BY_ID, KeyConditionExpression="G3PK = :pk",
                                 ExpressionAttributeValues={":pk": _s(f"AGENT#{_k(tenant_id)}#{_k(agent_id)}")})
        deleted = False
        for k in keys:
            try:
                await self.client.delete_item(TableName=self.table_name, Key={"PK": k["PK"], "SK": k["SK"]},
                                              ConditionExpression="agent_id = :aid",
                                              ExpressionAttributeValues={":aid": _s(agent_id)})
                deleted = True
            except ClientError as exc:
                if not _conditional_failed(exc):
                    raise
        return deleted


if TYPE_CHECKING:
    from agentvm.ports import AgentRepository

    def _implements_port(repo: DynamoAgents) -> AgentRepository:  # mypy checks the port's signatures
        return repo
