-- 001_initial: organizations, API keys and usage records.
-- Applied by src/store/sqlite/migrations.ts inside one BEGIN IMMEDIATE transaction, together with its
-- row in schema_migrations. Do not put BEGIN/COMMIT or PRAGMA statements in migration files.
-- STRICT tables: a value of the wrong type is an error instead of being stored as-is.
-- Times are epoch milliseconds; booleans are 0/1.

CREATE TABLE organizations (
  id            TEXT    NOT NULL PRIMARY KEY CHECK (length(id) > 0),
  name          TEXT    NOT NULL UNIQUE CHECK (length(name) > 0),
  paused        INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
  created_at_ms INTEGER NOT NULL CHECK (created_at_ms >= 0)
) STRICT;

CREATE TABLE api_keys (
  id            TEXT    NOT NULL PRIMARY KEY CHECK (length(id) > 0),
  org_id        TEXT    NOT NULL REFERENCES organizations (id) ON DELETE RESTRICT,
  name          TEXT    NULL,
  -- sha256 of the raw key, lowercase hex: a raw key (tds_...) cannot be stored here by mistake.
  hash          TEXT    NOT NULL UNIQUE CHECK (length(hash) = 64 AND hash NOT GLOB '*[^0-9a-f]*'),
  created_at_ms INTEGER NOT NULL CHECK (created_at_ms >= 0),
  revoked_at_ms INTEGER NULL CHECK (revoked_at_ms IS NULL OR revoked_at_ms >= 0)
) STRICT;

CREATE INDEX api_keys_by_org ON api_keys (org_id, created_at_ms, id);

CREATE TABLE usage_records (
  request_id         TEXT    NOT NULL PRIMARY KEY CHECK (length(request_id) > 0),
  org_id             TEXT    NOT NULL,
  key_id             TEXT    NOT NULL,
  created_at_ms      INTEGER NOT NULL CHECK (created_at_ms >= 0),
  source             TEXT    NOT NULL CHECK (source IN ('api', 'playground')),
  model              TEXT    NOT NULL,
  mode               TEXT    NOT NULL CHECK (mode IN ('preview', 'paid')),
  outcome            TEXT    NOT NULL CHECK (outcome IN ('succeeded', 'model_error', 'context_rejected', 'reservation_expired')),
  http_status        INTEGER NOT NULL CHECK (http_status BETWEEN 100 AND 599),
  input_tokens       INTEGER NOT NULL CHECK (input_tokens >= 0),
  output_tokens      INTEGER NOT NULL CHECK (output_tokens >= 0),
  cost_microusd      INTEGER NOT NULL CHECK (cost_microusd >= 0),
  latency_ms         REAL    NULL CHECK (latency_ms IS NULL OR latency_ms >= 0),
  gateway_latency_ms REAL    NOT NULL CHECK (gateway_latency_ms >= 0),
  error_detail       TEXT    NULL,
  over_reservation   INTEGER NOT NULL DEFAULT 0 CHECK (over_reservation IN (0, 1))
) STRICT;

-- Keyset pagination of one organization's usage, newest first.
CREATE INDEX usage_records_by_org_time ON usage_records (org_id, created_at_ms DESC, request_id DESC);
