"""Versioned schema migrations for the SQLite store (PRAGMA user_version holds the version)."""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: the foundation schema. Every table is keyed by tenant first.
    """
    CREATE TABLE containers (
        tenant_id TEXT NOT NULL,
        container_id TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, container_id)
    ) WITHOUT ROWID;

    CREATE TABLE images (
        tenant_id TEXT NOT NULL,
        image_id TEXT NOT NULL,
        container_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        name TEXT NOT NULL,
        description TEXT,
        system_prompt TEXT,
        config TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, image_id)
    ) WITHOUT ROWID;
    CREATE INDEX images_by_container ON images (tenant_id, container_id, created_at);
    CREATE INDEX images_by_tenant ON images (tenant_id, created_at);

    CREATE TABLE sessions (
        tenant_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        image_id TEXT NOT NULL,
        container_id TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        seq_reserved INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (tenant_id, session_id)
    ) WITHOUT ROWID;

    CREATE TABLE agents (
        tenant_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        image_id TEXT NOT NULL,
        container_id TEXT NOT NULL,
        name TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, agent_id)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX agents_by_image ON agents (tenant_id, image_id);
    CREATE INDEX agents_by_container ON agents (tenant_id, container_id);

    CREATE TABLE messages (
        pos INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        turn_id TEXT,
        body TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE UNIQUE INDEX messages_by_id ON messages (tenant_id, session_id, message_id);
    CREATE INDEX messages_by_session ON messages (tenant_id, session_id, pos);

    CREATE TABLE events (
        tenant_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        payload TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, session_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX events_by_age ON events (created_at);

    CREATE TABLE turns (
        tenant_id TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        image_id TEXT NOT NULL,
        container_id TEXT NOT NULL,
        user_message_id TEXT NOT NULL,
        status TEXT NOT NULL,
        tier TEXT NOT NULL,
        model TEXT,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cache_read_tokens INTEGER NOT NULL DEFAULT 0,
        cache_write_tokens INTEGER NOT NULL DEFAULT 0,
        list_cost TEXT NOT NULL DEFAULT '0',
        billed_cost TEXT NOT NULL DEFAULT '0',
        error_code TEXT,
        error_message TEXT,
        created_at INTEGER NOT NULL,
        started_at INTEGER,
        ended_at INTEGER,
        PRIMARY KEY (tenant_id, turn_id)
    ) WITHOUT ROWID;
    CREATE INDEX turns_by_session ON turns (tenant_id, session_id, created_at);
    CREATE INDEX turns_by_status ON turns (status);
    """,
    # 2: the resource center. Visibility belongs to the resource; description and tags to each
    # version. The partial index keeps a published kind/name unique across tenants.
    """
    CREATE TABLE resources (
        tenant_id TEXT NOT NULL,
        resource_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        published INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (tenant_id, resource_id)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX resources_by_name ON resources (tenant_id, kind, name);
    CREATE UNIQUE INDEX resources_published ON resources (kind, name) WHERE published = 1;
    CREATE INDEX resources_by_id ON resources (resource_id);

    CREATE TABLE resource_versions (
        tenant_id TEXT NOT NULL,
        resource_id TEXT NOT NULL,
        version TEXT NOT NULL,
        version_key TEXT NOT NULL,
        content TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        dependencies TEXT NOT NULL,
        description TEXT NOT NULL,
        tags TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, resource_id, version)
    ) WITHOUT ROWID;
    CREATE INDEX resource_versions_by_key ON resource_versions (tenant_id, resource_id, version_key);
    """,
    # 3: the configuration center's runtime layer (values set through /v1/config) and its audit
    # trail. Not per tenant: the configuration belongs to the deployment.
    """
    CREATE TABLE config_values (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        secret INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    ) WITHOUT ROWID;

    CREATE TABLE config_audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL,
        old TEXT,
        new TEXT,
        actor TEXT NOT NULL,
        at INTEGER NOT NULL
    );
    CREATE INDEX config_audit_by_at ON config_audit (at);
    """,
    # 4: several sessions per image: a title, and the sessions of an image in creation order.
    """
    ALTER TABLE sessions ADD COLUMN title TEXT;
    CREATE INDEX sessions_by_image ON sessions (tenant_id, image_id, created_at);
    """,
    # 5: the turn log: what ran each turn, its task and per-turn options; the tenant's turns by time.
    """
    ALTER TABLE turns ADD COLUMN agent TEXT;
    ALTER TABLE turns ADD COLUMN task TEXT;
    ALTER TABLE turns ADD COLUMN options TEXT;
    CREATE INDEX turns_by_tenant ON turns (tenant_id, created_at, turn_id);
    """,
    # 6: full-text search of messages (agentvm.domain.message_text). One row per message with
    # searchable text, its rowid the message's `pos`; written with the message, deleted with its
    # session. The messages already stored are indexed here, through `avm_searchable_text`, the
    # Python extraction the store registers on its connection before migrating.
    """
    CREATE VIRTUAL TABLE message_search USING fts5(text, tenant_id UNINDEXED, tokenize='porter unicode61');
    INSERT INTO message_search (rowid, text, tenant_id)
        SELECT pos, text, tenant_id FROM (SELECT pos, tenant_id, avm_searchable_text(body) AS text FROM messages)
        WHERE text <> '';
    """,
    # 7: API keys of `avm serve` (salted hashes only; docs/tenancy.md).
    """
    CREATE TABLE api_keys (
        key_id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        salt TEXT NOT NULL,
        secret_hash TEXT NOT NULL,
        scopes TEXT NOT NULL,
        name TEXT,
        created_at INTEGER NOT NULL,
        expires_at INTEGER,
        revoked_at INTEGER
    ) WITHOUT ROWID;
    CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);
    """,
    # 8: the usage ledger (agentvm.domain.usage): one record per LLM call or container-tier turn's
    # sandbox time, written once; budgets of tenants (key_id '') and keys; each budget's monthly
    # counters (settled and reserved billed cost, Decimal text); the per-minute rate windows; and
    # the key that started each turn.
    """
    CREATE TABLE usage_records (
        tenant_id TEXT NOT NULL,
        record_id TEXT NOT NULL,
        key_id TEXT,
        container_id TEXT NOT NULL,
        image_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        provider TEXT NOT NULL,
        model TEXT,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cache_read_tokens INTEGER NOT NULL,
        cache_write_tokens INTEGER NOT NULL,
        sandbox_ms INTEGER NOT NULL,
        list_cost TEXT NOT NULL,
        billed_cost TEXT NOT NULL,
        currency TEXT NOT NULL,
        tier TEXT NOT NULL,
        status TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        ended_at INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, record_id)
    ) WITHOUT ROWID;
    CREATE INDEX usage_by_tenant_time ON usage_records (tenant_id, ended_at);
    CREATE INDEX usage_by_time ON usage_records (ended_at);
    CREATE TABLE budgets (
        tenant_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        monthly TEXT,
        requests_per_minute INTEGER,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, key_id)
    ) WITHOUT ROWID;
    CREATE TABLE spend (
        tenant_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        period TEXT NOT NULL,
        spent TEXT NOT NULL,
        reserved TEXT NOT NULL,
        PRIMARY KEY (tenant_id, key_id, period)
    ) WITHOUT ROWID;
    CREATE TABLE rate_windows (
        tenant_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        minute INTEGER NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, key_id, minute)
    ) WITHOUT ROWID;
    ALTER TABLE turns ADD COLUMN key_id TEXT;
    """,
    # 9: each budget hold names its turn, so a turn whose runner died can give its hold back
    """
    CREATE TABLE holds (
        tenant_id TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        period TEXT NOT NULL,
        amount TEXT NOT NULL,
        PRIMARY KEY (tenant_id, turn_id)
    ) WITHOUT ROWID;
    """,
    # 10: the turn log keeps each turn's first-token latency (the cloud's /v1/metrics reads it there)
    """
    ALTER TABLE turns ADD COLUMN first_token_ms INTEGER;
    """,
    # 11: a usage record says whether its output tokens are an estimate (a stream that broke after
    # output was streamed: docs/billing.md)
    """
    ALTER TABLE usage_records ADD COLUMN usage_estimated INTEGER NOT NULL DEFAULT 0;
    """,
    # 12: a usage record keeps the list prices and markup it was billed at (domain.usage.UnitPrices text;
    # NULL for sandbox time and older records)
    """
    ALTER TABLE usage_records ADD COLUMN unit_prices TEXT;
    """,
]
