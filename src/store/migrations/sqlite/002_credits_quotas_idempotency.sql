-- 002_credits_quotas_idempotency: credit balances, reservations, the credit ledger, preview day
-- counters and idempotency keys. Applied like 001 (one BEGIN IMMEDIATE transaction, no PRAGMAs here).
-- Money is integer microUSD (1 USD = 1,000,000). Times are epoch milliseconds.

-- One row per organization that ever had credits. The CHECKs are invariant 1 of ARCHITECTURE.md:
-- a statement that would break it fails instead of being stored.
CREATE TABLE org_balances (
  org_id    TEXT    NOT NULL PRIMARY KEY REFERENCES organizations (id) ON DELETE RESTRICT,
  available INTEGER NOT NULL DEFAULT 0 CHECK (available >= 0),
  reserved  INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
  -- Sum of settled costs.
  spent     INTEGER NOT NULL DEFAULT 0 CHECK (spent >= 0),
  granted   INTEGER NOT NULL DEFAULT 0 CHECK (granted >= 0),
  CHECK (granted - spent = available + reserved)
) STRICT;

-- pending → exactly one of settled | released | expired (every UPDATE is guarded by status = 'pending').
CREATE TABLE reservations (
  id             TEXT    NOT NULL PRIMARY KEY CHECK (length(id) > 0),
  org_id         TEXT    NOT NULL REFERENCES organizations (id) ON DELETE RESTRICT,
  request_id     TEXT    NOT NULL CHECK (length(request_id) > 0),
  amount_microusd INTEGER NOT NULL CHECK (amount_microusd >= 0),
  status         TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'settled', 'released', 'expired')),
  -- The charged amount, set only when settled; never more than the reservation.
  cost_microusd  INTEGER NULL CHECK (cost_microusd IS NULL OR (cost_microusd >= 0 AND cost_microusd <= amount_microusd)),
  created_at_ms  INTEGER NOT NULL CHECK (created_at_ms >= 0),
  expires_at_ms  INTEGER NOT NULL,
  resolved_at_ms INTEGER NULL,
  CHECK ((status = 'settled') = (cost_microusd IS NOT NULL)),
  CHECK ((status = 'pending') = (resolved_at_ms IS NULL))
) STRICT;

-- The expiry sweep: pending reservations by expiry time.
CREATE INDEX reservations_by_status_expiry ON reservations (status, expires_at_ms);

-- Append-only. Per column, the entries of an organization sum to its org_balances row.
CREATE TABLE ledger_entries (
  id              INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
  org_id          TEXT    NOT NULL REFERENCES organizations (id) ON DELETE RESTRICT,
  kind            TEXT    NOT NULL CHECK (kind IN ('grant', 'reserve', 'settle', 'release', 'expire')),
  reservation_id  TEXT    NULL REFERENCES reservations (id) ON DELETE RESTRICT,
  available_delta INTEGER NOT NULL,
  reserved_delta  INTEGER NOT NULL,
  spent_delta     INTEGER NOT NULL,
  granted_delta   INTEGER NOT NULL,
  created_at_ms   INTEGER NOT NULL,
  note            TEXT    NULL,
  -- A grant has no reservation; every other entry belongs to one.
  CHECK ((kind = 'grant') = (reservation_id IS NULL)),
  -- Each entry keeps granted − spent = available + reserved.
  CHECK (granted_delta - spent_delta = available_delta + reserved_delta)
) STRICT;

CREATE INDEX ledger_entries_by_org ON ledger_entries (org_id, id);

-- Preview requests counted per UTC day ('YYYY-MM-DD'): the reset at 00:00 UTC needs no job.
-- scope is an organization id, or '*' for the whole service.
CREATE TABLE preview_counters (
  scope TEXT    NOT NULL CHECK (length(scope) > 0),
  day   TEXT    NOT NULL CHECK (length(day) = 10 AND day GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]'),
  count INTEGER NOT NULL CHECK (count >= 0),
  PRIMARY KEY (scope, day)
) STRICT;

-- Idempotency-Key claims and the responses kept for replays, per organization.
CREATE TABLE idempotency_keys (
  org_id              TEXT    NOT NULL,
  key                 TEXT    NOT NULL CHECK (length(key) > 0),
  request_hash        TEXT    NOT NULL,
  -- The request that holds the claim (or produced the kept response).
  request_id          TEXT    NOT NULL,
  state               TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
  response_status     INTEGER NULL CHECK (response_status IS NULL OR response_status BETWEEN 100 AND 599),
  response_body       TEXT    NULL,
  response_request_id TEXT    NULL,
  lock_until_ms       INTEGER NOT NULL,
  expires_at_ms       INTEGER NOT NULL,
  PRIMARY KEY (org_id, key),
  CHECK ((state = 'completed') = (response_status IS NOT NULL AND response_body IS NOT NULL AND response_request_id IS NOT NULL)),
  CHECK (state = 'completed' OR (response_status IS NULL AND response_body IS NULL AND response_request_id IS NULL))
) STRICT;
