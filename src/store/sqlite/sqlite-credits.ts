import type Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
import { StoreConflictError, type Balance, type LedgerEntry, type LedgerKind, type Reservation, type UsageRecord } from "../store.ts";
import { StoreInputError } from "../store-errors.ts";
import { checkAmount, checkCount, checkEpochMs, checkText } from "../input-checks.ts";
import { isConstraint, UNIQUE_CODES } from "./sqlite-errors.ts";
import { type Delta, type LedgerRow, type ReleaseResult, type ReservationRow, type SettleResult, LEDGER_COLUMNS, RESERVATION_COLUMNS, toLedgerEntry, toReservation, ZERO_BALANCE } from "../credit-rows.ts";

/**
 * Credits in SQLite: balances, reservations and the ledger. Every method that writes runs as ONE
 * `BEGIN IMMEDIATE` transaction (reads are single statements), so processes sharing the file serialize on the write lock and a
 * check-then-write inside a method cannot interleave with another writer. Every balance change goes
 * through `#apply`, which updates org_balances and appends the ledger entry with the same deltas, so
 * the ledger always sums to the balance. Resolving a reservation is an UPDATE guarded by
 * `status = 'pending'`: a duplicate settle/release/expire finds nothing to change.
 */

interface BalanceRow {
  available: number;
  reserved: number;
  spent: number;
  granted: number;
}

/** The expiry sweep's query, served by reservations_by_status_expiry: a seek to the pending ones already due, in expiry order. */
export const DUE_RESERVATIONS_SQL =
  `SELECT ${RESERVATION_COLUMNS} FROM reservations WHERE status = 'pending' AND expires_at_ms <= ? ORDER BY expires_at_ms LIMIT ?`;

interface GrantInput {
  orgId: string;
  amountMicrousd: number;
  nowMs: number;
  note: string | null;
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
interface ExpireInput {
  nowMs: number;
  limit: number;
}

export class SqliteCredits {
  readonly #orgExists: Statement<[string], { one: number }>;
  readonly #balance: Statement<[string], BalanceRow>;
  readonly #createBalance: Statement<[string]>;
  /** Creates an all-zero balance for an existing organization (for a 0 reservation by an org that never had credits). */
  readonly #createBalanceIfOrg: Statement<[string]>;
  readonly #applyDelta: Statement<[number, number, number, number, string]>;
  readonly #reserve: Statement<[number, number, string, number]>;
  readonly #insertLedger: Statement<[string, LedgerKind, string | null, number, number, number, number, number, string | null]>;
  readonly #insertReservation: Statement<[string, string, string, number, number, number]>;
  readonly #reservation: Statement<[string], ReservationRow>;
  readonly #markSettled: Statement<[number, number, string]>;
  readonly #markResolved: Statement<["released" | "expired", number, string]>;
  readonly #dueReservations: Statement<[number, number], ReservationRow>;
  readonly #ledger: Statement<[string], LedgerRow>;

  readonly #grantTx: Database.Transaction<(input: GrantInput) => Balance>;
  readonly #reserveTx: Database.Transaction<(input: ReserveInput) => "reserved" | "insufficient">;
  readonly #settleTx: Database.Transaction<(input: SettleInput) => SettleResult>;
  readonly #releaseTx: Database.Transaction<(input: ReleaseInput) => ReleaseResult>;
  readonly #expireTx: Database.Transaction<(input: ExpireInput) => number>;

