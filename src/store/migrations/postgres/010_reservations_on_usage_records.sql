-- 010_reservations_on_usage_records (PostgreSQL; mirrors migrations/sqlite/010_reservations_on_usage_records.sql):
-- a paid request's credit reservation is kept on its usage record instead of a row of its own, and the ledger gets
-- one entry per paid request, at completion (settle: the cost spent; release or expire: no change), instead of two.
-- A reservation is pending exactly while its record is in flight; org_balances.reserved is the sum of the pending
-- ones. The reservations table is dropped: every reservation that has a usage record is carried onto it, pending
-- ones of requests no longer in flight (which no completion can settle) are expired here, and the ledger keeps the
-- history of all of them. Applied like 001.

ALTER TABLE usage_records
  -- The credits set aside at admission; NULL: the request reserved nothing (preview).
  ADD COLUMN reserved_microusd bigint NULL CHECK (reserved_microusd >= 0),
  ADD COLUMN reservation_expires_at_ms bigint NULL,
  -- pending while in flight, then exactly one of settled | released | expired, written with the final record.
  ADD COLUMN reservation_status text NULL CHECK (reservation_status IN ('pending', 'settled', 'released', 'expired')),
  ADD CONSTRAINT usage_records_reservation_check
    CHECK ((reserved_microusd IS NULL) = (reservation_status IS NULL) AND (reserved_microusd IS NULL) = (reservation_expires_at_ms IS NULL)),
  ADD CONSTRAINT usage_records_reservation_pending_check
    CHECK (reservation_status IS NULL OR (reservation_status = 'pending') = (outcome = 'in_flight')),
  -- Only a settled reservation charges, never more than it set aside.
  ADD CONSTRAINT usage_records_reservation_cost_check
    CHECK (reservation_status IS NULL OR cost_microusd = 0 OR (reservation_status = 'settled' AND cost_microusd <= reserved_microusd));

-- Pending reservations whose request is no longer in flight: expired now, as the sweep would have, with the entry
-- and the balance change the sweep wrote.
CREATE TEMPORARY TABLE expired_010 ON COMMIT DROP AS
  SELECT r.id, r.org_id, r.amount_microusd FROM reservations r
  WHERE r.status = 'pending'
    AND NOT EXISTS (SELECT 1 FROM usage_records u WHERE u.request_id = r.request_id AND u.outcome = 'in_flight');
INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note)
  SELECT org_id, 'expire', id, amount_microusd, -amount_microusd, 0, 0, (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    'expired by migration 010: its request was no longer in flight'
  FROM expired_010 ORDER BY id;
UPDATE org_balances b SET available = b.available + e.total, reserved = b.reserved - e.total
  FROM (SELECT org_id, sum(amount_microusd) AS total FROM expired_010 GROUP BY org_id) e WHERE b.org_id = e.org_id;
UPDATE reservations r SET status = 'expired', resolved_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
  FROM expired_010 e WHERE r.id = e.id;

-- Pending reservations of requests in flight move onto their records: the entry appended here undoes their reserve
-- entry, so that, as for a reservation made from now on, the ledger holds nothing of them until they resolve.
INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note)
  SELECT r.org_id, 'reserve', r.id, r.amount_microusd, -r.amount_microusd, 0, 0, (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    'moved onto its usage record by migration 010 (undoes the reserve entry)'
  FROM reservations r WHERE r.status = 'pending' ORDER BY r.id;

-- Every reservation onto its request's record (a pending one first, else the latest, should a request have had
-- several); a record in flight keeps only a pending one.
UPDATE usage_records u SET reserved_microusd = r.amount_microusd, reservation_expires_at_ms = r.expires_at_ms, reservation_status = r.status
  FROM (SELECT DISTINCT ON (request_id) request_id, org_id, amount_microusd, expires_at_ms, status FROM reservations
        ORDER BY request_id, status = 'pending' DESC, created_at_ms DESC, id DESC) r
  WHERE u.request_id = r.request_id AND u.org_id = r.org_id AND (u.outcome = 'in_flight') = (r.status = 'pending');

ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_reservation_id_fkey;
-- ledger_entries.reservation_id now names the request whose reservation an entry resolves (in older entries: the
-- reservation's id, which the gateway made the request id).
DROP TABLE reservations;
