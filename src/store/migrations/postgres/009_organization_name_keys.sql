-- 009_organization_name_keys (PostgreSQL; mirrors migrations/sqlite/009_organization_name_keys.sql): the key under
-- which organization names are unique (src/domain/name-key.ts: NFKC, case-folded), stored with a unique index, so
-- that a new name is checked by one index lookup instead of a scan of every name under a lock that serialized all
-- creations. SQL cannot compute the key (PostgreSQL's case mapping depends on the collation provider): the
-- migration's data step (src/store/organization-names.ts) fills it in the same transaction, oldest organization
-- first. Names stored before the rule that share a key keep working: the oldest holds the key, the others keep none
-- (NULL, like a row written by an earlier version), and a new name is compared with those by name. Applied like 001.

ALTER TABLE organizations ADD COLUMN name_key text COLLATE "C" NULL CHECK (name_key IS NULL OR length(name_key) > 0);

CREATE UNIQUE INDEX organizations_by_name_key ON organizations (name_key);
