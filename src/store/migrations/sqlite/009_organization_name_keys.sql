-- 009_organization_name_keys: the key under which organization names are unique (src/domain/name-key.ts: NFKC,
-- case-folded), stored with a unique index, so that a new name is checked by one index lookup instead of a scan of
-- every name. SQL cannot compute the key: the migration's data step (src/store/organization-names.ts) fills it in the
-- same transaction, oldest organization first. Names stored before the rule that share a key keep working: the oldest
-- holds the key, the others keep none (NULL, like a row written by an earlier version), and a new name is compared
-- with those by name. Applied like 001 (one BEGIN IMMEDIATE transaction, no PRAGMAs here).

ALTER TABLE organizations ADD COLUMN name_key TEXT NULL CHECK (name_key IS NULL OR length(name_key) > 0);

CREATE UNIQUE INDEX organizations_by_name_key ON organizations (name_key);
