import type pg from "pg";
import { StoreConflictError, type Balance, type LedgerEntry, type LedgerKind, type Reservation, type UsageRecord } from "../store.ts";
import { StoreInputError } from "../store-errors.ts";
import { checkAmount, checkCount, checkEpochMs, checkText } from "../input-checks.ts";
import { hasNul, isUniqueViolation, transaction, withClient, type Client } from "./postgres-connection.ts";
import { insertUsageRow } from "./postgres-usage.ts";
import { type Delta, type LedgerRow, type ReleaseResult, type ReservationRow, type SettleResult, LEDGER_COLUMNS, RESERVATION_COLUMNS, toLedgerEntry, toReservation, ZERO_BALANCE } from "../credit-rows.ts";

/**
 * Credits in PostgreSQL: balances, reservations and the ledger, with the same behaviour as SqliteCredits.
 * Every method that writes is ONE transaction (READ COMMITTED) whose safety under concurrency comes from
 * the statements themselves, not from a database-wide write lock:
 *
 * - reserve: ONE conditional `UPDATE org_balances … WHERE org_id = $2 AND available >= $1`; a concurrent
 *   writer of the same row waits and then re-checks the condition on the committed row, so no balance is
 *   overdrawn (and the CHECK (available >= 0) would refuse it anyway). rowCount decides "insufficient".
 * - settle / release lock the reservation (`SELECT … FOR UPDATE`) and resolve it with an UPDATE guarded by
 *   `status = 'pending'`: a duplicate delivery finds nothing to change.
 * - the expiry sweep takes due reservations in batches with `FOR UPDATE SKIP LOCKED`, so several instances
 *   sweeping at once never wait for each other nor resolve one reservation twice; it updates balances in
 *   org_id order, so two sweeps never deadlock.
 *
 * Every balance change goes through `apply`, which updates org_balances and appends the ledger entry with the
 * same deltas, so the ledger always sums to the balance. Times are the caller's nowMs, never the database clock.
 */

const BALANCE_COLUMNS = "available, reserved, spent, granted";

/** Reservations resolved per transaction by the expiry sweep (a call with a larger limit runs several). */
export const EXPIRE_BATCH_SIZE = 200;

/**
 * The expiry sweep's query, served by reservations_by_status_expiry: the pending ones already due, in expiry
 * order, locked; rows another transaction holds (a settle in progress, another sweep) are skipped, not waited for.
 */
export const DUE_RESERVATIONS_SQL =
  "SELECT id, org_id, amount_microusd FROM reservations WHERE status = 'pending' AND expires_at_ms <= $1 " +
  "ORDER BY expires_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED";

function toBalance(row: Balance): Balance {
  return { available: row.available, reserved: row.reserved, spent: row.spent, granted: row.granted };
}

interface ReserveInput {
  reservationId: string;
  orgId: string;
  requestId: string;
  amountMicrousd: number;
  nowMs: number;
  expiresAtMs: number;
}
interface SettleInput {
  reservationId: string;
  costMicrousd: number;
  nowMs: number;
  usage: UsageRecord;
}
interface ReleaseInput {
  reservationId: string;
  nowMs: number;
  usage: UsageRecord | null;
}

const INSERT_LEDGER =
  "INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note) " +
  "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/** Updates the balance by `delta` and appends the matching ledger entry; returns the new balance. */
async function apply(c: Client, orgId: string, kind: LedgerKind, reservationId: string | null, delta: Delta, nowMs: number, note: string | null): Promise<Balance> {
  const updated = await c.query<Balance>(
    `UPDATE org_balances SET available = available + $1, reserved = reserved + $2, spent = spent + $3, granted = granted + $4 WHERE org_id = $5 RETURNING ${BALANCE_COLUMNS}`,
    [delta.available, delta.reserved, delta.spent, delta.granted, orgId],
  );
  if (updated.rowCount !== 1) throw new Error(`No credit balance for organization ${JSON.stringify(orgId)} (ledger ${kind})`);
  await c.query(INSERT_LEDGER, [orgId, kind, reservationId, delta.available, delta.reserved, delta.spent, delta.granted, nowMs, note]);
  return toBalance(updated.rows[0]!);
}

/** pending → released or expired, the whole amount back to available. False when it was not pending (the guard). */
async function giveBack(c: Client, row: ReservationRow, status: "released" | "expired", nowMs: number): Promise<boolean> {
  const marked = await c.query("UPDATE reservations SET status = $1, resolved_at_ms = $2 WHERE id = $3 AND status = 'pending'", [status, nowMs, row.id]);
  if (marked.rowCount !== 1) return false;
  const amount = row.amount_microusd;
  await apply(c, row.org_id, status === "released" ? "release" : "expire", row.id, { available: amount, reserved: -amount, spent: 0, granted: 0 }, nowMs, null);
  return true;
}

function checkUsageOrg(row: ReservationRow | undefined, usage: UsageRecord | null): void {
  if (row && usage && usage.orgId !== row.org_id) {
    throw new StoreInputError(`The usage record belongs to organization ${JSON.stringify(usage.orgId)}, the reservation to another`, "usage.orgId");
  }
}

