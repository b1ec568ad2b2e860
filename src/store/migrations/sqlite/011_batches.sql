-- 011_batches: batch submissions (POST /v1/batches) and their requests, one row per input line. A batch is written
-- while its upload is read (`validating`: invisible to the API, never run; deleted when the upload fails, or by the
-- purge when its process died), then opened (`queued`). Instances claim pending requests with a lease they renew;
-- a request whose lease ended is taken over. Applied like 001 (one BEGIN IMMEDIATE transaction, no PRAGMAs here).

CREATE TABLE batches (
  id              TEXT    NOT NULL PRIMARY KEY CHECK (length(id) > 0),
  org_id          TEXT    NOT NULL REFERENCES organizations (id) ON DELETE RESTRICT,
  -- The API key that submitted it; its requests run in its name.
  key_id          TEXT    NOT NULL,
  -- The model of requests that name none; NULL: the configured model when each request runs.
  model           TEXT    NULL,
  status          TEXT    NOT NULL CHECK (status IN ('validating', 'queued', 'running', 'completed', 'cancelling', 'cancelled', 'expired')),
  created_at_ms   INTEGER NOT NULL CHECK (created_at_ms >= 0),
  -- When the first request was claimed.
  started_at_ms   INTEGER NULL,
  ended_at_ms     INTEGER NULL,
  -- The end of the completion window: requests not started by then end with a batch_expired result.
  expires_at_ms   INTEGER NOT NULL CHECK (expires_at_ms > created_at_ms),
  -- While validating: the lines written so far, and the last time some were (an upload untouched for long died).
  touched_at_ms   INTEGER NOT NULL CHECK (touched_at_ms >= created_at_ms),
  -- The requests; every one ends exactly once as succeeded (status 200) or failed.
  total           INTEGER NOT NULL DEFAULT 0 CHECK (total >= 0),
  succeeded       INTEGER NOT NULL DEFAULT 0 CHECK (succeeded >= 0),
  failed          INTEGER NOT NULL DEFAULT 0 CHECK (failed >= 0),
  -- Of the failed ones, those the completion window ended before they started: the batch ends `expired`.
  expired         INTEGER NOT NULL DEFAULT 0 CHECK (expired >= 0),
  -- The charges of the finished requests, microUSD.
  cost_microusd   INTEGER NOT NULL DEFAULT 0 CHECK (cost_microusd >= 0),
  -- The submission's Idempotency-Key and the SHA-256 of its body, set when it is opened (both or neither).
  idempotency_key TEXT    NULL CHECK (idempotency_key IS NULL OR length(idempotency_key) > 0),
  request_hash    TEXT    NULL CHECK ((request_hash IS NULL) = (idempotency_key IS NULL)),
  input_bytes     INTEGER NOT NULL DEFAULT 0 CHECK (input_bytes >= 0),
  CONSTRAINT batches_ended_check CHECK ((ended_at_ms IS NULL) = (status IN ('validating', 'queued', 'running', 'cancelling'))),
  CHECK (succeeded + failed <= total),
  CHECK (expired <= failed),
  -- A batch ends once every request has its result (or at once when cancelled or expired with none running).
  CHECK (status NOT IN ('completed', 'expired') OR succeeded + failed = total),
  UNIQUE (org_id, idempotency_key)
) STRICT;

-- The organization's batches, newest first (keyset pages).
CREATE INDEX batches_by_org ON batches (org_id, created_at_ms DESC, id DESC);
-- The runner: the batches with requests to claim or finish, oldest first.
CREATE INDEX batches_active ON batches (created_at_ms, id) WHERE status IN ('queued', 'running', 'cancelling');
-- The purge: ended batches by end time, and uploads that never finished by their last write.
CREATE INDEX batches_by_end ON batches (ended_at_ms) WHERE ended_at_ms IS NOT NULL;
CREATE INDEX batches_validating ON batches (touched_at_ms) WHERE status = 'validating';

CREATE TABLE batch_requests (
  batch_id       TEXT    NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
  -- 0-based position of the request among the submission's requests (its input line number is not kept).
  position       INTEGER NOT NULL CHECK (position >= 0),
  custom_id      TEXT    NOT NULL CHECK (length(custom_id) BETWEEN 1 AND 64),
  -- The line's JSON text as validated by the route.
  body           TEXT    NOT NULL,
  state          TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'claimed', 'done')),
  -- Given at the first claim and kept by later claims of the row; NULL for a request that never ran.
  request_id     TEXT    NULL CHECK (request_id IS NULL OR length(request_id) > 0),
  -- The instance that claimed it last, and until when its claim holds without a renewal.
  claimed_by     TEXT    NULL,
  lease_until_ms INTEGER NULL,
  -- The answer POST /v1/systemone would have given: HTTP status and body (JSON text).
  result_status  INTEGER NULL CHECK (result_status BETWEEN 100 AND 599),
  result_body    TEXT    NULL,
  cost_microusd  INTEGER NULL CHECK (cost_microusd >= 0),
  finished_at_ms INTEGER NULL,
  PRIMARY KEY (batch_id, position),
  UNIQUE (batch_id, custom_id),
  CHECK (state <> 'pending' OR (claimed_by IS NULL AND lease_until_ms IS NULL)),
  CHECK (state <> 'claimed' OR (request_id IS NOT NULL AND claimed_by IS NOT NULL AND lease_until_ms IS NOT NULL)),
  CHECK ((state = 'done') = (result_status IS NOT NULL) AND (state = 'done') = (result_body IS NOT NULL)
    AND (state = 'done') = (cost_microusd IS NOT NULL) AND (state = 'done') = (finished_at_ms IS NOT NULL))
) STRICT;

-- The requests still to run or finish (claims, cancels and expiry read them by batch in input order).
CREATE INDEX batch_requests_open ON batch_requests (batch_id, position) WHERE state <> 'done';
-- The claims held: renewed by their instance, counted per organization.
CREATE INDEX batch_requests_claimed ON batch_requests (claimed_by, lease_until_ms) WHERE state = 'claimed';
