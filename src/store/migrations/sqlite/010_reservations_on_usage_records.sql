-- 010_reservations_on_usage_records: a paid request's credit reservation is kept on its usage record instead of a
-- row of its own, and the ledger gets one entry per paid request, at completion (settle: the cost spent; release or
-- expire: no change), instead of two. A reservation is pending exactly while its record is in flight;
-- org_balances.reserved is the sum of the pending ones. The reservations table is dropped: every reservation that
-- has a usage record is carried onto it, pending ones of requests no longer in flight (which no completion can
-- settle) are expired here, and the ledger keeps the history of all of them. Applied like 001 (one BEGIN IMMEDIATE
-- transaction, no PRAGMAs here); SQLite cannot drop a foreign key, so ledger_entries is rebuilt without the one to
-- reservations.

-- The credits set aside at admission; NULL: the request reserved nothing (preview).
ALTER TABLE usage_records ADD COLUMN reserved_microusd INTEGER NULL CHECK (reserved_microusd >= 0);
ALTER TABLE usage_records ADD COLUMN reservation_expires_at_ms INTEGER NULL
  CHECK ((reservation_expires_at_ms IS NULL) = (reserved_microusd IS NULL));
-- pending while in flight, then exactly one of settled | released | expired, written with the final record. Only a
-- settled reservation charges, never more than it set aside.
ALTER TABLE usage_records ADD COLUMN reservation_status TEXT NULL
  CHECK ((reservation_status IS NULL) = (reserved_microusd IS NULL)
    AND (reservation_status IS NULL OR (
      reservation_status IN ('pending', 'settled', 'released', 'expired')
      AND (reservation_status = 'pending') = (outcome = 'in_flight')
      AND (cost_microusd = 0 OR (reservation_status = 'settled' AND cost_microusd <= reserved_microusd)))));

-- Pending reservations whose request is no longer in flight: expired now, as the sweep would have, with the entry
-- and the balance change the sweep wrote.
CREATE TEMP TABLE expired_010 AS
  SELECT r.id, r.org_id, r.amount_microusd FROM reservations r
  WHERE r.status = 'pending'
    AND NOT EXISTS (SELECT 1 FROM usage_records u WHERE u.request_id = r.request_id AND u.outcome = 'in_flight');
INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note)
  SELECT org_id, 'expire', id, amount_microusd, -amount_microusd, 0, 0, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
    'expired by migration 010: its request was no longer in flight'
  FROM expired_010 ORDER BY id;
UPDATE org_balances SET available = available + e.total, reserved = reserved - e.total
  FROM (SELECT org_id, sum(amount_microusd) AS total FROM expired_010 GROUP BY org_id) e WHERE org_balances.org_id = e.org_id;
UPDATE reservations SET status = 'expired', resolved_at_ms = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
  WHERE id IN (SELECT id FROM expired_010);
DROP TABLE expired_010;

-- Pending reservations of requests in flight move onto their records: the entry appended here undoes their reserve
-- entry, so that, as for a reservation made from now on, the ledger holds nothing of them until they resolve.
INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note)
  SELECT org_id, 'reserve', id, amount_microusd, -amount_microusd, 0, 0, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
    'moved onto its usage record by migration 010 (undoes the reserve entry)'
  FROM reservations WHERE status = 'pending' ORDER BY id;

-- Every reservation onto its request's record (a pending one first, else the latest, should a request have had
-- several); a record in flight keeps only a pending one.
UPDATE usage_records SET reserved_microusd = r.amount_microusd, reservation_expires_at_ms = r.expires_at_ms, reservation_status = r.status
  FROM (SELECT request_id, org_id, amount_microusd, expires_at_ms, status,
          row_number() OVER (PARTITION BY request_id ORDER BY status = 'pending' DESC, created_at_ms DESC, id DESC) AS n FROM reservations) r
  WHERE r.n = 1 AND usage_records.request_id = r.request_id AND usage_records.org_id = r.org_id
    AND (usage_records.outcome = 'in_flight') = (r.status = 'pending');

-- ledger_entries.reservation_id now names the request whose reservation an entry resolves (in older entries: the
-- reservation's id, which the gateway made the request id).
CREATE TABLE ledger_entries_010 (
  id              INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
  org_id          TEXT    NOT NULL REFERENCES organizations (id) ON DELETE RESTRICT,
  kind            TEXT    NOT NULL CHECK (kind IN ('grant', 'reserve', 'settle', 'release', 'expire')),
  reservation_id  TEXT    NULL,
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
INSERT INTO ledger_entries_010 (id, org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note)
  SELECT id, org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note FROM ledger_entries;
DROP TABLE ledger_entries;
ALTER TABLE ledger_entries_010 RENAME TO ledger_entries;
CREATE INDEX ledger_entries_by_org ON ledger_entries (org_id, id);

DROP TABLE reservations;
