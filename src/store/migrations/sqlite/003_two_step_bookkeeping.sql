-- 003_two_step_bookkeeping: a request is recorded at admission (outcome 'in_flight') and made final at
-- completion; 'gateway_error' is the final outcome of a request the gateway could not finish (nothing charged).
-- Idempotency entries may be completed without a kept body (the response was too large to keep), and the
-- purge job finds expired entries and old preview counters by index. Applied like 001 (one BEGIN IMMEDIATE
-- transaction, no PRAGMAs here); SQLite cannot change a CHECK in place, so both tables are rebuilt.

CREATE TABLE usage_records_003 (
  request_id         TEXT    NOT NULL PRIMARY KEY CHECK (length(request_id) > 0),
  org_id             TEXT    NOT NULL,
  key_id             TEXT    NOT NULL,
  created_at_ms      INTEGER NOT NULL CHECK (created_at_ms >= 0),
  source             TEXT    NOT NULL CHECK (source IN ('api', 'playground')),
  model              TEXT    NOT NULL,
  mode               TEXT    NOT NULL CHECK (mode IN ('preview', 'paid')),
  outcome            TEXT    NOT NULL CHECK (outcome IN ('in_flight', 'succeeded', 'model_error', 'context_rejected', 'reservation_expired', 'gateway_error')),
  -- The status the client got; NULL while in flight, and when no answer is known (completed by the sweep).
  http_status        INTEGER NULL CHECK (http_status IS NULL OR http_status BETWEEN 100 AND 599),
  input_tokens       INTEGER NOT NULL CHECK (input_tokens >= 0),
  output_tokens      INTEGER NOT NULL CHECK (output_tokens >= 0),
  cost_microusd      INTEGER NOT NULL CHECK (cost_microusd >= 0),
  latency_ms         REAL    NULL CHECK (latency_ms IS NULL OR latency_ms >= 0),
  gateway_latency_ms REAL    NOT NULL CHECK (gateway_latency_ms >= 0),
  error_detail       TEXT    NULL,
  over_reservation   INTEGER NOT NULL DEFAULT 0 CHECK (over_reservation IN (0, 1)),
  completed_at_ms    INTEGER NULL CHECK (completed_at_ms IS NULL OR completed_at_ms >= 0),
  CHECK ((outcome = 'in_flight') = (completed_at_ms IS NULL)),
  CHECK (outcome <> 'in_flight' OR http_status IS NULL)
) STRICT;

INSERT INTO usage_records_003 (request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens,
  output_tokens, cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms)
SELECT request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens,
  output_tokens, cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, created_at_ms
FROM usage_records;

DROP TABLE usage_records;
ALTER TABLE usage_records_003 RENAME TO usage_records;

-- Keyset pagination of one organization's usage, newest first.
CREATE INDEX usage_records_by_org_time ON usage_records (org_id, created_at_ms DESC, request_id DESC);
-- The sweep: requests still in flight, oldest first.
CREATE INDEX usage_records_in_flight ON usage_records (created_at_ms) WHERE outcome = 'in_flight';

CREATE TABLE idempotency_keys_003 (
  org_id              TEXT    NOT NULL,
  key                 TEXT    NOT NULL CHECK (length(key) > 0),
  request_hash        TEXT    NOT NULL,
  -- The request that holds the claim (or produced the kept response).
  request_id          TEXT    NOT NULL,
  state               TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
  response_status     INTEGER NULL CHECK (response_status IS NULL OR response_status BETWEEN 100 AND 599),
  -- NULL once completed when the response was too large to keep for replays.
  response_body       TEXT    NULL,
  response_request_id TEXT    NULL,
  lock_until_ms       INTEGER NOT NULL,
  expires_at_ms       INTEGER NOT NULL,
  PRIMARY KEY (org_id, key),
  CHECK ((state = 'completed') = (response_status IS NOT NULL AND response_request_id IS NOT NULL)),
  CHECK (state = 'completed' OR response_body IS NULL)
) STRICT;

INSERT INTO idempotency_keys_003 SELECT org_id, key, request_hash, request_id, state, response_status, response_body, response_request_id,
  lock_until_ms, expires_at_ms FROM idempotency_keys;
DROP TABLE idempotency_keys;
ALTER TABLE idempotency_keys_003 RENAME TO idempotency_keys;

-- The purge job: expired idempotency entries, preview counters of past days.
CREATE INDEX idempotency_keys_by_expiry ON idempotency_keys (expires_at_ms);
CREATE INDEX preview_counters_by_day ON preview_counters (day);
