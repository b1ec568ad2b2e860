-- 013_key_controls (PostgreSQL; mirrors migrations/sqlite/013_key_controls.sql): limits of each API key (expiry,
-- models, its own per-minute limit, a budget per UTC day or month), rotation with a grace period (the new key shares
-- the budget and per-minute count of the keys it replaced), the last use of a key, the spend of each key lineage per
-- budget period, and the key spend a paid request's reservation counts in.
-- Applied like 001. Adding nullable columns without defaults rewrites no table.

ALTER TABLE api_keys
  -- NULL: no expiry.
  ADD COLUMN expires_at_ms bigint NULL CHECK (expires_at_ms IS NULL OR expires_at_ms >= 0),
  -- A JSON array of public model names the key may use, as text; NULL: every model.
  ADD COLUMN models text NULL CHECK (models IS NULL OR json_typeof(models::json) = 'array'),
  -- The key's own per-minute request limit (within its organization's); NULL: only the organization's.
  ADD COLUMN requests_per_minute integer NULL CHECK (requests_per_minute IS NULL OR requests_per_minute > 0),
  -- The most the key may spend in one UTC period ('day' or 'month'); both NULL: no budget.
  ADD COLUMN budget_microusd bigint NULL CHECK (budget_microusd IS NULL OR budget_microusd >= 0),
  ADD COLUMN budget_period text NULL CHECK (budget_period IS NULL OR budget_period IN ('day', 'month')),
  -- Rotated: the key that replaced it, and when its grace ends (refused from then).
  ADD COLUMN replaced_by text COLLATE "C" NULL,
  ADD COLUMN retires_at_ms bigint NULL CHECK (retires_at_ms IS NULL OR retires_at_ms >= 0),
  -- A key made by rotation: the id of the first key of its chain of rotations (its lineage), whose budget spend and
  -- per-minute count it shares with the keys it replaced; NULL: the key is the first of its lineage (its own id).
  ADD COLUMN lineage_id text COLLATE "C" NULL,
  -- Written by each instance at most once a minute for the keys it saw; NULL: never used (or not yet written).
  ADD COLUMN last_used_at_ms bigint NULL CHECK (last_used_at_ms IS NULL OR last_used_at_ms >= 0);

-- What a key with a budget has set aside (requests in flight) and spent in one UTC period: 'YYYY-MM-DD' or 'YYYY-MM'.
-- key_id is the key's lineage id: a key and the keys that replaced it by rotation spend in one row.
CREATE TABLE key_spend (
  key_id            text   COLLATE "C" NOT NULL,
  period            text   COLLATE "C" NOT NULL CHECK (length(period) IN (7, 10)),
  reserved_microusd bigint NOT NULL CHECK (reserved_microusd >= 0),
  spent_microusd    bigint NOT NULL CHECK (spent_microusd >= 0),
  CONSTRAINT key_spend_pkey PRIMARY KEY (key_id, period)
);

-- The key_spend row its reservation counts in: the key's lineage id and the budget period; both NULL: the key had no
-- budget, or no reservation.
ALTER TABLE usage_records
  ADD COLUMN key_budget_key_id text COLLATE "C" NULL,
  ADD COLUMN key_budget_period text COLLATE "C" NULL;

ALTER TABLE admin_audit
  DROP CONSTRAINT admin_audit_action_check,
  ADD CONSTRAINT admin_audit_action_check CHECK (action IN ('organization.created', 'organization.paused', 'organization.resumed',
                                                            'key.created', 'key.revoked', 'key.updated', 'key.rotated', 'credits.granted'));
