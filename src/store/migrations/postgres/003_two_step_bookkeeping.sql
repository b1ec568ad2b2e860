-- 003_two_step_bookkeeping (PostgreSQL; mirrors migrations/sqlite/003_two_step_bookkeeping.sql). A request is
-- recorded at admission (outcome 'in_flight') and made final at completion; 'gateway_error' is the final outcome
-- of a request the gateway could not finish (nothing charged). Idempotency entries may be completed without a
-- kept body (the response was too large to keep), and the purge job finds expired entries and old preview
-- counters by index. Applied like 001.

ALTER TABLE usage_records ADD COLUMN completed_at_ms bigint NULL CHECK (completed_at_ms IS NULL OR completed_at_ms >= 0);
UPDATE usage_records SET completed_at_ms = created_at_ms;
ALTER TABLE usage_records DROP CONSTRAINT usage_records_outcome_check;
ALTER TABLE usage_records ADD CONSTRAINT usage_records_outcome_check
  CHECK (outcome IN ('in_flight', 'succeeded', 'model_error', 'context_rejected', 'reservation_expired', 'gateway_error'));
-- The status the client got; NULL while in flight, and when no answer is known (completed by the sweep).
ALTER TABLE usage_records ALTER COLUMN http_status DROP NOT NULL;
ALTER TABLE usage_records ADD CONSTRAINT usage_records_completed_check CHECK ((outcome = 'in_flight') = (completed_at_ms IS NULL));
ALTER TABLE usage_records ADD CONSTRAINT usage_records_in_flight_status_check CHECK (outcome <> 'in_flight' OR http_status IS NULL);
-- The sweep: requests still in flight, oldest first.
CREATE INDEX usage_records_in_flight ON usage_records (created_at_ms) WHERE outcome = 'in_flight';

ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_check;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_check1;
-- response_body is NULL once completed when the response was too large to keep for replays.
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_completed_check
  CHECK ((state = 'completed') = (response_status IS NOT NULL AND response_request_id IS NOT NULL));
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_body_check CHECK (state = 'completed' OR response_body IS NULL);

-- The purge job: expired idempotency entries, preview counters of past days.
CREATE INDEX idempotency_keys_by_expiry ON idempotency_keys (expires_at_ms);
CREATE INDEX preview_counters_by_day ON preview_counters (day);
