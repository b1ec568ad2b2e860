-- 007_usage_daily (PostgreSQL; mirrors migrations/sqlite/007_usage_daily.sql): usage per organization and UTC day,
-- so that usage summaries read one row per organization and day instead of every record. Kept exact by the
-- transactions that write usage records (admission, completion, the sweep: INSERT … ON CONFLICT DO UPDATE with
-- increments); filled here from the records already stored. Applied like 001, in the migration's transaction:
-- usage_records is locked against writes (SHARE) while the backfill reads it, so that no record written meanwhile
-- is missed or counted twice. Instances of an earlier version do not keep this table: upgrade them all together.

CREATE TABLE usage_daily (
  org_id        text   COLLATE "C" NOT NULL,
  -- The UTC midnight that starts the day the records were created (accepted) on, epoch milliseconds.
  day_start_ms  bigint NOT NULL CHECK (day_start_ms >= 0 AND day_start_ms % 86400000 = 0),
  -- Accepted requests of every outcome: in flight, succeeded, or failed (any other final outcome).
  requests      bigint NOT NULL,
  in_flight     bigint NOT NULL,
  succeeded     bigint NOT NULL,
  failed        bigint NOT NULL,
  input_tokens  bigint NOT NULL,
  output_tokens bigint NOT NULL,
  cost_microusd bigint NOT NULL,
  -- The days of a period, every organization.
  CONSTRAINT usage_daily_pkey PRIMARY KEY (day_start_ms, org_id)
);

-- One organization's days of a period.
CREATE INDEX usage_daily_by_org ON usage_daily (org_id, day_start_ms);

LOCK TABLE usage_records IN SHARE MODE;

INSERT INTO usage_daily (org_id, day_start_ms, requests, in_flight, succeeded, failed, input_tokens, output_tokens, cost_microusd)
SELECT org_id, created_at_ms - created_at_ms % 86400000, count(*), count(*) FILTER (WHERE outcome = 'in_flight'),
  count(*) FILTER (WHERE outcome = 'succeeded'), count(*) FILTER (WHERE outcome NOT IN ('in_flight', 'succeeded')),
  sum(input_tokens), sum(output_tokens), sum(cost_microusd)
FROM usage_records
GROUP BY org_id, created_at_ms - created_at_ms % 86400000;

-- The totals no longer read usage records by time (006): one index less to write on every admission.
DROP INDEX usage_records_by_time;
