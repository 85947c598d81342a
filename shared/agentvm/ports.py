"""The Protocols every adapter implements. Services and the engine see only these."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Collection, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentvm.domain.models import (
    Agent,
    ApiKey,
    Checkpoint,
    ConfigChange,
    ConnectionRecord,
    Container,
    FileInfo,
    Image,
    LeaseHandoff,
    LeaseState,
    LoggedEvent,
    ResourceVersion,
    SearchHit,
    Session,
    StoredMessage,
    Subscription,
    Turn,
    Usage,
)

if TYPE_CHECKING:  # annotations only: a process loads what its adapters and services use (a cold start)
    from agentvm.domain.sandbox_limits import Limits, ProcessResult
    from agentvm.domain.turn_hosts import TurnHostRecord, TurnRequest
    from agentvm.domain.usage import Budget, Hold, Spend, UnitPrices, UsageRecord
    from agentvm.drivers.base import DriverEvent, LLMRequest, ToolOutcome
    from agentvm.money import Cost, ModelPrice


class ContainerRepository(Protocol):
    """Containers."""

    async def create_container(self, container: Container) -> bool:
        """Insert unless it exists; True when it was created."""
        ...

    async def get_container(self, tenant_id: str, container_id: str) -> Container | None: ...
    async def list_containers(self, tenant_id: str) -> list[Container]: ...


class ImageRepository(Protocol):
    """Images and their sessions (the primary one is created with its image)."""

    async def create_image(self, image: Image, session: Session) -> None: ...
    async def get_image(self, tenant_id: str, image_id: str) -> Image | None: ...
    async def list_images(self, tenant_id: str, container_id: str | None = None) -> list[Image]:
        """Newest first."""
        ...

    async def update_image(self, tenant_id: str, image_id: str, *, name: str | None,
                           description: str | None, updated_at: int) -> Image | None: ...
    async def delete_image(self, tenant_id: str, image_id: str) -> bool:
        """Delete the image with every session of it (messages, event logs, turns) and its agent."""
        ...

    async def get_session(self, tenant_id: str, session_id: str) -> Session | None: ...
    async def create_session(self, session: Session) -> bool:
        """Add a session to an existing image of the same tenant and container; False when the image
        does not exist (Conflict when the session id exists)."""
        ...

    async def list_sessions(self, tenant_id: str, image_id: str) -> list[Session]:
        """Every session of an image, the primary one included, oldest first."""
        ...

    async def list_tenant_sessions(self, tenant_id: str, *, image_id: str | None = None, limit: int = 50,
                                   cursor: str | None = None) -> tuple[list[Session], str | None]:
        """The tenant's sessions (of one image when `image_id` is given), newest first (by creation);
        a page of at most `limit` and the cursor of the next one (InvalidRequest for a bad cursor)."""
        ...

    async def delete_session(self, tenant_id: str, session_id: str) -> bool:
        """Delete a session with its messages, event log and turns; False when it does not exist.
        (The primary session goes only with its image: services refuse to delete it alone.)"""
        ...


class AgentRepository(Protocol):
    """Agents (activation records), one per image."""

    async def put_agent(self, agent: Agent) -> Agent:
        """Insert unless the image already has an agent; returns the agent that is registered."""
        ...

    async def get_agent(self, tenant_id: str, agent_id: str) -> Agent | None: ...
    async def get_agent_for_image(self, tenant_id: str, image_id: str) -> Agent | None: ...
    async def list_agents(self, tenant_id: str, container_id: str | None = None) -> list[Agent]: ...
    async def delete_agent(self, tenant_id: str, agent_id: str) -> bool: ...


class SessionLog(Protocol):
    """A session's history and event log: checkpoints, messages, events and their seqs."""

    async def commit(self, checkpoint: Checkpoint) -> None:
        """Atomically insert messages (idempotent by id), append events, upsert turns."""
        ...

    async def list_messages(self, tenant_id: str, session_id: str) -> list[StoredMessage]: ...
    async def read_events(self, tenant_id: str, session_id: str, after_seq: int,
                          limit: int = 10_000) -> list[LoggedEvent]: ...
    async def last_seq(self, tenant_id: str, session_id: str) -> int: ...
    async def reserve_seqs(self, tenant_id: str, session_id: str, block: int) -> tuple[int, int]:
        """Reserve the next `block` seqs above everything reserved or logged: (first, last)."""
        ...

    async def prune_events(self, older_than_ms: int) -> int: ...