  /** `insertUsage` inserts one usage record synchronously (throwing StoreConflictError on a duplicate request id). */
  constructor(db: Database.Database, insertUsage: (record: UsageRecord) => void) {
    this.#orgExists = db.prepare("SELECT 1 AS one FROM organizations WHERE id = ?");
    this.#balance = db.prepare("SELECT available, reserved, spent, granted FROM org_balances WHERE org_id = ?");
    this.#createBalance = db.prepare("INSERT INTO org_balances (org_id) VALUES (?) ON CONFLICT (org_id) DO NOTHING");
    this.#createBalanceIfOrg = db.prepare("INSERT INTO org_balances (org_id) SELECT id FROM organizations WHERE id = ? ON CONFLICT (org_id) DO NOTHING");
    this.#applyDelta = db.prepare(
      "UPDATE org_balances SET available = available + ?, reserved = reserved + ?, spent = spent + ?, granted = granted + ? WHERE org_id = ?",
    );
    this.#reserve = db.prepare("UPDATE org_balances SET available = available - ?, reserved = reserved + ? WHERE org_id = ? AND available >= ?");
    this.#insertLedger = db.prepare(
      "INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note) " +
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    );
    this.#insertReservation = db.prepare(
      "INSERT INTO reservations (id, org_id, request_id, amount_microusd, status, cost_microusd, created_at_ms, expires_at_ms, resolved_at_ms) " +
        "VALUES (?, ?, ?, ?, 'pending', NULL, ?, ?, NULL)",
    );
    this.#reservation = db.prepare(`SELECT ${RESERVATION_COLUMNS} FROM reservations WHERE id = ?`);
    this.#markSettled = db.prepare(
      "UPDATE reservations SET status = 'settled', cost_microusd = ?, resolved_at_ms = ? WHERE id = ? AND status = 'pending'",
    );
    this.#markResolved = db.prepare("UPDATE reservations SET status = ?, resolved_at_ms = ? WHERE id = ? AND status = 'pending'");
    this.#dueReservations = db.prepare(DUE_RESERVATIONS_SQL);
    this.#ledger = db.prepare(`SELECT ${LEDGER_COLUMNS} FROM ledger_entries WHERE org_id = ? ORDER BY id`);

    const apply = (orgId: string, kind: LedgerKind, reservationId: string | null, delta: Delta, nowMs: number, note: string | null) => {
      const changed = this.#applyDelta.run(delta.available, delta.reserved, delta.spent, delta.granted, orgId).changes;
      if (changed !== 1) throw new Error(`No credit balance for organization ${JSON.stringify(orgId)} (ledger ${kind})`);
      this.#insertLedger.run(orgId, kind, reservationId, delta.available, delta.reserved, delta.spent, delta.granted, nowMs, note);
    };

    /** pending → released or expired: the whole amount back to available. False when it was not pending. */
    const giveBack = (row: ReservationRow, status: "released" | "expired", nowMs: number): boolean => {
      if (this.#markResolved.run(status, nowMs, row.id).changes !== 1) return false;
      const amount = row.amount_microusd;
      apply(row.org_id, status === "released" ? "release" : "expire", row.id, { available: amount, reserved: -amount, spent: 0, granted: 0 }, nowMs, null);
      return true;
    };

    const checkUsageOrg = (row: ReservationRow | undefined, usage: UsageRecord | null) => {
      if (row && usage && usage.orgId !== row.org_id) {
        throw new StoreInputError(`The usage record belongs to organization ${JSON.stringify(usage.orgId)}, the reservation to another`, "usage.orgId");
      }
    };

    this.#grantTx = db.transaction((input: GrantInput): Balance => {
      if (!this.#orgExists.get(input.orgId)) throw new StoreInputError(`No organization with id ${JSON.stringify(input.orgId)}`, "orgId");
      const current = this.#balance.get(input.orgId) ?? ZERO_BALANCE;
      if (!Number.isSafeInteger(current.granted + input.amountMicrousd)) {
        throw new StoreInputError("The grant would take the organization's credits beyond the safe integer range", "amountMicrousd");
      }
      this.#createBalance.run(input.orgId);
      apply(input.orgId, "grant", null, { available: input.amountMicrousd, reserved: 0, spent: 0, granted: input.amountMicrousd }, input.nowMs, input.note);
      return { ...this.#balance.get(input.orgId)! };
    });

    this.#reserveTx = db.transaction((input: ReserveInput): "reserved" | "insufficient" => {
      const amount = input.amountMicrousd;
      if (amount === 0) this.#createBalanceIfOrg.run(input.orgId);
      // The one conditional update: succeeds only while available covers the amount.
      if (this.#reserve.run(amount, amount, input.orgId, amount).changes !== 1) return "insufficient";
      try {
        this.#insertReservation.run(input.reservationId, input.orgId, input.requestId, amount, input.nowMs, input.expiresAtMs);
      } catch (err) {
        // Thrown inside the transaction: the balance update above is rolled back too.
        if (isConstraint(err, ...UNIQUE_CODES)) throw new StoreConflictError(`A reservation with id ${JSON.stringify(input.reservationId)} already exists`);
        throw err;
      }
      this.#insertLedger.run(input.orgId, "reserve", input.reservationId, -amount, amount, 0, 0, input.nowMs, null);
      return "reserved";
    });

    this.#settleTx = db.transaction((input: SettleInput): SettleResult => {
      const row = this.#reservation.get(input.reservationId);
      if (!row) return "not_pending";
      if (input.costMicrousd > row.amount_microusd) {
        throw new RangeError(`The cost ${input.costMicrousd} exceeds the reservation ${JSON.stringify(row.id)} of ${row.amount_microusd} microUSD`);
      }
      if (row.status !== "pending") return "not_pending";
      checkUsageOrg(row, input.usage);
      if (row.expires_at_ms <= input.nowMs) return giveBack(row, "expired", input.nowMs) ? "expired" : "not_pending";
      if (this.#markSettled.run(input.costMicrousd, input.nowMs, row.id).changes !== 1) return "not_pending";
      const amount = row.amount_microusd;
      const cost = input.costMicrousd;
      apply(row.org_id, "settle", row.id, { available: amount - cost, reserved: -amount, spent: cost, granted: 0 }, input.nowMs, null);
      insertUsage(input.usage);
      return "settled";
    });

    this.#releaseTx = db.transaction((input: ReleaseInput): ReleaseResult => {
      const row = this.#reservation.get(input.reservationId);
      checkUsageOrg(row, input.usage);
      const released = row !== undefined && row.status === "pending" && giveBack(row, "released", input.nowMs);
      if (input.usage) insertUsage(input.usage);
      return released ? "released" : "not_pending";
    });

    this.#expireTx = db.transaction((input: ExpireInput): number => {
      if (input.limit === 0) return 0;
      let expired = 0;
      for (const row of this.#dueReservations.all(input.nowMs, input.limit)) {
        if (giveBack(row, "expired", input.nowMs)) expired++;
      }
      return expired;
    });
  }

  grant(input: { orgId: string; amountMicrousd: number; nowMs: number; note?: string }): Balance {
    checkText(input.orgId, "orgId");
    checkAmount(input.amountMicrousd, "amountMicrousd", { positive: true });
    checkEpochMs(input.nowMs, "nowMs");
    return this.#grantTx.immediate({ orgId: input.orgId, amountMicrousd: input.amountMicrousd, nowMs: input.nowMs, note: input.note ?? null });
  }

  balance(orgId: string): Balance {
    const row = this.#balance.get(orgId);
    return row ? { ...row } : { ...ZERO_BALANCE };
  }

  reserve(input: ReserveInput): "reserved" | "insufficient" {
    checkText(input.reservationId, "reservationId");
    checkText(input.orgId, "orgId");
    checkText(input.requestId, "requestId");
    checkAmount(input.amountMicrousd, "amountMicrousd");
    checkEpochMs(input.nowMs, "nowMs");
    checkEpochMs(input.expiresAtMs, "expiresAtMs");
    return this.#reserveTx.immediate(input);
  }

  settle(input: SettleInput): SettleResult {
    checkAmount(input.costMicrousd, "costMicrousd");
    checkEpochMs(input.nowMs, "nowMs");
    return this.#settleTx.immediate(input);
  }

  release(input: ReleaseInput): ReleaseResult {
    checkEpochMs(input.nowMs, "nowMs");
    return this.#releaseTx.immediate(input);
  }

  expire(input: ExpireInput): number {
    checkEpochMs(input.nowMs, "nowMs");
    checkCount(input.limit, "limit");
    return this.#expireTx.immediate(input);
  }

  reservation(reservationId: string): Reservation | null {
    const row = this.#reservation.get(reservationId);
    return row ? toReservation(row) : null;
  }

  ledger(orgId: string): LedgerEntry[] {
    return this.#ledger.all(orgId).map(toLedgerEntry);
  }
}
