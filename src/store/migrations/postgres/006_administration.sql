-- 006_administration (PostgreSQL; mirrors migrations/sqlite/006_administration.sql): the audit log of
-- administrative changes, the idempotency keys of admin credit grants, and the indexes the admin pages read by:
-- usage totals across organizations by time, organizations by creation. Applied like 001 (in the migration's
-- transaction: CREATE INDEX locks writes to usage_records while it builds, which is brief for the tables this
-- service keeps).

-- Append-only: one entry per change, written in the change's own transaction. Never holds a key or its hash.
CREATE TABLE admin_audit (
  id             bigint GENERATED ALWAYS AS IDENTITY,
  created_at_ms  bigint NOT NULL,
  action         text   NOT NULL CHECK (action IN ('organization.created', 'organization.paused', 'organization.resumed',
                                                   'key.created', 'key.revoked', 'credits.granted')),
  org_id         text   COLLATE "C" NOT NULL,
  -- The organization's id, or the key's id for key actions.
  target_id      text   COLLATE "C" NOT NULL,
  source         text   NOT NULL CHECK (source IN ('cli', 'http')),
  -- The admin API caller's own label, and its address; NULL from the CLI.
  client         text   NULL,
  remote_address text   NULL,
  -- A JSON object of the action's facts (names, amount and note of a grant), as text.
  details        text   NOT NULL CHECK (json_typeof(details::json) = 'object'),
  CONSTRAINT admin_audit_pkey PRIMARY KEY (id)
);

-- Newest first overall is the primary key; per organization, this.
CREATE INDEX admin_audit_by_org ON admin_audit (org_id, id);

-- Idempotency-Key of admin credit grants: the balance the grant answered, replayed for the same request.
CREATE TABLE admin_idempotency (
  key           text   COLLATE "C" NOT NULL CHECK (length(key) > 0),
  request_hash  text   NOT NULL,
  -- The balance JSON the grant answered.
  response      text   NOT NULL CHECK (json_typeof(response::json) = 'object'),
  created_at_ms bigint NOT NULL,
  expires_at_ms bigint NOT NULL,
  CONSTRAINT admin_idempotency_pkey PRIMARY KEY (key)
);

-- The purge job: expired entries.
CREATE INDEX admin_idempotency_by_expiry ON admin_idempotency (expires_at_ms);

-- Usage totals of every organization over a time window.
CREATE INDEX usage_records_by_time ON usage_records (created_at_ms);
-- Keyset pagination of organizations, oldest first.
CREATE INDEX organizations_by_creation ON organizations (created_at_ms, id);
