"""Domain records. Plain dataclasses with slots: cheap to hold, cheap to copy, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

JSON = dict[str, Any]

DEFAULT_TENANT = "local"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a tenant and the key it used (None in the open local mode)."""

    tenant_id: str
    key_id: str | None = None


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key. Times are epoch ms; only the salted hash of the secret is kept."""

    key_id: str
    tenant_id: str
    salt: str
    secret_hash: str
    scopes: tuple[str, ...]
    created_at: int
    expires_at: int | None = None
    revoked_at: int | None = None
    name: str | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def expired(self, now_ms: int) -> bool:
        return self.expires_at is not None and now_ms >= self.expires_at


@dataclass(slots=True)
class Container:
    tenant_id: str
    container_id: str
    created_at: int
    updated_at: int


@dataclass(slots=True)
class Image:
    """A built definition. `config` is the frozen snapshot the agent runs with."""

    tenant_id: str
    image_id: str
    container_id: str
    session_id: str
    name: str
    created_at: int
    updated_at: int
    description: str | None = None
    system_prompt: str | None = None
    config: JSON = field(default_factory=dict)

    def for_session(self, session_id: str) -> Image:
        """The image as one of its sessions runs it: the same snapshot, `session_id` set to that
        session. The engine keys everything (turns, history, event log, leases) by it."""
        return self if session_id == self.session_id else replace(self, session_id=session_id)


@dataclass(slots=True)
class Session:
    """A conversation of an image: its messages, turns and event log. An image has its primary
    session (created with it; the AgentX protocol's one session per image) and may have more."""

    tenant_id: str
    session_id: str
    image_id: str
    container_id: str
    created_at: int
    updated_at: int
    title: str | None = None


@dataclass(slots=True)
class Agent:
    """An activation of an image. A record, not a process: nothing runs between turns."""

    tenant_id: str
    agent_id: str
    image_id: str
    container_id: str
    name: str
    created_at: int


@dataclass(slots=True)
class StoredMessage:
    """One history entry. `body` is the full AgentX Message object (id, role, subtype, …)."""

    session_id: str
    message_id: str
    body: JSON
    turn_id: str | None = None

    @property
    def role(self) -> str:
        return str(self.body.get("role", ""))

    @property
    def subtype(self) -> str:
        return str(self.body.get("subtype", ""))


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def to_wire(self) -> JSON:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cacheReadTokens": self.cache_read_tokens,
            "cacheWriteTokens": self.cache_write_tokens,
        }


class TurnStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


TERMINAL_TURN_STATUSES = frozenset({TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.INTERRUPTED})


@dataclass(slots=True)
class Turn:
    tenant_id: str
    turn_id: str
    session_id: str
    image_id: str
    container_id: str
    user_message_id: str
    status: TurnStatus
    created_at: int
    tier: str = "function"
    model: str | None = None
    usage: Usage = field(default_factory=Usage)
    list_cost: str = "0"
    billed_cost: str = "0"
    error_code: str | None = None
    error_message: str | None = None
    started_at: int | None = None
    ended_at: int | None = None
    # the turn log: what ran it (the image's definition, else its name) and the task (the start of
    # the user message); per-turn overrides of the image's values (`temperature`, `maxTokens`)
    agent: str | None = None
    task: str | None = None
    options: JSON = field(default_factory=dict)
    key_id: str | None = None  # the API key that sent the user message (usage and key budgets)
    first_token_ms: int | None = None  # from the start to the first text delta (None: no text streamed)

    @property
    def duration_ms(self) -> int | None:
        return self.ended_at - self.started_at if self.ended_at and self.started_at else None


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """A session event as sent: its per-session `seq`, type and encoded JSON envelope."""

    seq: int
    type: str
    payload: str
    created_at: int


@dataclass(slots=True)
class Checkpoint:
    """Everything a turn produced since the last checkpoint, committed atomically in one write."""

    tenant_id: str
    session_id: str
    messages: list[StoredMessage] = field(default_factory=list)
    events: list[LoggedEvent] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.messages or self.events or self.turns)


@dataclass(frozen=True, slots=True)
class ConnectionRecord:
    """A cloud WebSocket connection and the principal it authenticated as."""

    connection_id: str
    tenant_id: str
    key_id: str | None
    connected_at: int
    # what the connection already subscribes to and watches (read with the record, so a frame
    # that names them again costs no registry write)
    sessions: frozenset[str] = frozenset()
    containers: frozenset[str] = frozenset()
    # False for a connection accepted without credentials: its first frame must be an `auth` frame
    # (tenant_id is empty until then)
    authenticated: bool = True
    # it asked for batched frames at connect (`?frames=batch`): several events per frame, as a JSON array
    batch: bool = False


