-- 012_usage_source_batch: every request of a batch (POST /v1/batches) is recorded as a usage record with source
-- 'batch'. Applied like 001 (one BEGIN IMMEDIATE transaction, no PRAGMAs here); SQLite cannot change a CHECK in
-- place, so usage_records is rebuilt as in 003: every column, constraint and default as before (only the source
-- CHECK allows 'batch'), the rows copied, and its indexes made again. No table, trigger or view refers to it.

CREATE TABLE usage_records_012 (
  request_id                TEXT    NOT NULL PRIMARY KEY CHECK (length(request_id) > 0),
  org_id                    TEXT    NOT NULL,
  key_id                    TEXT    NOT NULL,
  created_at_ms             INTEGER NOT NULL CHECK (created_at_ms >= 0),
  source                    TEXT    NOT NULL CHECK (source IN ('api', 'playground', 'batch')),
  model                     TEXT    NOT NULL,
  mode                      TEXT    NOT NULL CHECK (mode IN ('preview', 'paid')),
  outcome                   TEXT    NOT NULL CHECK (outcome IN ('in_flight', 'succeeded', 'model_error', 'context_rejected', 'reservation_expired', 'gateway_error')),
  -- The status the client got; NULL while in flight, and when no answer is known (completed by the sweep).
  http_status               INTEGER NULL CHECK (http_status IS NULL OR http_status BETWEEN 100 AND 599),
  input_tokens              INTEGER NOT NULL CHECK (input_tokens >= 0),
  output_tokens             INTEGER NOT NULL CHECK (output_tokens >= 0),
  cost_microusd             INTEGER NOT NULL CHECK (cost_microusd >= 0),
  latency_ms                REAL    NULL CHECK (latency_ms IS NULL OR latency_ms >= 0),
  gateway_latency_ms        REAL    NOT NULL CHECK (gateway_latency_ms >= 0),
  error_detail              TEXT    NULL,
  over_reservation          INTEGER NOT NULL DEFAULT 0 CHECK (over_reservation IN (0, 1)),
  completed_at_ms           INTEGER NULL CHECK (completed_at_ms IS NULL OR completed_at_ms >= 0),
  deployment                TEXT    NULL,
  attempts                  INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  -- The instance that admitted the request; NULL for records of versions before 008.
  instance_id               TEXT    NULL,
  -- The credits set aside at admission; NULL: the request reserved nothing (preview).
  reserved_microusd         INTEGER NULL CHECK (reserved_microusd >= 0),
  reservation_expires_at_ms INTEGER NULL
    CHECK ((reservation_expires_at_ms IS NULL) = (reserved_microusd IS NULL)),
  -- pending while in flight, then exactly one of settled | released | expired, written with the final record. Only
  -- a settled reservation charges, never more than it set aside.
  reservation_status        TEXT    NULL
    CHECK ((reservation_status IS NULL) = (reserved_microusd IS NULL)
      AND (reservation_status IS NULL OR (
        reservation_status IN ('pending', 'settled', 'released', 'expired')
        AND (reservation_status = 'pending') = (outcome = 'in_flight')
        AND (cost_microusd = 0 OR (reservation_status = 'settled' AND cost_microusd <= reserved_microusd))))),
  CHECK ((outcome = 'in_flight') = (completed_at_ms IS NULL)),
  CHECK (outcome <> 'in_flight' OR http_status IS NULL)
) STRICT;

INSERT INTO usage_records_012 (request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens,
  output_tokens, cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms, deployment, attempts,
  instance_id, reserved_microusd, reservation_expires_at_ms, reservation_status)
SELECT request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens,
  output_tokens, cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms, deployment, attempts,
  instance_id, reserved_microusd, reservation_expires_at_ms, reservation_status
FROM usage_records;

DROP TABLE usage_records;
ALTER TABLE usage_records_012 RENAME TO usage_records;

-- Keyset pagination of one organization's usage, newest first.
CREATE INDEX usage_records_by_org_time ON usage_records (org_id, created_at_ms DESC, request_id DESC);
-- The sweep: requests still in flight, oldest first.
CREATE INDEX usage_records_in_flight ON usage_records (created_at_ms) WHERE outcome = 'in_flight';
-- One organization's records of one outcome, newest first.
CREATE INDEX usage_records_by_org_outcome_time ON usage_records (org_id, outcome, created_at_ms DESC, request_id DESC);
