-- 004_usage_by_outcome: GET /v1/usage?outcome=… pages one organization's records of one outcome, newest first,
-- by index. Without it the outcome filter is checked row by row along usage_records_by_org_time, so a page of a
-- rare outcome reads every newer record of the organization. Applied like 001.
CREATE INDEX usage_records_by_org_outcome_time ON usage_records (org_id, outcome, created_at_ms DESC, request_id DESC);
