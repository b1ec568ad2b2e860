-- 005_usage_deployment (PostgreSQL; mirrors migrations/sqlite/005_usage_deployment.sql): which deployment of a
-- model answered a request (a model can be served by several model services) and how many attempts it took
-- (failover). NULL and 0 while in flight and for records written before. Applied like 001.
ALTER TABLE usage_records ADD COLUMN deployment text NULL;
ALTER TABLE usage_records ADD COLUMN attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0);
