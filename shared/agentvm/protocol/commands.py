"""The 17 AgentX commands: request data models (validated) and response data models (sent)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, StringConstraints, field_validator

from agentvm.protocol.base import InboundModel, WireModel
from agentvm.protocol.messages import UserContent

ContainerIdStr = Annotated[str, StringConstraints(min_length=1, max_length=128,
                                                  pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")]
IdStr = Annotated[str, StringConstraints(min_length=1, max_length=128)]
NameStr = Annotated[str, StringConstraints(max_length=200)]
PromptStr = Annotated[str, StringConstraints(max_length=200_000)]
BuiltinToolName = Literal["bash", "read_file", "write_file", "edit_file", "list_files"]
ToolEntry = Annotated[str, StringConstraints(min_length=1, max_length=300)]


# ---- request data ----------------------------------------------------------------------------

class RequestData(InboundModel):
    request_id: IdStr


class ContainerCreateRequest(RequestData):
    container_id: ContainerIdStr


class ContainerGetRequest(RequestData):
    container_id: ContainerIdStr


class ContainerListRequest(RequestData):
    pass


class McpServerConfig(InboundModel):
    type: str | None = None
    command: str | None = None
    args: list[str] | None = None
    env: dict[str, str] | None = None
    url: str | None = None
    headers: dict[str, str] | None = None


class ImageConfig(InboundModel):
    name: NameStr | None = None
    description: Annotated[str, StringConstraints(max_length=2000)] | None = None
    system_prompt: PromptStr | None = None
    mcp_servers: dict[str, McpServerConfig] | None = None
    model: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=200_000)] | None = None
    # built-in tools the agent may call (AgentVM extension); none by default
    # (or resource://tools/... references, resolved and pinned when the image is built)
    tools: Annotated[list[ToolEntry], Field(max_length=16)] | None = None
    # an agent definition to build from (AgentVM extension): resource://agents/<name>[@spec]
    agent: Annotated[str, StringConstraints(min_length=1, max_length=300)] | None = None

    @field_validator("tools")
    @classmethod
    def _known(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        for name in v:
            if name not in get_args(BuiltinToolName) and not name.startswith("resource://tools/"):
                raise ValueError(f"unknown tool '{name}' (built-in: {', '.join(get_args(BuiltinToolName))}; "
                                 "or resource://tools/<name>[@spec])")
        if len(set(v)) != len(v):
            raise ValueError("each tool may be listed once")
        return v


class ImageCreateRequest(RequestData):
    container_id: ContainerIdStr
    config: ImageConfig


class ImageIdRequest(RequestData):
    image_id: IdStr


class ImageRunRequest(ImageIdRequest):
    pass


class ImageStopRequest(ImageIdRequest):
    pass


class ImageUpdates(InboundModel):
    name: NameStr | None = None
    description: Annotated[str, StringConstraints(max_length=2000)] | None = None


class ImageUpdateRequest(ImageIdRequest):
    updates: ImageUpdates


class ImageListRequest(RequestData):
    container_id: ContainerIdStr | None = None


class ImageGetRequest(ImageIdRequest):
    pass


class ImageDeleteRequest(ImageIdRequest):
    pass


class ImageMessagesRequest(ImageIdRequest):
    session_id: IdStr | None = None  # extension: another session of the image (default: its primary one)


def content_not_empty(v: Any) -> Any:
    """A user message's content: text that is not blank, or at least one part."""
    if isinstance(v, str) and not v.strip():
        raise ValueError("must not be empty")
    if isinstance(v, list) and not v:
        raise ValueError("must contain at least one part")
    return v


class MessageSendRequest(RequestData):
    image_id: IdStr | None = None
    agent_id: IdStr | None = None
    session_id: IdStr | None = None  # extension: another session of the image (default: its primary one)
    content: UserContent

    @field_validator("content")
    @classmethod
    def _not_empty(cls, v: Any) -> Any:
        return content_not_empty(v)


class AgentInterruptRequest(RequestData):
    image_id: IdStr | None = None
    agent_id: IdStr | None = None
    session_id: IdStr | None = None  # extension, as in message_send


class AgentIdRequest(RequestData):
    agent_id: IdStr


class AgentGetRequest(AgentIdRequest):
    pass


class AgentListRequest(RequestData):
    container_id: ContainerIdStr


class AgentDestroyRequest(AgentIdRequest):
    pass


class AgentDestroyAllRequest(RequestData):
    container_id: ContainerIdStr


