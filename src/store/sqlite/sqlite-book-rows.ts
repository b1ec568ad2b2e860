import type Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
import {
  CLAIM_HOLDER_COLUMNS,
  CLAIM_HOLDER_JOINS,
  counterKey,
  emptySnapshot,
  IDEMPOTENCY_COLUMNS,
  type IdempotencyDbRow,
  idempotencyKey,
  type ReservationRow,
  type Snapshot,
  type SnapshotQuery,
  toIdempotencyRow,
  toUsageState,
  USAGE_STATE_COLUMNS,
  type UsageStateRow,
  type WriteSet,
} from "../bookkeeping/rows.ts";
import { RESERVATION_COLUMNS } from "../credit-rows.ts";
import { type Balance, StoreConflictError } from "../store.ts";
import { addToUsageDaily, USAGE_DAILY_PARAM_COUNT, usageDailyParams } from "../usage-daily-rows.ts";
import { USAGE_COLUMNS } from "../usage-rows.ts";
import { isConstraint, UNIQUE_CODES } from "./sqlite-errors.ts";

/**
 * The rows of the bookkeeping programs in SQLite: reads by primary key and writes row by row with prepared
 * statements, inside the caller's BEGIN IMMEDIATE transaction (which already holds the database's write lock,
 * so nothing needs locking row by row).
 */
export class SqliteBookRows {
  readonly #orgExists: Statement<[string], { one: number }>;
  readonly #counter: Statement<[string, string], { count: number }>;
  readonly #usageState: Statement<[string], UsageStateRow>;
  readonly #reservation: Statement<[string], ReservationRow>;
  readonly #balance: Statement<[string], Balance>;
  readonly #idempotency: Statement<[string, string], IdempotencyDbRow>;
  readonly #dueInFlight: Statement<[number, number], UsageStateRow>;
  readonly #dueReservations: Statement<[number, number], ReservationRow>;
  readonly #orphanedInFlight: Statement<[string, number | null, number, number], UsageStateRow>;

  readonly #insertUsage: Statement<unknown[]>;
  readonly #finalUsage: Statement<unknown[]>;
  readonly #insertReservation: Statement<unknown[]>;
  readonly #resolveReservation: Statement<unknown[]>;
  readonly #insertLedger: Statement<unknown[]>;
  readonly #insertBalance: Statement<unknown[]>;
  readonly #moveBalance: Statement<unknown[]>;
  readonly #putCounter: Statement<unknown[]>;
  readonly #putIdempotency: Statement<unknown[]>;
  readonly #deleteIdempotency: Statement<unknown[]>;
  readonly #addUsageDaily: Statement<unknown[]>;