class TurnLog(Protocol):
    """Turns: a session's, the tenant's turn log, and those left unfinished."""

    async def get_turn(self, tenant_id: str, turn_id: str) -> Turn | None: ...
    async def list_turns(self, tenant_id: str, session_id: str) -> list[Turn]: ...
    async def list_tenant_turns(self, tenant_id: str, *, since_ms: int | None = None, until_ms: int | None = None,
                                limit: int = 50, cursor: str | None = None) -> tuple[list[Turn], str | None]:
        """The tenant's turn log: its finished turns created in [since_ms, until_ms), newest first; a
        page of at most `limit` and the cursor of the next one (InvalidRequest for a bad cursor)."""
        ...

    async def list_unfinished_turns(self) -> list[Turn]:
        """Turns of every tenant left queued or running (after a crash)."""
        ...


class SearchIndex(Protocol):
    """Full-text search of a tenant's messages."""

    async def search_messages(self, tenant_id: str, query: str, *, limit: int = 20,
                              cursor: str | None = None) -> tuple[list[SearchHit], str | None]:
        """Full-text search of the tenant's messages (agentvm.domain.message_text: plain words, every
        one required; HTML snippets), best first; a page of at most `limit` and the cursor of the
        next one (InvalidRequest for a bad cursor). Messages of deleted sessions never appear. A
        page may hold fewer than `limit` hits while a cursor follows (the cloud store reads a
        bounded window per call): the search is over only when the cursor is None."""
        ...


class ResourceRepository(Protocol):
    """The resource center: immutable versions; a resource is visible to its owner tenant, and to every
    tenant once published."""

    async def create_resource(self, first: ResourceVersion) -> None:
        """Create a resource with its first version. Conflict when the owner already has a resource
        of that kind and name, or when it is published and another tenant published that name."""
        ...

    async def add_resource_version(self, version: ResourceVersion) -> None:
        """Add a version to an existing resource of the same owner (NotFound when the resource does
        not exist for that tenant, Conflict when the version exists)."""
        ...

    async def resource_versions(self, tenant_id: str, resource_id: str) -> list[ResourceVersion]:
        """Every version of a resource the tenant may read (its own, or published), highest
        `version_key` first; [] when none."""
        ...

    async def find_resource(self, tenant_id: str, kind: str, name: str) -> list[ResourceVersion]:
        """Every version of the resource `kind`/`name` the tenant may read: its own resource of that
        name, else a published one; highest `version_key` first; [] when none."""
        ...

    async def list_resources(self, tenant_id: str, *, kind: str | None = None, name: str | None = None,
                             tag: str | None = None, query: str | None = None, limit: int = 50,
                             cursor: str | None = None) -> tuple[list[ResourceVersion], str | None]:
        """The latest version of each resource the tenant may read (own and published), filtered:
        `name` prefix, `tag` exact, `query` case-insensitive substring of name, description or tags.
        Ordered by (kind, name, owner); a page of at most `limit` and the cursor of the next page."""
        ...

    async def delete_resource(self, tenant_id: str, resource_id: str) -> bool:
        """Delete every version of the tenant's own resource; False when it has none."""
        ...


