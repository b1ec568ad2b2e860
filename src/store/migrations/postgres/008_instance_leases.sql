-- 008_instance_leases (PostgreSQL; mirrors migrations/sqlite/008_instance_leases.sql): each serving gateway process
-- (instance) holds a lease it renews every few seconds, and records itself on the usage records it admits, so that
-- the in-flight work of an instance whose lease ended (it crashed or was killed) is released at once by any other
-- instance, or by the next one to start, instead of waiting for the reservation TTL. Applied like 001. Adding a
-- nullable column without a default does not rewrite the table. Instances of an earlier version record no instance:
-- their work is left to the TTL sweep, as before.

CREATE TABLE gateway_instances (
  id             text   COLLATE "C" NOT NULL CHECK (length(id) > 0),
  started_at_ms  bigint NOT NULL CHECK (started_at_ms >= 0),
  -- The instance is gone once this has passed without a renewal (a clean shutdown ends it at once).
  lease_until_ms bigint NOT NULL,
  CONSTRAINT gateway_instances_pkey PRIMARY KEY (id)
);

-- The instance that admitted the request; NULL for records of earlier versions. In-flight records are found through
-- usage_records_in_flight (003): only requests in flight are ever looked up by it.
ALTER TABLE usage_records ADD COLUMN instance_id text COLLATE "C" NULL;