  constructor(db: Database.Database) {
    this.#orgExists = db.prepare("SELECT 1 AS one FROM organizations WHERE id = ?");
    this.#counter = db.prepare("SELECT count FROM preview_counters WHERE scope = ? AND day = ?");
    this.#usageState = db.prepare(`SELECT ${USAGE_STATE_COLUMNS} FROM usage_records WHERE request_id = ?`);
    this.#reservation = db.prepare(`SELECT ${RESERVATION_COLUMNS} FROM reservations WHERE id = ?`);
    this.#balance = db.prepare("SELECT available, reserved, spent, granted FROM org_balances WHERE org_id = ?");
    this.#idempotency = db.prepare(
      `SELECT ${IDEMPOTENCY_COLUMNS.replace(/(\w+)/g, "i.$1")}, ${CLAIM_HOLDER_COLUMNS} FROM idempotency_keys i ${CLAIM_HOLDER_JOINS} ` +
        "WHERE i.org_id = ? AND i.key = ?",
    );
    this.#dueInFlight = db.prepare(
      `SELECT ${USAGE_STATE_COLUMNS} FROM usage_records WHERE outcome = 'in_flight' AND created_at_ms < ? ORDER BY created_at_ms LIMIT ?`,
    );
    this.#dueReservations = db.prepare(
      `SELECT ${RESERVATION_COLUMNS} FROM reservations r WHERE status = 'pending' AND expires_at_ms <= ? ` +
        "AND NOT EXISTS (SELECT 1 FROM usage_records u WHERE u.request_id = r.request_id AND u.outcome = 'in_flight') ORDER BY expires_at_ms LIMIT ?",
    );
    this.#orphanedInFlight = db.prepare(
      `SELECT ${USAGE_STATE_COLUMNS} FROM usage_records u WHERE outcome = 'in_flight' AND instance_id IS NOT ? AND (created_at_ms < ? ` +
        "OR EXISTS (SELECT 1 FROM gateway_instances g WHERE g.id = u.instance_id AND g.lease_until_ms <= ?)) ORDER BY created_at_ms LIMIT ?",
    );

    this.#insertUsage = db.prepare(`INSERT INTO usage_records (${USAGE_COLUMNS}, instance_id) VALUES (${Array(20).fill("?").join(", ")})`);
    this.#finalUsage = db.prepare(
      "UPDATE usage_records SET completed_at_ms = ?, outcome = ?, http_status = ?, input_tokens = ?, output_tokens = ?, cost_microusd = ?, " +
        "latency_ms = ?, gateway_latency_ms = ?, error_detail = ?, over_reservation = ?, deployment = ?, attempts = ? " +
        "WHERE request_id = ? AND outcome = 'in_flight'",
    );
    this.#insertReservation = db.prepare(`INSERT INTO reservations (${RESERVATION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`);
    this.#resolveReservation = db.prepare(
      "UPDATE reservations SET status = ?, cost_microusd = ?, resolved_at_ms = ? WHERE id = ? AND status = 'pending'",
    );
    this.#insertLedger = db.prepare(
      "INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note) " +
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    );
    this.#insertBalance = db.prepare("INSERT INTO org_balances (org_id, available, reserved, spent, granted) VALUES (?, ?, ?, ?, ?)");
    this.#moveBalance = db.prepare(
      "UPDATE org_balances SET available = available + ?, reserved = reserved + ?, spent = spent + ?, granted = granted + ? WHERE org_id = ?",
    );
    this.#putCounter = db.prepare(
      "INSERT INTO preview_counters (scope, day, count) VALUES (?, ?, ?) ON CONFLICT (scope, day) DO UPDATE SET count = excluded.count",
    );
    this.#putIdempotency = db.prepare(
      `INSERT INTO idempotency_keys (${IDEMPOTENCY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (org_id, key) DO UPDATE SET ` +
        "request_hash = excluded.request_hash, request_id = excluded.request_id, state = excluded.state, response_status = excluded.response_status, " +
        "response_body = excluded.response_body, response_request_id = excluded.response_request_id, lock_until_ms = excluded.lock_until_ms, " +
        "expires_at_ms = excluded.expires_at_ms",
    );
    this.#deleteIdempotency = db.prepare("DELETE FROM idempotency_keys WHERE org_id = ? AND key = ?");
    this.#addUsageDaily = db.prepare(addToUsageDaily(`VALUES (${Array(USAGE_DAILY_PARAM_COUNT).fill("?").join(", ")})`));
  }

  read(q: SnapshotQuery): Snapshot {
    const s = emptySnapshot();
    for (const { scope, day } of q.counters ?? []) {
      const row = this.#counter.get(scope, day);
      if (row) s.counters.set(counterKey(scope, day), row.count);
    }
    for (const id of q.usage ?? []) {
      const row = this.#usageState.get(id);
      if (row) s.usage.set(id, toUsageState(row));
    }
    for (const id of q.reservations ?? []) {
      const row = this.#reservation.get(id);
      if (row) s.reservations.set(id, row);
    }
    for (const orgId of q.balances ?? []) {
      if (!this.#orgExists.get(orgId)) continue;
      s.organizations.add(orgId);
      const row = this.#balance.get(orgId);
      if (row) s.balances.set(orgId, { ...row });
    }
    for (const { orgId, key } of q.idempotency ?? []) {
      const row = this.#idempotency.get(orgId, key);
      if (row) s.idempotency.set(idempotencyKey(orgId, key), toIdempotencyRow(row));
    }
    if (q.dueInFlight) s.dueInFlight = this.#dueInFlight.all(q.dueInFlight.createdBeforeMs, q.dueInFlight.limit).map(toUsageState);
    if (q.dueReservations) s.dueReservations = this.#dueReservations.all(q.dueReservations.nowMs, q.dueReservations.limit);
    if (q.orphanedInFlight) {
      const { instanceId, createdBeforeMs, nowMs, limit } = q.orphanedInFlight;
      s.orphanedInFlight = this.#orphanedInFlight.all(instanceId, createdBeforeMs, nowMs, limit).map(toUsageState);
    }
    return s;
  }

  /** Writes the rows; a duplicate key (a request id, a reservation id) fails with StoreConflictError. */
  write(w: WriteSet): void {
    try {
      this.#write(w);
    } catch (err) {
      if (isConstraint(err, ...UNIQUE_CODES)) throw new StoreConflictError(`A row with this key already exists: ${err.message}`);
      throw err;
    }
  }

  #write(w: WriteSet): void {
    for (const u of w.usageInserts) {
      this.#insertUsage.run(
        u.requestId,
        u.orgId,
        u.keyId,
        u.createdAtMs,
        u.source,
        u.model,
        u.mode,
        u.outcome,
        u.httpStatus,
        u.inputTokens,
        u.outputTokens,
        u.costMicrousd,
        u.latencyMs,
        u.gatewayLatencyMs,
        u.errorDetail,
        u.overReservation ? 1 : 0,
        u.completedAtMs,
        u.deployment,
        u.attempts,
        u.instanceId,
      );
    }
    for (const f of w.usageFinals) {
      const changed = this.#finalUsage.run(
        f.completedAtMs,
        f.outcome,
        f.httpStatus,
        f.inputTokens,
        f.outputTokens,
        f.costMicrousd,
        f.latencyMs,
        f.gatewayLatencyMs,
        f.errorDetail,
        f.overReservation ? 1 : 0,
        f.deployment,
        f.attempts,
        f.requestId,
      ).changes;
      if (changed !== 1) throw new Error(`The usage record ${JSON.stringify(f.requestId)} was not in flight`);
    }
    for (const r of w.reservationInserts) {
      this.#insertReservation.run(
        r.id,
        r.org_id,
        r.request_id,
        r.amount_microusd,
        r.status,
        r.cost_microusd,
        r.created_at_ms,
        r.expires_at_ms,
        r.resolved_at_ms,
      );
    }
    for (const r of w.reservationResolutions) {
      if (this.#resolveReservation.run(r.status, r.costMicrousd, r.resolvedAtMs, r.id).changes !== 1) {
        throw new Error(`The reservation ${JSON.stringify(r.id)} was not pending`);
      }
    }
    // The whole database is locked: a row missing from the snapshot is still missing.
    for (const b of w.balanceInserts) this.#insertBalance.run(b.orgId, b.available, b.reserved, b.spent, b.granted);
    for (const b of w.balanceDeltas) {
      if (this.#moveBalance.run(b.available, b.reserved, b.spent, b.granted, b.orgId).changes !== 1) {
        throw new Error(`No credit balance for organization ${JSON.stringify(b.orgId)}`);
      }
    }
    for (const e of w.ledger) {
      this.#insertLedger.run(
        e.orgId,
        e.kind,
        e.reservationId,
        e.availableDelta,
        e.reservedDelta,
        e.spentDelta,
        e.grantedDelta,
        e.createdAtMs,
        e.note,
      );
    }
    for (const c of w.counters) this.#putCounter.run(c.scope, c.day, c.count);
    for (const i of w.idempotencyPuts) {
      this.#putIdempotency.run(
        i.orgId,
        i.key,
        i.requestHash,
        i.requestId,
        i.state,
        i.responseStatus,
        i.responseBody,
        i.responseRequestId,
        i.lockUntilMs,
        i.expiresAtMs,
      );
    }
    for (const i of w.idempotencyDeletes) this.#deleteIdempotency.run(i.orgId, i.key);
    for (const d of w.usageDaily) this.#addUsageDaily.run(...usageDailyParams(d));
  }
}
