-- 001_initial: organizations, API keys and usage records (PostgreSQL; mirrors migrations/sqlite/001_initial.sql).
-- Applied by src/store/postgres/postgres-migrations.ts in its own transaction, together with its row in
-- schema_migrations, while the migrating instance holds the migration advisory lock. Do not put
-- BEGIN/COMMIT, SET or schema-qualified names (the schema is the connection's search_path) in migration files.
-- Times are epoch milliseconds and money integer microUSD, both bigint (the adapter reads them back as
-- JavaScript numbers and refuses a value outside the safe integer range).
-- Identifiers and names use COLLATE "C": byte order of UTF-8, exactly like SQLite's BINARY collation, so
-- ordering and keyset pagination do not depend on the database's locale.

CREATE TABLE organizations (
  id            text    COLLATE "C" NOT NULL CHECK (length(id) > 0),
  name          text    COLLATE "C" NOT NULL CHECK (length(name) > 0),
  paused        boolean NOT NULL DEFAULT false,
  created_at_ms bigint  NOT NULL CHECK (created_at_ms >= 0),
  CONSTRAINT organizations_pkey PRIMARY KEY (id),
  -- The adapter tells a taken name from a taken id by this constraint's name.
  CONSTRAINT organizations_name_key UNIQUE (name)
);

CREATE TABLE api_keys (
  id            text   COLLATE "C" NOT NULL CHECK (length(id) > 0),
  org_id        text   COLLATE "C" NOT NULL,
  name          text   NULL,
  -- sha256 of the raw key, lowercase hex: a raw key (tds_...) cannot be stored here by mistake.
  hash          text   COLLATE "C" NOT NULL CHECK (hash ~ '^[0-9a-f]{64}$'),
  created_at_ms bigint NOT NULL CHECK (created_at_ms >= 0),
  revoked_at_ms bigint NULL CHECK (revoked_at_ms IS NULL OR revoked_at_ms >= 0),
  CONSTRAINT api_keys_pkey PRIMARY KEY (id),
  CONSTRAINT api_keys_hash_key UNIQUE (hash),
  CONSTRAINT api_keys_org_id_fkey FOREIGN KEY (org_id) REFERENCES organizations (id) ON DELETE RESTRICT
);

CREATE INDEX api_keys_by_org ON api_keys (org_id, created_at_ms, id);

CREATE TABLE usage_records (
  request_id         text             COLLATE "C" NOT NULL CHECK (length(request_id) > 0),
  org_id             text             COLLATE "C" NOT NULL,
  key_id             text             COLLATE "C" NOT NULL,
  created_at_ms      bigint           NOT NULL CHECK (created_at_ms >= 0),
  source             text             NOT NULL CHECK (source IN ('api', 'playground')),
  model              text             NOT NULL,
  mode               text             NOT NULL CHECK (mode IN ('preview', 'paid')),
  outcome            text             NOT NULL CHECK (outcome IN ('succeeded', 'model_error', 'context_rejected', 'reservation_expired')),
  http_status        integer          NOT NULL CHECK (http_status BETWEEN 100 AND 599),
  input_tokens       bigint           NOT NULL CHECK (input_tokens >= 0),
  output_tokens      bigint           NOT NULL CHECK (output_tokens >= 0),
  cost_microusd      bigint           NOT NULL CHECK (cost_microusd >= 0),
  -- 'NaN' is excluded explicitly: in PostgreSQL NaN sorts above every number, so NaN >= 0 would hold.
  latency_ms         double precision NULL CHECK (latency_ms IS NULL OR (latency_ms >= 0 AND latency_ms <> 'NaN')),
  gateway_latency_ms double precision NOT NULL CHECK (gateway_latency_ms >= 0 AND gateway_latency_ms <> 'NaN'),
  error_detail       text             NULL,
  over_reservation   boolean          NOT NULL DEFAULT false,
  CONSTRAINT usage_records_pkey PRIMARY KEY (request_id)
);

-- Keyset pagination of one organization's usage, newest first.
CREATE INDEX usage_records_by_org_time ON usage_records (org_id, created_at_ms DESC, request_id DESC);