async function lockReservation(c: Client, reservationId: string): Promise<ReservationRow | undefined> {
  if (hasNul(reservationId)) return undefined;
  return (await c.query<ReservationRow>(`SELECT ${RESERVATION_COLUMNS} FROM reservations WHERE id = $1 FOR UPDATE`, [reservationId])).rows[0];
}

export class PostgresCredits {
  readonly #pool: pg.Pool;

  constructor(pool: pg.Pool) {
    this.#pool = pool;
  }

  async grant(input: { orgId: string; amountMicrousd: number; nowMs: number; note?: string }): Promise<Balance> {
    checkText(input.orgId, "orgId");
    checkAmount(input.amountMicrousd, "amountMicrousd", { positive: true });
    checkEpochMs(input.nowMs, "nowMs");
    const { orgId, amountMicrousd: amount, nowMs } = input;
    const noOrg = () => new StoreInputError(`No organization with id ${JSON.stringify(orgId)}`, "orgId");
    if (hasNul(orgId)) throw noOrg();
    return transaction(this.#pool, async (c) => {
      // Creates the balance of an existing organization, then locks it: concurrent grants take turns here.
      await c.query("INSERT INTO org_balances (org_id) SELECT id FROM organizations WHERE id = $1 ON CONFLICT (org_id) DO NOTHING", [orgId]);
      const current = (await c.query<{ granted: number }>("SELECT granted FROM org_balances WHERE org_id = $1 FOR UPDATE", [orgId])).rows[0];
      if (!current) throw noOrg();
      if (!Number.isSafeInteger(current.granted + amount)) {
        throw new StoreInputError("The grant would take the organization's credits beyond the safe integer range", "amountMicrousd");
      }
      return apply(c, orgId, "grant", null, { available: amount, reserved: 0, spent: 0, granted: amount }, nowMs, input.note ?? null);
    });
  }

  async balance(orgId: string): Promise<Balance> {
    if (hasNul(orgId)) return { ...ZERO_BALANCE };
    const row = await withClient(this.#pool, async (c) => (await c.query<Balance>(`SELECT ${BALANCE_COLUMNS} FROM org_balances WHERE org_id = $1`, [orgId])).rows[0]);
    return row ? toBalance(row) : { ...ZERO_BALANCE };
  }

  async reserve(input: ReserveInput): Promise<"reserved" | "insufficient"> {
    checkText(input.reservationId, "reservationId");
    checkText(input.orgId, "orgId");
    checkText(input.requestId, "requestId");
    checkAmount(input.amountMicrousd, "amountMicrousd");
    checkEpochMs(input.nowMs, "nowMs");
    checkEpochMs(input.expiresAtMs, "expiresAtMs");
    // No organization id holds U+0000, so there is no balance to reserve from.
    if (hasNul(input.orgId)) return "insufficient";
    const amount = input.amountMicrousd;
    return transaction(this.#pool, async (c) => {
      // A reservation of 0 by an organization that never had credits needs an all-zero balance to update.
      if (amount === 0) {
        await c.query("INSERT INTO org_balances (org_id) SELECT id FROM organizations WHERE id = $1 ON CONFLICT (org_id) DO NOTHING", [input.orgId]);
      }
      // The one conditional update: succeeds only while available covers the amount.
      const moved = await c.query(
        "UPDATE org_balances SET available = available - $1, reserved = reserved + $1 WHERE org_id = $2 AND available >= $1",
        [amount, input.orgId],
      );
      if (moved.rowCount !== 1) return "insufficient";
      try {
        await c.query(
          "INSERT INTO reservations (id, org_id, request_id, amount_microusd, status, cost_microusd, created_at_ms, expires_at_ms, resolved_at_ms) " +
            "VALUES ($1, $2, $3, $4, 'pending', NULL, $5, $6, NULL)",
          [input.reservationId, input.orgId, input.requestId, amount, input.nowMs, input.expiresAtMs],
        );
      } catch (err) {
        // Thrown inside the transaction: the balance update above is rolled back too.
        if (isUniqueViolation(err)) throw new StoreConflictError(`A reservation with id ${JSON.stringify(input.reservationId)} already exists`);
        throw err;
      }
      await c.query(INSERT_LEDGER, [input.orgId, "reserve", input.reservationId, -amount, amount, 0, 0, input.nowMs, null]);
      return "reserved";
    });
  }

  async settle(input: SettleInput): Promise<SettleResult> {
    checkAmount(input.costMicrousd, "costMicrousd");
    checkEpochMs(input.nowMs, "nowMs");
    return transaction(this.#pool, async (c): Promise<SettleResult> => {
      const row = await lockReservation(c, input.reservationId);
      if (!row) return "not_pending";
      if (input.costMicrousd > row.amount_microusd) {
        throw new RangeError(`The cost ${input.costMicrousd} exceeds the reservation ${JSON.stringify(row.id)} of ${row.amount_microusd} microUSD`);
      }
      if (row.status !== "pending") return "not_pending";
      checkUsageOrg(row, input.usage);
      if (row.expires_at_ms <= input.nowMs) return (await giveBack(c, row, "expired", input.nowMs)) ? "expired" : "not_pending";
      const marked = await c.query(
        "UPDATE reservations SET status = 'settled', cost_microusd = $1, resolved_at_ms = $2 WHERE id = $3 AND status = 'pending'",
        [input.costMicrousd, input.nowMs, row.id],
      );
      if (marked.rowCount !== 1) return "not_pending";
      const amount = row.amount_microusd;
      const cost = input.costMicrousd;
      await apply(c, row.org_id, "settle", row.id, { available: amount - cost, reserved: -amount, spent: cost, granted: 0 }, input.nowMs, null);
      // A duplicate request id throws StoreConflictError: the whole settle is rolled back.
      await insertUsageRow(c, input.usage);
      return "settled";
    });
  }

  async release(input: ReleaseInput): Promise<ReleaseResult> {
    checkEpochMs(input.nowMs, "nowMs");
    return transaction(this.#pool, async (c): Promise<ReleaseResult> => {
      const row = await lockReservation(c, input.reservationId);
      checkUsageOrg(row, input.usage);
      const released = row !== undefined && row.status === "pending" && (await giveBack(c, row, "released", input.nowMs));
      if (input.usage) await insertUsageRow(c, input.usage);
      return released ? "released" : "not_pending";
    });
  }

  /** Expires up to `limit` due reservations, EXPIRE_BATCH_SIZE per transaction; returns how many. */
  async expire(input: { nowMs: number; limit: number }): Promise<number> {
    checkEpochMs(input.nowMs, "nowMs");
    checkCount(input.limit, "limit");
    let total = 0;
    while (total < input.limit) {
      const batch = Math.min(EXPIRE_BATCH_SIZE, input.limit - total);
      const { locked, expired } = await this.#expireBatch(input.nowMs, batch);
      total += expired;
      // Fewer than asked: nothing more is due, or the rest is held by other transactions (they resolve it).
      if (locked < batch) break;
    }
    return total;
  }

  async #expireBatch(nowMs: number, batch: number): Promise<{ locked: number; expired: number }> {
    return transaction(this.#pool, async (c) => {
      const due = (await c.query<{ id: string; org_id: string; amount_microusd: number }>(DUE_RESERVATIONS_SQL, [nowMs, batch])).rows;
      if (due.length === 0) return { locked: 0, expired: 0 };
      // The rows are locked, so the guard only matters if a status changed between the snapshot and the lock
      // (FOR UPDATE re-checks the WHERE clause on the newest row version, so it never does).
      const marked = await c.query<{ id: string }>(
        "UPDATE reservations SET status = 'expired', resolved_at_ms = $1 WHERE id = ANY($2::text[]) AND status = 'pending' RETURNING id",
        [nowMs, due.map((r) => r.id)],
      );
      const markedIds = new Set(marked.rows.map((r) => r.id));
      const expired = due.filter((r) => markedIds.has(r.id));
      // One balance update per organization, in a fixed (org_id) order: two sweeps lock balances in the same order.
      const perOrg = new Map<string, number>();
      for (const r of expired) perOrg.set(r.org_id, (perOrg.get(r.org_id) ?? 0) + r.amount_microusd);
      for (const orgId of [...perOrg.keys()].sort()) {
        const amount = perOrg.get(orgId)!;
        const updated = await c.query(
          "UPDATE org_balances SET available = available + $1, reserved = reserved - $1 WHERE org_id = $2",
          [amount, orgId],
        );
        if (updated.rowCount !== 1) throw new Error(`No credit balance for organization ${JSON.stringify(orgId)} (ledger expire)`);
      }
      // One `expire` entry per reservation, in expiry order; together they add up to the balance updates above.
      if (expired.length > 0) {
        await c.query(
          "INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note) " +
            "SELECT r.org_id, 'expire', r.id, r.amount, -r.amount, 0, 0, $1, NULL " +
            "FROM unnest($2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY AS r(id, org_id, amount, n) ORDER BY r.n",
          [nowMs, expired.map((r) => r.id), expired.map((r) => r.org_id), expired.map((r) => r.amount_microusd)],
        );
      }
      return { locked: due.length, expired: expired.length };
    });
  }

  async reservation(reservationId: string): Promise<Reservation | null> {
    if (hasNul(reservationId)) return null;
    const row = await withClient(this.#pool, async (c) => (await c.query<ReservationRow>(`SELECT ${RESERVATION_COLUMNS} FROM reservations WHERE id = $1`, [reservationId])).rows[0]);
    return row ? toReservation(row) : null;
  }

  async ledger(orgId: string): Promise<LedgerEntry[]> {
    if (hasNul(orgId)) return [];
    const rows = await withClient(this.#pool, async (c) => (await c.query<LedgerRow>(`SELECT ${LEDGER_COLUMNS} FROM ledger_entries WHERE org_id = $1 ORDER BY id`, [orgId])).rows);
    return rows.map(toLedgerEntry);
  }
}
