-- 005_usage_deployment: which deployment of a model answered a request (a model can be served by several model
-- services) and how many attempts it took (failover). NULL and 0 while in flight and for records written before.
-- Applied like 001.
ALTER TABLE usage_records ADD COLUMN deployment TEXT NULL;
ALTER TABLE usage_records ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0);