class RecentMessages(Protocol):
    """A session's messages, all of them or those stored since a time (for a cached history)."""

    async def list_messages(self, tenant_id: str, session_id: str) -> list[StoredMessage]: ...
    async def list_messages_since(self, tenant_id: str, session_id: str, since_ms: int) -> list[StoredMessage]:
        """At least every message created at or after `since_ms` (epoch ms), in store order."""
        ...


class Store(ContainerRepository, ImageRepository, AgentRepository, SessionLog, TurnLog, SearchIndex,
            ResourceRepository, Protocol):
    """Durable state: every repository on one database. Every method is scoped by tenant: another
    tenant's id reads as absent. A use case that needs only some of it declares only those ports."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...

    async def get_image_and_agent(self, tenant_id: str, image_id: str) -> tuple[Image | None, Agent | None]:
        """`get_image` and `get_agent_for_image` in one read where the database can (DynamoDB: one
        Query of the image's partition, one read unit for both); the agent is None without the image."""
        ...


class SessionLeases(Protocol):
    """Cloud only: one publisher per session at a time (seqs must reach clients in order), and the
    session's turn queue and signals, all on one record so each step is one conditional write."""

    async def acquire(self, tenant_id: str, session_id: str, owner: str, ttl_ms: int,
                      seq_block: int, *, runner: bool = False, queue: str | None = None,
                      handoff: LeaseHandoff | None = None) -> LeaseState | None:
        """The lease (free, expired, or already `owner`'s) with a reserved block of seqs, or None
        when another owner holds it or the session does not exist. The block starts at the seq the
        last holder handed on at its release (`next_seq`), else above everything reserved.
        `runner`: the holder runs turns; it is marked on the record until its `release(runner=True)`,
        so a marker found there (`LeaseState.dead_runner`) names a runner that died mid-turn.
        `queue`: a turn added to the queue in the same write. `handoff`: the lease may also be taken
        over from `handoff.owner`, the block then starting at `handoff.next_seq`."""
        ...

    async def take_over(self, tenant_id: str, session_id: str, owner: str, dead_runner: str, ttl_ms: int,
                        seq_block: int) -> LeaseState | None:
        """Take the lease from a runner known to be dead (Lambda reported its invocation failed), even
        before the lease expires, as `acquire(runner=True)` would after it: None unless the record
        still carries `dead_runner`'s mark and nobody else holds the lease (a live runner is never
        broken). The state's `dead_runner` names it."""
        ...

    async def renew(self, tenant_id: str, session_id: str, owner: str, ttl_ms: int) -> LeaseState | None:
        """Extend the lease; None when it was lost."""
        ...

    async def release(self, tenant_id: str, session_id: str, owner: str, *, queue: str | None = None,
                      done: Collection[str] = (), announced: Collection[tuple[str, str]] = (),
                      served: Collection[str] = (), next_seq: int | None = None,
                      runner: bool = False) -> LeaseState | None:
        """Give the lease up, in the same write adding `queue` to the queue and removing finished
        turns, announced messages and served subscriptions. `next_seq`: the first seq this holder
        did not use; the next holder continues there (one gap-free seq order across holders, e.g.
        a turn escalated from `chat_turn` to the container task). `runner`: also clear the runner
        marker (the holder's turns are settled). Returns what is left to do (release then
        recheck), or None when `owner` no longer held the lease."""
        ...

    async def poll(self, tenant_id: str, session_id: str, *, consistent: bool = False) -> LeaseState:
        """Read the record (no seqs; `dead_runner` when the lease has expired under a runner's mark).
        Eventually consistent unless asked: the watcher's signals may arrive one poll late; decisions
        that must be exact are conditional writes."""
        ...

    async def enqueue(self, tenant_id: str, session_id: str, turn_id: str, sender: str | None) -> None:
        """Queue a turn whose user message still has to be announced (the lease was taken); `sender`
        is the connection that sent it (it is not sent its own `user_message`)."""
        ...

    async def owe_replay(self, tenant_id: str, session_id: str, connection_id: str) -> None:
        """Record that a connection is owed an `afterSeq` replay by the next lease holder."""
        ...

    async def request_interrupt(self, tenant_id: str, session_id: str) -> int | None:
        """Signal the lease holder to interrupt its running turn: the new request count, or None when
        nobody holds the lease (nothing runs)."""
        ...

    async def bump_definitions(self, tenant_id: str, session_id: str) -> None:
        """The session's agent changed (it was destroyed): runners must read the image and agent
        again instead of using what they cached (`LeaseState.definitions`)."""
        ...

    async def ack_interrupt(self, tenant_id: str, session_id: str, owner: str, count: int) -> None:
        """The holder acted on the interrupt requests up to `count` (its `interrupted` is posted)."""
        ...

    async def get_turns(self, tenant_id: str, session_id: str, turn_ids: Collection[str]) -> list[Turn]:
        """The session's turns with these ids (missing ones are left out), oldest first."""
        ...


class ConfigStore(Protocol):
    """The runtime layer of the configuration (values set through `/v1/config`): persisted, with an
    audit trail. Values are JSON texts; `secret` values are stored encrypted where the backend can
    (SSM SecureString) and are never written to the audit trail in clear."""

    async def runtime_values(self) -> dict[str, str]:
        """Every value of the runtime layer: key → JSON text."""
        ...

    async def set_value(self, key: str, value_json: str | None, *, secret: bool, change: ConfigChange) -> None:
        """Set (or, with None, remove) one value and append `change` to the audit trail, together."""
        ...

    async def changes(self, limit: int = 100) -> list[ConfigChange]:
        """The audit trail, newest first."""
        ...


class Gateway(Protocol):
    """Pushes one encoded frame to one client connection (API Gateway `post_to_connection`)."""

    async def post(self, connection_id: str, frame: str) -> bool:
        """False when the connection is gone."""
        ...


class ConnectionRegistry(Protocol):
    """Cloud connection state: who is connected, who subscribes to a session, who watches a
    container. Records expire on their own (TTL just over API Gateway's 2 h connection cap)."""

    async def put_connection(self, record: ConnectionRecord) -> None: ...
    async def get_connection(self, connection_id: str) -> ConnectionRecord | None: ...
    async def delete_connection(self, connection_id: str) -> None:
        """Remove the connection with its subscriptions and watches."""
        ...

    async def put_subscription(self, tenant_id: str, session_id: str, sub: Subscription) -> None: ...
    async def subscribers(self, tenant_id: str, session_id: str, *, consistent: bool = True) -> list[Subscription]:
        """`consistent=False`: an eventually consistent read (half the price; a fan-out's periodic
        refresh, which catches a subscriber it finds late up from its own log)."""
        ...
    async def watch(self, tenant_id: str, container_id: str, connection_id: str) -> None: ...
    async def watchers(self, tenant_id: str, container_id: str) -> list[str]: ...


class Dispatcher(Protocol):
    """Starts the queued turns of a session in the function tier (Lambda async invoke in the cloud).
    `handoff`: the caller holds the session's lease and passes it on to the runner it starts."""

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None: ...


class TurnQueue(Protocol):
    """The turn-host tier's queue of turn requests (SQS in the cloud)."""

    async def send(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None: ...

    async def receive(self, max_count: int, wait_s: float) -> list[TurnRequest]:
        """Up to `max_count` requests, waiting up to `wait_s` for the first (long polling)."""
        ...

    async def delete(self, requests: Sequence[TurnRequest]) -> None: ...


class TurnHostDirectory(Protocol):
    """Where turn hosts register themselves and dispatchers find them (the table in the cloud)."""

    async def heartbeat(self, host: TurnHostRecord) -> None:
        """Register the host, or refresh its record (`until_ms`, `running`, `accepting`)."""
        ...

    async def deregister(self, host_id: str) -> None: ...

    async def list_hosts(self) -> list[TurnHostRecord]:
        """Every registered host, expired ones included (callers check `takes_turns`)."""
        ...


class ContainerTier(Protocol):
    """Starts a container's sandbox for a session whose turn needs one (the scheduler's escalation).

    Locally: an in-process sandbox host per container. Cloud: the container's ECS task (one per
    container, reused while it has work: its heartbeat record), started with RunTask when none runs.
    The session's escalated turn is already stored; the tier resumes it from the store."""

    async def start(self, tenant_id: str, container_id: str, session_id: str) -> None: ...


class ToolRunner(Protocol):
    """The tools of one turn (engine/tools.py composes them; tools/ implements them)."""

    def schemas(self) -> list[dict[str, Any]]:
        """Tool definitions given to the model (Anthropic `tools` shape)."""
        ...

    def needs_sandbox(self, name: str) -> bool:
        """Whether the tool runs only in the container tier."""
        ...

    async def run(self, name: str, input_: dict[str, Any]) -> ToolOutcome: ...


class ToolProvider(Protocol):
    """The tools of a turn, from its image's config (the tool set and the container's workspace)."""

    async def for_image(self, image: Image) -> ToolRunner: ...


class Driver(Protocol):
    """An LLM driver: one streamed model call, as a sequence of neutral driver events."""

    name: str

    def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]: ...


class EventSource(Protocol):
    """Where a replay reads a session's events after a seq (the store plus unpersisted events)."""

    async def __call__(self, after_seq: int) -> list[LoggedEvent]: ...


class Fanout(Protocol):
    """Routes encoded events to connections: one connection, a session's subscribers, a tenant."""

    def to_connection(self, connection_id: str, payload: str) -> None: ...

    def to_session(self, session_id: str, seq: int, payload: str, *, exclude: str | None = None) -> None: ...

    def to_container(self, tenant_id: str, container_id: str, payload: str) -> None:
        """Lifecycle events: to the tenant's connections that watch this container."""
        ...

    def watch(self, connection_id: str, container_id: str) -> None:
        """The connection named this container in a request: it gets its lifecycle events."""
        ...

    def attach(self, connection_id: str, session_id: str, container_id: str) -> None:
        """Subscribe to a session's live events only (the automatic subscription of a requester)."""
        ...

    async def subscribe(self, connection_id: str, session_id: str, container_id: str, after_seq: int | None,
                        source: EventSource) -> None:
        """Subscribe; with `after_seq`, first deliver the missed events exactly once, in order."""
        ...


class LeasedFanout(Fanout, Protocol):
    """The cloud Fanout of one invocation: delivery is asynchronous, so a lease holder waits for it
    before handing the session on, and it serves the `afterSeq` replays owed to connections."""

    served: dict[str, set[str]]

    async def drain(self) -> None:
        """Wait until every event published so far is delivered and every registry write is done."""
        ...

    async def close(self) -> None:
        """Drain, then stop the delivery tasks (the event loop outlives this holder)."""
        ...

    async def flushed(self) -> None:
        """Wait until everything published before this call is delivered (later events may still be
        in flight)."""
        ...

    def serve_pending(self, session_id: str, *, consistent: bool = True) -> None:
        """Re-read the session's subscribers and serve the replays they are owed. `consistent=False`:
        no replay is known to be owed (one recorded after the read is served by the next lease
        holder), so an eventually consistent read (half the price) will do."""
        ...

    def owe_replay(self, connection_id: str, session_id: str, container_id: str, after_seq: int) -> None:
        """Record a subscription whose replay above `after_seq` the session's lease holder owes."""
        ...

    def listeners(self, session_id: str) -> int:
        """Reachable subscribers of the session: 0 when all have gone, -1 while not known or none."""
        ...


class KeyStore(Protocol):
    """API key records, looked up by their public key id. Tenants are isolated: another tenant's
    key id behaves exactly like a missing one in every tenant-scoped method."""

    async def put_key(self, key: ApiKey) -> None:
        """Store a new key; raises `Conflict` if the key id already exists (never overwrites)."""
        ...

    async def get_key(self, key_id: str) -> ApiKey | None:
        """The record for a token's key id, whatever its tenant (authentication starts here)."""
        ...

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        """Newest first, revoked and expired keys included."""
        ...

    async def revoke_key(self, tenant_id: str, key_id: str, at_ms: int) -> bool:
        """Mark the key revoked (a second revocation keeps the first time); False when absent."""
        ...


class UsageLedger(Protocol):
    """The usage records, the budgets, each budget's monthly counters and the rate windows.

    A budget's month (`period`, "2026-11") has two counters: `spent` (settled billed cost) and
    `reserved` (held by model calls under way). A call holds its worst case first (`reserve`) and
    moves its real cost from reserved to spent when it ends (`settle`), so concurrent calls of one
    tenant can never take spent past the budget. Tenants are isolated: every method is scoped by
    tenant. Key budgets use the key's id; the tenant's own budget has `key_id` None.

    A hold belongs to its turn (a turn makes one call at a time): `settle` and `release` drop the
    hold of the record's or the given turn, and `release_turn` drops whatever a turn still holds once
    its runner is known to be dead, so a crash does not shrink the month's budget. Each hold is
    released at most once: a late `settle` of a turn whose hold `release_turn` already dropped still
    writes the record and its cost."""

    async def put_budget(self, budget: Budget) -> None:
        """Create or replace the budget of `budget.tenant_id` / `budget.key_id`."""
        ...

    async def delete_budget(self, tenant_id: str, key_id: str | None) -> bool:
        """Remove the budget (its counters stay); False when there was none."""
        ...

    async def list_budgets(self, tenant_id: str) -> list[Budget]:
        """The tenant's budget (if any) first, then its keys' budgets by key id."""
        ...

    async def reserve(self, tenant_id: str, key_id: str | None, period: str, amount: Decimal, *,
                      turn_id: str, tenant_cap: Decimal | None, key_cap: Decimal | None,
                      at_ms: int = 0) -> str | None:
        """Atomically add `amount` to `reserved` of the tenant's counter (and the key's, when `key_cap`
        is set) unless that takes spent + reserved past a cap, as the hold of `turn_id` for the call
        starting at `at_ms` (its record's `started_at`: recovery finds the record by it). None when
        held; else which limit refused, "tenant" or "key", and nothing is held. No cap at all: nothing
        is written."""
        ...

    async def settle(self, record: UsageRecord, *, reserved: Decimal, reserved_period: str,
                     key_held: bool) -> bool:
        """Write the record once (by tenant, month and `record_id`), release `reserved` from the tenant's
        counter of `reserved_period` (and the key's, when `key_held`) and add `record.billed_cost` to spent
        of the record's own period on the same counters (a key's counter only while the key has a
        budget). The hold released is `record.turn_id`'s; when that turn holds nothing any more
        (`release_turn` came first) only the record and its cost are written (unless `release_turn`
        found the record and billed it). Not necessarily one transaction (DynamoDB: record, then
        counters), but a repeated call completes an interrupted one and never counts twice. False when
        the record already existed."""
        ...

    async def release(self, tenant_id: str, key_id: str | None, period: str, amount: Decimal, *,
                      turn_id: str, key_held: bool) -> None:
        """Drop the hold of `turn_id` that no call used (the call never started); nothing when the
        turn holds nothing any more."""
        ...

    async def release_turn(self, tenant_id: str, key_id: str | None, turn_id: str,
                           periods: Sequence[str]) -> Decimal:
        """Drop whatever `turn_id` still holds in the months `periods` (its runner died during a
        call); when the runner died after writing the call's record but before its counters, settle
        the counters from that record instead. Returns the amount of hold released from the tenant's
        counters (0 when nothing was held)."""
        ...

    async def spend(self, tenant_id: str, key_id: str | None, period: str) -> Spend:
        """The counters of a month (zero when none)."""
        ...

    async def admit(self, tenant_id: str, key_id: str | None, minute: int, *, tenant_limit: int | None,
                    key_limit: int | None) -> str | None:
        """Count one request in the minute's window of the tenant (and of the key, when `key_limit` is
        set) unless a window is full: None when admitted, else "tenant" or "key" (nothing counted)."""
        ...

    async def list_usage(self, tenant_id: str | None, *, since_ms: int, until_ms: int) -> list[UsageRecord]:
        """Records with since_ms <= ended_at < until_ms, oldest first (then by record id); every
        tenant's when `tenant_id` is None (the operator's export)."""
        ...

    def stream_usage(self, tenant_id: str | None, *, since_ms: int, until_ms: int) -> AsyncIterator[UsageRecord]:
        """The records of `list_usage`, read page by page and yielded as they come, so that an export of
        any size holds a bounded number of them: ordered by `ended_at` (ties in an order the adapter keeps
        stable), each record once."""
        ...


class CallMeter(Protocol):
    """The budgets around the engine's LLM calls (services/metering.py's `Meter`): a new turn admitted
    against the rate limits, each call's worst case held before it and settled (or released) after it,
    a container-tier turn's sandbox time recorded, and a dead runner's holds given back."""

    async def admit(self, turn: Turn) -> None:
        """`RateLimited` when a requests-per-minute limit is full."""
        ...

    async def hold(self, turn: Turn, request: LLMRequest, *, markup: Decimal,
                   prices: Mapping[str, ModelPrice] | None = None) -> Hold:
        """`QuotaExceeded` when the call's worst case does not fit the budgets."""
        ...

    async def release(self, turn: Turn, hold: Hold) -> None: ...
    async def settle(self, turn: Turn, hold: Hold, *, call: int, provider: str, model: str, usage: Usage,
                     cost: Cost, status: str, estimated: bool = False,
                     prices: UnitPrices | None = None) -> UsageRecord: ...
    async def sandbox(self, turn: Turn, *, started_at: int) -> UsageRecord: ...
    async def release_lost(self, turn: Turn) -> Decimal:
        """What a turn whose runner died during an LLM call still holds, given back; the amount."""
        ...


class FileSystem(Protocol):
    """Files confined to a root; every path is relative (POSIX). Escapes raise InvalidRequest(field="path").

    Paths are normalised lexically first (`a/./b/../c` is `a/c`); a symlink is followed only while it
    stays inside the root. A missing path raises NotFound(field="path") (`stat` returns None and
    `remove` False instead)."""

    async def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """The file's content, or its first `max_bytes` bytes."""
        ...

    async def write_bytes(self, path: str, data: bytes) -> int:
        """Create or replace the file, creating parent dirs; returns the bytes written."""
        ...

    async def list(self, path: str = ".", *, recursive: bool = False, limit: int = 1000) -> list[FileInfo]:
        """The directory's entries (sorted by name; recursive: depth first, symlinked dirs not entered),
        at most `limit` of them. Each `path` is relative to the root, not to `path`."""
        ...

    async def stat(self, path: str) -> FileInfo | None:
        """The entry itself (a symlink is reported as one), or None when it does not exist."""
        ...

    async def mkdir(self, path: str) -> None:
        """Create the directory and its parents; an existing directory is fine."""
        ...

    async def remove(self, path: str) -> bool:
        """Remove a file, a symlink (not its target) or a directory tree; False when absent."""
        ...


class BlobStore(Protocol):
    """Large payloads kept out of the Store (attachments, big tool output, exports), as bytes by key
    (S3 in the cloud). Keys are relative paths (`a/b.txt`): no leading `/`, no `.` or `..` segment."""

    async def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Store (or replace) the blob; returns the key."""
        ...

    async def get(self, key: str) -> bytes | None:
        """The blob, or None when there is none."""
        ...

    async def delete(self, key: str) -> bool:
        """True when a blob was deleted."""
        ...

    async def exists(self, key: str) -> bool: ...

    async def url(self, key: str, expires_s: int = 3600) -> str:
        """A time-limited URL that reads the blob without credentials (presigned GET)."""
        ...


class BlobUpload(Protocol):
    """One blob written in pieces (S3: a multipart upload): nothing is visible under its key until
    `finish`; `abort` drops what was sent."""

    async def write(self, data: bytes) -> None: ...

    async def copy(self, key: str, start: int, end: int) -> None:
        """Append bytes [start, end) of the blob `key` of the same store (S3: copied server-side
        where the range can be a part of its own)."""
        ...

    async def finish(self) -> int:
        """Make the blob visible; returns its size in bytes."""
        ...

    async def abort(self) -> None: ...


class BlobUploads(Protocol):
    """Blobs too large to hold in memory, written as a stream (the scheduled usage export)."""

    def upload(self, key: str, content_type: str = "application/octet-stream") -> BlobUpload: ...

    async def sizes(self, prefix: str) -> dict[str, int]:
        """Every blob whose key starts with `prefix`, with its size in bytes (keys as `upload` takes them)."""
        ...


class FileSystemFactory(Protocol):
    """Makes the `FileSystem` of a workspace root; `owner`: the (uid, gid) its new files get (as root)."""

    def __call__(self, root: Path, *, owner: tuple[int, int] | None = None) -> FileSystem: ...


class Env(Protocol):
    """Configuration values and secrets by name (the Resource layer's `Env`).

    Locally: the process environment. Cloud: the SSM parameters under a path, where a value
    `secret:<arn-or-name>` stands for a Secrets Manager secret. Values are never logged and never
    put in exception messages (names may be)."""

    async def get(self, name: str) -> str | None:
        """The value, or None when it is not set."""
        ...

    async def get_all(self, prefix: str = "") -> dict[str, str]:
        """Every value whose name starts with `prefix`, keyed by its whole name (as `get` takes it).
        The result is the caller's: changing it changes nothing else."""
        ...


class LLMProvider(Protocol):
    """Where a driver's credentials come from: a key given explicitly, else the environment
    (locally) or a Secrets Manager secret (cloud)."""

    async def api_key(self) -> str | None:
        """The LLM API key; None when none is configured (the offline scripted driver is used)."""
        ...


class Disk(Protocol):
    """A container's workspace as a local directory (what its tools see).

    Locally the directory is the durable copy. In the container tier it is a copy of the
    container's S3 prefix: `mount` pulls it, `sync` pushes what changed. `sync` and `unmount` of a
    container that is not mounted do nothing."""

    async def mount(self, tenant_id: str, container_id: str) -> Path:
        """Make the workspace available locally and return its directory; mounting a mounted
        workspace returns the same directory."""
        ...

    async def sync(self, tenant_id: str, container_id: str) -> None:
        """Make what changed in the directory durable now."""
        ...

    async def unmount(self, tenant_id: str, container_id: str) -> None:
        """Sync, then release the workspace (a later `mount` makes it available again)."""
        ...


class ProcessRunner(Protocol):
    """Runs a command confined to a root directory, with limits (the `Process` port)."""

    async def run(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], limits: Limits,
                  stdin: bytes | None = None) -> ProcessResult:
        """Run `argv` with exactly `env` in `cwd` (relative to the runner's root) until it exits,
        is killed or reaches a limit; never raises for what the process does."""
        ...

    async def sandboxed_argv(self, argv: Sequence[str], *, cwd: str, limits: Limits) -> tuple[list[str], str]:
        """The command line (and absolute cwd) that starts a long-running process (a stdio MCP server)
        confined as `run` confines a call, for the caller to spawn and own."""
        ...
