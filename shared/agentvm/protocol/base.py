"""Base model for wire shapes: camelCase on the wire, snake_case in Python.

`defer_build`: a model's validator is built when it is first used, not at import. That takes
~0.25 s off the import of the protocol on a Lambda cold start (docs/cloud-design.md).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class WireModel(BaseModel):
    """Outgoing shapes: strict about our own fields."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", defer_build=True)

    def wire(self) -> dict[str, Any]:
        """The dict sent on the wire: aliases, and only the fields that were set."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")


class InboundModel(BaseModel):
    """Incoming shapes: the stock client merges its context into `data`, so extra keys are ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", defer_build=True)
