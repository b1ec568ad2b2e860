-- 008_instance_leases: each serving gateway process (instance) holds a lease it renews every few seconds, and
-- records itself on the usage records it admits, so that the work of a process that crashed is released at once
-- (its lease ended; on SQLite, which one process serves, anything admitted before this process started) instead of
-- waiting for the reservation TTL. Applied like 001 (one BEGIN IMMEDIATE transaction, no PRAGMAs here).

CREATE TABLE gateway_instances (
  id             TEXT    NOT NULL PRIMARY KEY CHECK (length(id) > 0),
  started_at_ms  INTEGER NOT NULL CHECK (started_at_ms >= 0),
  -- The process is gone once this has passed without a renewal (a clean shutdown ends it at once).
  lease_until_ms INTEGER NOT NULL
) STRICT;

-- The instance that admitted the request; NULL for records of earlier versions (left to the TTL sweep).
-- In-flight records are found through usage_records_in_flight (003): only requests in flight are ever looked up by it.
ALTER TABLE usage_records ADD COLUMN instance_id TEXT NULL;