@dataclass(frozen=True, slots=True)
class LeaseHandoff:
    """A lease passed on from the `ws_default` that announced a message to the runner it starts.

    `owner`: the lease owner the announcer took it as (unique per message, so only the runner
    dispatched for that message can take it over, and only once: its takeover changes the owner);
    `next_seq`: the first seq the announcer did not use (the runner continues there, no gap). The
    announcer does not release the lease: the runner's acquire takes it over (one write fewer)."""

    owner: str
    next_seq: int

    def to_wire(self) -> dict[str, Any]:
        return {"owner": self.owner, "nextSeq": self.next_seq}

    @staticmethod
    def from_wire(value: object) -> LeaseHandoff | None:
        """The handoff of a dispatch payload; None when absent or malformed (the runner then takes
        the lease only once it is free, as without a handoff)."""
        if not isinstance(value, dict):
            return None
        owner, next_seq = value.get("owner"), value.get("nextSeq")
        if not isinstance(owner, str) or not owner or isinstance(next_seq, bool) or not isinstance(next_seq, int):
            return None
        return LeaseHandoff(owner, next_seq) if next_seq > 0 else None


@dataclass(frozen=True, slots=True)
class LeaseState:
    """A cloud session's coordination state, kept on its session item.

    `first_seq`..`last_seq`: the seq block reserved with the lease (empty when only read).
    `queued`: turns waiting for `chat_turn`; `announce`: queued turns whose user message has not
    been published yet (they were queued while someone else held the lease); `pending_subs`:
    connections owed an `afterSeq` replay; `interrupts`: a counter of interrupt requests, and
    `interrupts_seen` how far the holder has acted on them. `dead_runner` (from `acquire`, and from
    `poll` once the lease has expired): a turn runner that took the lease before and never released
    it: it died (its lease expired), leaving the turn it was running unfinished.
    `session` (from `acquire`, when the record returned it): the session itself, read in the same
    write. `definitions`: a counter bumped whenever the session's agent is destroyed
    (`bump_definitions`): a runner's cached image and agent are good only for the count they were
    read at (hosting/definition_cache.py)."""

    first_seq: int = 0
    last_seq: int = 0
    queued: frozenset[str] = frozenset()
    announce: frozenset[tuple[str, str]] = frozenset()  # (turn id, the sender's connection id or "")
    pending_subs: frozenset[str] = frozenset()
    interrupts: int = 0
    interrupts_seen: int = 0  # the highest interrupt count the lease holder has acted on
    held: bool = False
    dead_runner: str = ""
    session: Session | None = None
    definitions: int = 0

    @property
    def has_work(self) -> bool:
        return bool(self.queued or self.announce or self.pending_subs)


@dataclass(frozen=True, slots=True)
class Subscription:
    """A connection's subscription to a session. `replayed_seq`: the highest seq already sent to it
    from the stored log; `pending`: its `afterSeq` replay is still owed by the session's lease holder;
    `since_seq`: the log's head when it began (live events above it were delivered to it)."""

    connection_id: str
    after_seq: int = 0
    replayed_seq: int = 0
    pending: bool = False
    since_seq: int = 0
    batch: bool = False  # the connection takes batched frames (its ConnectionRecord's `batch`)


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One entry of a confined file system (a workspace)."""

    path: str  # relative POSIX path inside the root
    kind: str  # "file" | "dir" | "symlink" | "other"
    size: int
    modified_ms: int


RESOURCE_KINDS = ("prompt", "tool", "sandbox", "agent", "knowledge")


@dataclass(frozen=True, slots=True)
class ResourceVersion:
    """One immutable version of a resource (`resource://<kind>s/<name>@<version>`).

    A resource is the set of versions sharing `resource_id` (and kind and name) within its owner
    tenant. `version` is a semantic version; `version_key` sorts like it (agentvm.domain.semver).
    `published`: every tenant may read it (a published name is unique across tenants)."""

    tenant_id: str
    resource_id: str
    kind: str  # one of RESOURCE_KINDS
    name: str
    version: str
    version_key: str
    content: JSON
    content_hash: str  # "sha256:<hex>" of the canonical JSON of content
    dependencies: tuple[str, ...] = ()  # resource:// URIs, with version specs
    description: str = ""
    tags: tuple[str, ...] = ()
    published: bool = False
    created_at: int = 0


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One audited change of the runtime configuration layer. Secret values are stored masked here."""

    key: str
    old: str | None  # the previous value's JSON text (masked for secrets), None when it was unset
    new: str | None  # the new value's JSON text (masked for secrets), None when it was removed
    actor: str  # who changed it (the API key id, or "local")
    at: int  # epoch ms


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One message found by a full-text search of a tenant's sessions (agentvm.domain.message_text).

    `snippet`: HTML, the text around the matches escaped, each match in `<mark>…</mark>`. `score`:
    BM25 relevance, higher is better (in the cloud it compares hits of one search window only)."""

    session_id: str
    message_id: str
    role: str
    subtype: str
    timestamp: int  # the message's, epoch ms
    snippet: str
    score: float
    image_id: str | None = None
