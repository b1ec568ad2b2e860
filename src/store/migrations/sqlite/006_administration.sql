-- 006_administration: the audit log of administrative changes, the idempotency keys of admin credit grants, and
-- the indexes the admin pages read by: usage totals across organizations by time, organizations by creation.
-- Applied like 001 (one BEGIN IMMEDIATE transaction, no PRAGMAs here). Times are epoch milliseconds.

-- Append-only: one entry per change, written in the change's own transaction. Never holds a key or its hash.
CREATE TABLE admin_audit (
  id             INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
  created_at_ms  INTEGER NOT NULL,
  action         TEXT    NOT NULL CHECK (action IN ('organization.created', 'organization.paused', 'organization.resumed',
                                                    'key.created', 'key.revoked', 'credits.granted')),
  org_id         TEXT    NOT NULL,
  -- The organization's id, or the key's id for key actions.
  target_id      TEXT    NOT NULL,
  source         TEXT    NOT NULL CHECK (source IN ('cli', 'http')),
  -- The admin API caller's own label, and its address; NULL from the CLI.
  client         TEXT    NULL,
  remote_address TEXT    NULL,
  -- A JSON object of the action's facts (names, amount and note of a grant).
  details        TEXT    NOT NULL CHECK (json_valid(details) AND json_type(details) = 'object')
) STRICT;

-- Newest first overall is the primary key; per organization, this.
CREATE INDEX admin_audit_by_org ON admin_audit (org_id, id);

-- Idempotency-Key of admin credit grants: the balance the grant answered, replayed for the same request.
CREATE TABLE admin_idempotency (
  key           TEXT    NOT NULL PRIMARY KEY CHECK (length(key) > 0),
  request_hash  TEXT    NOT NULL,
  -- The balance JSON the grant answered.
  response      TEXT    NOT NULL CHECK (json_valid(response) AND json_type(response) = 'object'),
  created_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL
) STRICT;

-- The purge job: expired entries.
CREATE INDEX admin_idempotency_by_expiry ON admin_idempotency (expires_at_ms);

-- Usage totals of every organization over a time window.
CREATE INDEX usage_records_by_time ON usage_records (created_at_ms);
-- Keyset pagination of organizations, oldest first.
CREATE INDEX organizations_by_creation ON organizations (created_at_ms, id);
