-- 013_key_controls: limits of each API key (expiry, models, its own per-minute limit, a budget per UTC day or month),
-- rotation with a grace period (the new key shares the budget and per-minute count of the keys it replaced), the last
-- use of a key, the spend of each key lineage per budget period, and the key spend a paid request's reservation counts
-- in. Applied like 001 (one BEGIN IMMEDIATE transaction, no PRAGMAs here).
-- SQLite cannot change a CHECK in place, so admin_audit is rebuilt (as usage_records in 012) to allow the actions
-- 'key.updated' and 'key.rotated'. Times are epoch milliseconds; money is integer microUSD.

-- NULL: no expiry.
ALTER TABLE api_keys ADD COLUMN expires_at_ms INTEGER NULL CHECK (expires_at_ms IS NULL OR expires_at_ms >= 0);
-- A JSON array of public model names the key may use; NULL: every model.
ALTER TABLE api_keys ADD COLUMN models TEXT NULL CHECK (models IS NULL OR (json_valid(models) AND json_type(models) = 'array'));
-- The key's own per-minute request limit (within its organization's); NULL: only the organization's.
ALTER TABLE api_keys ADD COLUMN requests_per_minute INTEGER NULL CHECK (requests_per_minute IS NULL OR requests_per_minute > 0);
-- The most the key may spend in one UTC period ('day' or 'month'); both NULL: no budget.
ALTER TABLE api_keys ADD COLUMN budget_microusd INTEGER NULL CHECK (budget_microusd IS NULL OR budget_microusd >= 0);
ALTER TABLE api_keys ADD COLUMN budget_period TEXT NULL CHECK (budget_period IS NULL OR budget_period IN ('day', 'month'));
-- Rotated: the key that replaced it, and when its grace ends (refused from then).
ALTER TABLE api_keys ADD COLUMN replaced_by TEXT NULL;
ALTER TABLE api_keys ADD COLUMN retires_at_ms INTEGER NULL CHECK (retires_at_ms IS NULL OR retires_at_ms >= 0);
-- A key made by rotation: the id of the first key of its chain of rotations (its lineage), whose budget spend and
-- per-minute count it shares with the keys it replaced; NULL: the key is the first of its lineage (its own id).
ALTER TABLE api_keys ADD COLUMN lineage_id TEXT NULL;
-- Written by each instance at most once a minute for the keys it saw; NULL: never used (or not yet written).
ALTER TABLE api_keys ADD COLUMN last_used_at_ms INTEGER NULL CHECK (last_used_at_ms IS NULL OR last_used_at_ms >= 0);

-- What a key with a budget has set aside (requests in flight) and spent in one UTC period: 'YYYY-MM-DD' or 'YYYY-MM'.
-- key_id is the key's lineage id: a key and the keys that replaced it by rotation spend in one row.
CREATE TABLE key_spend (
  key_id            TEXT    NOT NULL,
  period            TEXT    NOT NULL CHECK (length(period) IN (7, 10)),
  reserved_microusd INTEGER NOT NULL CHECK (reserved_microusd >= 0),
  spent_microusd    INTEGER NOT NULL CHECK (spent_microusd >= 0),
  PRIMARY KEY (key_id, period)
) STRICT, WITHOUT ROWID;

-- The key_spend row its reservation counts in: the key's lineage id and the budget period; both NULL: the key had no
-- budget, or no reservation.
ALTER TABLE usage_records ADD COLUMN key_budget_key_id TEXT NULL;
ALTER TABLE usage_records ADD COLUMN key_budget_period TEXT NULL;

CREATE TABLE admin_audit_013 (
  id             INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
  created_at_ms  INTEGER NOT NULL,
  action         TEXT    NOT NULL CHECK (action IN ('organization.created', 'organization.paused', 'organization.resumed',
                                                    'key.created', 'key.revoked', 'key.updated', 'key.rotated', 'credits.granted')),
  org_id         TEXT    NOT NULL,
  -- The organization's id, or the key's id for key actions.
  target_id      TEXT    NOT NULL,
  source         TEXT    NOT NULL CHECK (source IN ('cli', 'http')),
  -- The admin API caller's own label, and its address; NULL from the CLI.
  client         TEXT    NULL,
  remote_address TEXT    NULL,
  -- A JSON object of the action's facts (names, amount and note of a grant, a key's changed settings).
  details        TEXT    NOT NULL CHECK (json_valid(details) AND json_type(details) = 'object')
) STRICT;
INSERT INTO admin_audit_013 (id, created_at_ms, action, org_id, target_id, source, client, remote_address, details)
  SELECT id, created_at_ms, action, org_id, target_id, source, client, remote_address, details FROM admin_audit;
DROP TABLE admin_audit;
ALTER TABLE admin_audit_013 RENAME TO admin_audit;
CREATE INDEX admin_audit_by_org ON admin_audit (org_id, id);