COMMANDS: dict[str, type[RequestData]] = {
    "container_create": ContainerCreateRequest,
    "container_get": ContainerGetRequest,
    "container_list": ContainerListRequest,
    "image_create": ImageCreateRequest,
    "image_run": ImageRunRequest,
    "image_stop": ImageStopRequest,
    "image_update": ImageUpdateRequest,
    "image_list": ImageListRequest,
    "image_get": ImageGetRequest,
    "image_delete": ImageDeleteRequest,
    "image_messages": ImageMessagesRequest,
    "message_send": MessageSendRequest,
    "agent_interrupt": AgentInterruptRequest,
    "agent_get": AgentGetRequest,
    "agent_list": AgentListRequest,
    "agent_destroy": AgentDestroyRequest,
    "agent_destroy_all": AgentDestroyAllRequest,
}


# ---- response data ---------------------------------------------------------------------------

class ImageListItem(WireModel):
    image_id: str
    container_id: str
    session_id: str
    name: str
    description: str | None = None
    system_prompt: str | None = None
    created_at: int
    updated_at: int
    online: bool
    agent_id: str | None = None


class ResponseData(WireModel):
    request_id: str
    error: str | None = None
    # AgentVM extension: a stable machine-readable code next to the human `error` text.
    error_code: str | None = None


class ContainerCreateResponse(ResponseData):
    container_id: str | None = None


class ContainerGetResponse(ResponseData):
    container_id: str | None = None
    exists: bool = False


class ContainerListResponse(ResponseData):
    container_ids: list[str] = Field(default_factory=list)


class ImageCreateResponse(ResponseData):
    record: ImageListItem | None = None
    subscriptions: list[str] | None = Field(default=None, alias="__subscriptions")


class ImageRunResponse(ResponseData):
    image_id: str | None = None
    agent_id: str = ""
    reused: bool = False


class ImageStopResponse(ResponseData):
    image_id: str | None = None


class ImageUpdateResponse(ResponseData):
    record: ImageListItem | None = None


class ImageListResponse(ResponseData):
    records: list[ImageListItem] = Field(default_factory=list)
    subscriptions: list[str] | None = Field(default=None, alias="__subscriptions")


class ImageGetResponse(ResponseData):
    record: ImageListItem | None = None
    subscriptions: list[str] | None = Field(default=None, alias="__subscriptions")


class ImageDeleteResponse(ResponseData):
    image_id: str | None = None


class ImageMessagesResponse(ResponseData):
    image_id: str | None = None
    session_id: str | None = None  # extension: set when the request named a session
    messages: list[dict[str, Any]] = Field(default_factory=list)


class MessageSendResponse(ResponseData):
    image_id: str | None = None
    agent_id: str = ""
    session_id: str | None = None  # extension: the session the message was queued on


class AgentInterruptResponse(ResponseData):
    image_id: str | None = None
    agent_id: str | None = None


class AgentGetResponse(ResponseData):
    agent_id: str | None = None
    container_id: str | None = None
    exists: bool = False


class AgentRef(WireModel):
    agent_id: str
    container_id: str
    image_id: str


class AgentListResponse(ResponseData):
    agents: list[AgentRef] = Field(default_factory=list)


class AgentDestroyResponse(ResponseData):
    agent_id: str | None = None
    success: bool = False


class AgentDestroyAllResponse(ResponseData):
    container_id: str | None = None


RESPONSES: dict[str, type[ResponseData]] = {
    "container_create": ContainerCreateResponse,
    "container_get": ContainerGetResponse,
    "container_list": ContainerListResponse,
    "image_create": ImageCreateResponse,
    "image_run": ImageRunResponse,
    "image_stop": ImageStopResponse,
    "image_update": ImageUpdateResponse,
    "image_list": ImageListResponse,
    "image_get": ImageGetResponse,
    "image_delete": ImageDeleteResponse,
    "image_messages": ImageMessagesResponse,
    "message_send": MessageSendResponse,
    "agent_interrupt": AgentInterruptResponse,
    "agent_get": AgentGetResponse,
    "agent_list": AgentListResponse,
    "agent_destroy": AgentDestroyResponse,
    "agent_destroy_all": AgentDestroyAllResponse,
}

# Fields that the reference fills with fallbacks on a failed response (spec §2.3).
ERROR_FALLBACKS: dict[str, dict[str, Any]] = {
    "image_run": {"agent_id": "", "reused": False},
    "image_list": {"records": []},
    "image_messages": {"messages": []},
    "message_send": {"agent_id": ""},
    "agent_destroy": {"success": False},
}
