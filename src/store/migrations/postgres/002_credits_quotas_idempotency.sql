-- 002_credits_quotas_idempotency: credit balances, reservations, the credit ledger, preview day counters and
-- idempotency keys (PostgreSQL; mirrors migrations/sqlite/002_credits_quotas_idempotency.sql). Applied like 001.
-- Money is integer microUSD (1 USD = 1,000,000) and times epoch milliseconds, both bigint.

-- One row per organization that ever had credits. The CHECKs are invariant 1 of ARCHITECTURE.md:
-- a statement that would break it fails instead of being stored.
CREATE TABLE org_balances (
  org_id    text   COLLATE "C" NOT NULL,
  available bigint NOT NULL DEFAULT 0 CHECK (available >= 0),
  reserved  bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
  -- Sum of settled costs.
  spent     bigint NOT NULL DEFAULT 0 CHECK (spent >= 0),
  granted   bigint NOT NULL DEFAULT 0 CHECK (granted >= 0),
  CHECK (granted - spent = available + reserved),
  CONSTRAINT org_balances_pkey PRIMARY KEY (org_id),
  CONSTRAINT org_balances_org_id_fkey FOREIGN KEY (org_id) REFERENCES organizations (id) ON DELETE RESTRICT
);

-- pending → exactly one of settled | released | expired (every UPDATE is guarded by status = 'pending').
CREATE TABLE reservations (
  id              text   COLLATE "C" NOT NULL CHECK (length(id) > 0),
  org_id          text   COLLATE "C" NOT NULL,
  request_id      text   COLLATE "C" NOT NULL CHECK (length(request_id) > 0),
  amount_microusd bigint NOT NULL CHECK (amount_microusd >= 0),
  status          text   NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'settled', 'released', 'expired')),
  -- The charged amount, set only when settled; never more than the reservation.
  cost_microusd   bigint NULL CHECK (cost_microusd IS NULL OR (cost_microusd >= 0 AND cost_microusd <= amount_microusd)),
  created_at_ms   bigint NOT NULL CHECK (created_at_ms >= 0),
  expires_at_ms   bigint NOT NULL,
  resolved_at_ms  bigint NULL,
  CHECK ((status = 'settled') = (cost_microusd IS NOT NULL)),
  CHECK ((status = 'pending') = (resolved_at_ms IS NULL)),
  CONSTRAINT reservations_pkey PRIMARY KEY (id),
  CONSTRAINT reservations_org_id_fkey FOREIGN KEY (org_id) REFERENCES organizations (id) ON DELETE RESTRICT
);

-- The expiry sweep: pending reservations by expiry time.
CREATE INDEX reservations_by_status_expiry ON reservations (status, expires_at_ms);

-- Append-only. Per column, the entries of an organization sum to its org_balances row.
CREATE TABLE ledger_entries (
  id              bigint GENERATED ALWAYS AS IDENTITY,
  org_id          text   COLLATE "C" NOT NULL,
  kind            text   NOT NULL CHECK (kind IN ('grant', 'reserve', 'settle', 'release', 'expire')),
  reservation_id  text   COLLATE "C" NULL,
  available_delta bigint NOT NULL,
  reserved_delta  bigint NOT NULL,
  spent_delta     bigint NOT NULL,
  granted_delta   bigint NOT NULL,
  created_at_ms   bigint NOT NULL,
  note            text   NULL,
  -- A grant has no reservation; every other entry belongs to one.
  CHECK ((kind = 'grant') = (reservation_id IS NULL)),
  -- Each entry keeps granted − spent = available + reserved.
  CHECK (granted_delta - spent_delta = available_delta + reserved_delta),
  CONSTRAINT ledger_entries_pkey PRIMARY KEY (id),
  CONSTRAINT ledger_entries_org_id_fkey FOREIGN KEY (org_id) REFERENCES organizations (id) ON DELETE RESTRICT,
  CONSTRAINT ledger_entries_reservation_id_fkey FOREIGN KEY (reservation_id) REFERENCES reservations (id) ON DELETE RESTRICT
);

CREATE INDEX ledger_entries_by_org ON ledger_entries (org_id, id);

-- Preview requests counted per UTC day ('YYYY-MM-DD'): the reset at 00:00 UTC needs no job.
-- scope is an organization id, or '*' for the whole service.
CREATE TABLE preview_counters (
  scope text   COLLATE "C" NOT NULL CHECK (length(scope) > 0),
  day   text   COLLATE "C" NOT NULL CHECK (day ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$'),
  count bigint NOT NULL CHECK (count >= 0),
  CONSTRAINT preview_counters_pkey PRIMARY KEY (scope, day)
);

-- Idempotency-Key claims and the responses kept for replays, per organization.
CREATE TABLE idempotency_keys (
  org_id              text    COLLATE "C" NOT NULL,
  key                 text    COLLATE "C" NOT NULL CHECK (length(key) > 0),
  request_hash        text    NOT NULL,
  -- The request that holds the claim (or produced the kept response).
  request_id          text    NOT NULL,
  state               text    NOT NULL CHECK (state IN ('in_progress', 'completed')),
  response_status     integer NULL CHECK (response_status IS NULL OR response_status BETWEEN 100 AND 599),
  response_body       text    NULL,
  response_request_id text    NULL,
  lock_until_ms       bigint  NOT NULL,
  expires_at_ms       bigint  NOT NULL,
  CONSTRAINT idempotency_keys_pkey PRIMARY KEY (org_id, key),
  CHECK ((state = 'completed') = (response_status IS NOT NULL AND response_body IS NOT NULL AND response_request_id IS NOT NULL)),
  CHECK (state = 'completed' OR (response_status IS NULL AND response_body IS NULL AND response_request_id IS NULL))
);
