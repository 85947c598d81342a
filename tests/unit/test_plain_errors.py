"""Pydantic's validation errors in plain words with the field as a JSON path (api/plain_errors.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentvm.api.http_errors import validation_problem


class Part(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: Annotated[str, Field(min_length=1)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: Annotated[str, Field(min_length=1)] | list[Part]
    limit: Annotated[int, Field(ge=1, le=100)] = 10
    mode: Literal["a", "b"] = "a"
    name: str = "x"

    @field_validator("name")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


@pytest.mark.parametrize(("body", "field", "message"), [
    ({}, "message", "is required"),
    ({"message": ""}, "message", "must not be empty"),
    ({"message": [{"type": "text"}]}, "message[0].text", "is required"),
    ({"message": [{"type": "text", "text": "a"}, {"type": "text", "text": ""}]}, "message[1].text",
     "must not be empty"),
    ({"message": "hi", "limit": "many"}, "limit", "must be a whole number"),
    ({"message": "hi", "limit": 0}, "limit", "must be at least 1"),
    ({"message": "hi", "limit": 101}, "limit", "must be at most 100"),
    ({"message": "hi", "mode": "c"}, "mode", "must be one of 'a' or 'b'"),
    ({"message": "hi", "name": "  "}, "name", "must not be blank"),  # not "Value error, must not be blank"
    ({"message": "hi", "extra": 1}, "extra", "is not a known field"),
    ([1], "body", "must be a JSON object"),
])
def test_validation_problems_in_plain_words(body: Any, field: str, message: str) -> None:
    with pytest.raises(ValidationError) as invalid:
        Body.model_validate(body)
    # FastAPI prefixes each location with where the value was: the body
    errors = [{**e, "loc": ("body", *e["loc"])} for e in invalid.value.errors()]
    assert validation_problem(errors, body) == (field, message)


def test_a_union_members_tag_never_reaches_the_path() -> None:
    with pytest.raises(ValidationError) as invalid:
        Body.model_validate({"message": ""})
    raw = [e["loc"] for e in invalid.value.errors()]
    assert ("message", "constrained-str") in raw  # what pydantic says, and its message.constrained-str
    assert validation_problem(invalid.value.errors(), {"message": ""}) == ("message", "must not be empty")


def test_a_query_parameter_is_named_by_its_name() -> None:
    errors = [{"type": "missing", "loc": ("query", "q"), "msg": "Field required"}]
    assert validation_problem(errors, None) == ("q", "is required")
