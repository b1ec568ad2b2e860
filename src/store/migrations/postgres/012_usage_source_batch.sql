-- 012_usage_source_batch (PostgreSQL; mirrors migrations/sqlite/012_usage_source_batch.sql): every request of a
-- batch (POST /v1/batches) is recorded as a usage record with source 'batch'. Applied like 001.
-- The CHECK is replaced in place (its name from 001's column constraint). ADD CONSTRAINT scans usage_records once
-- under the ACCESS EXCLUSIVE lock that DROP CONSTRAINT takes; NOT VALID + VALIDATE would not shorten that lock here,
-- since the migration's transaction holds it until COMMIT either way.

ALTER TABLE usage_records
  DROP CONSTRAINT usage_records_source_check,
  ADD CONSTRAINT usage_records_source_check CHECK (source IN ('api', 'playground', 'batch'));
