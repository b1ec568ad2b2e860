-- 004_usage_by_outcome (PostgreSQL; mirrors migrations/sqlite/004_usage_by_outcome.sql): GET /v1/usage?outcome=…
-- pages one organization's records of one outcome, newest first, by index. Without it the outcome filter is
-- checked row by row along usage_records_by_org_time, so a page of a rare outcome reads every newer record of the
-- organization. Applied like 001 (in the migration's transaction: CREATE INDEX locks writes to usage_records
-- while it builds, which is brief for the tables this service keeps).
CREATE INDEX usage_records_by_org_outcome_time ON usage_records (org_id, outcome, created_at_ms DESC, request_id DESC);
