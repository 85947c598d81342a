"""Containers on the table (`ContainerRepository`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from agentvm.adapters.aws.dynamodb_items import _conditional_failed, _container, _k, _n, _s, _ts
from agentvm.adapters.aws.dynamodb_table import GSI_TENANT, DynamoTable
from agentvm.domain.models import Container


class DynamoContainers(DynamoTable):
    """`ContainerRepository` on DynamoDB."""

    async def create_container(self, container: Container) -> bool:
        t, cid = container.tenant_id, container.container_id
        item = {
            "PK": _s(f"CONT#{_k(t)}#{_k(cid)}"), "SK": _s("CONT"),
            "G1PK": _s(f"TENANT#{_k(t)}#CONT"), "G1SK": _s(f"{_ts(container.created_at)}#{_k(cid)}"),
            "tenant_id": _s(t), "container_id": _s(cid),
            "created_at": _n(container.created_at), "updated_at": _n(container.updated_at),
        }
        try:
            await self.client.put_item(TableName=self.table_name, Item=item,
                                       ConditionExpression="attribute_not_exists(PK)")
        except ClientError as exc:
            if _conditional_failed(exc):
                return False
            raise
        return True

    async def get_container(self, tenant_id: str, container_id: str) -> Container | None:
        item = await self._get(f"CONT#{_k(tenant_id)}#{_k(container_id)}", "CONT")
        return _container(item) if item else None

    async def list_containers(self, tenant_id: str) -> list[Container]:
        items = await self._query(IndexName=GSI_TENANT, KeyConditionExpression="G1PK = :pk",
                                  ExpressionAttributeValues={":pk": _s(f"TENANT#{_k(tenant_id)}#CONT")})
        return [_container(i) for i in items]


if TYPE_CHECKING:
    from agentvm.ports import ContainerRepository

    def _implements_port(repo: DynamoContainers) -> ContainerRepository:  # mypy checks the port's signatures
        return repo
