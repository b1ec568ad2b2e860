import type Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
import {
  type AdminIdempotencyRow,
  AUDIT_INSERT,
  AUDIT_PARAM_COUNT,
  auditParams,
  audits,
  checkAudit,
  checkGrantOnce,
  checkUsageTotalsQuery,
  type GrantOnceInput,
  idempotencyParams,
  type SumsRow,
  storedAnswer,
  toSums,
  type UsageTotalsQuery,
} from "../admin-rows.ts";
import type { AuditActor, GrantOnceResult, UsageTotals } from "../administration.ts";
import { bookkeepingWrites, checkGrant, checkUsageQuery, type GrantInput, grantOf } from "../bookkeeping/books.ts";
import { checkLease, ENDED_LEASES_KEPT_MS, type LeaseInput } from "../bookkeeping/leases.ts";
import { type BookProgram, runSync } from "../bookkeeping/rows.ts";
import type { BooksPart } from "../compose-store.ts";
import {
  LEDGER_COLUMNS,
  type LedgerRow,
  RESERVATION_COLUMNS,
  type ReservationRow,
  toLedgerEntry,
  toReservation,
  ZERO_BALANCE,
} from "../credit-rows.ts";
import { checkCount, checkDay, checkEpochMs, checkPreviewOrg, GLOBAL_PREVIEW_SCOPE } from "../input-checks.ts";
import type {
  Balance,
  BookkeepingStore,
  LedgerEntry,
  PurgeResult,
  Reservation,
  SweepResult,
  UsagePage,
  UsageQuery,
  UsageRecord,
} from "../store.ts";
import { decodeUsageCursor, encodeUsageCursor } from "../usage-cursor.ts";
import { dailySumColumns } from "../usage-daily-rows.ts";
import { toUsage, USAGE_COLUMNS, type UsageRow } from "../usage-rows.ts";
import { SqliteBookRows } from "./sqlite-book-rows.ts";

/**
 * The SQL and parameters of one usage page (limit + 1 rows, to know whether more follow). Exported for the
 * query-plan test. Only one upper bound is used: with a cursor and toMs, whichever is lower implies the other,
 * so SQLite can seek to it in usage_records_by_org_time instead of scanning the earlier pages.
 */
export function usageListQuery(orgId: string, query: UsageQuery): { sql: string; params: unknown[] } {
  const cursor = query.cursor === undefined ? undefined : decodeUsageCursor(query.cursor);
  const clauses = ["org_id = ?"];
  const params: unknown[] = [orgId];
  if (query.fromMs !== undefined) {
    clauses.push("created_at_ms >= ?");
    params.push(query.fromMs);
  }
  if (query.toMs !== undefined && (cursor === undefined || cursor.createdAtMs >= query.toMs)) {
    clauses.push("created_at_ms < ?");
    params.push(query.toMs);
  } else if (cursor !== undefined) {
    clauses.push("(created_at_ms, request_id) < (?, ?)");
    params.push(cursor.createdAtMs, cursor.requestId);
  }
  if (query.outcome !== undefined) {
    clauses.push("outcome = ?");
    params.push(query.outcome);
  }
  params.push(query.limit + 1);
  // With an outcome, its index (migration 004) is never worse than the time index: the same order, and only that
  // outcome's rows. Named, because without statistics SQLite takes the time index when both from and to are set.
  const table = query.outcome !== undefined ? "usage_records INDEXED BY usage_records_by_org_outcome_time" : "usage_records";
  const sql = `SELECT ${USAGE_COLUMNS} FROM ${table} WHERE ${clauses.join(" AND ")} ORDER BY created_at_ms DESC, request_id DESC LIMIT ?`;
  return { sql, params };
}

/**
 * The usage totals statements, from the daily roll-up: per day or per organization (with its name), of every
 * organization or one. They read at most one row per organization and day of the window.
 */
function totalsQuery(by: "day" | "org", oneOrg: boolean): string {
  const where = `d.day_start_ms >= ? AND d.day_start_ms < ?${oneOrg ? " AND d.org_id = ?" : ""}`;
  return by === "day"
    ? `SELECT d.day_start_ms, ${dailySumColumns()} FROM usage_daily d WHERE ${where} GROUP BY d.day_start_ms ORDER BY d.day_start_ms`
    : `SELECT g.*, o.name FROM (SELECT d.org_id, ${dailySumColumns()} FROM usage_daily d WHERE ${where} GROUP BY d.org_id) g ` +
        "LEFT JOIN organizations o ON o.id = g.org_id ORDER BY g.sum_cost DESC, g.requests DESC, g.org_id";
}

/**
 * The books in SQLite. Every write is one BEGIN IMMEDIATE transaction; `commitBatch` fails at once with
 * SQLITE_BUSY while another process holds the write lock (the group committer waits and retries it without
 * blocking the event loop), the other writes go through `write`, which waits the same way.
 */
export class SqliteBooks implements BooksPart {
  readonly #db: Database.Database;
  readonly #rows: SqliteBookRows;
  readonly #balance: Statement<[string], Balance>;
  readonly #reservation: Statement<[string], ReservationRow>;
  readonly #ledger: Statement<[string], LedgerRow>;
  readonly #counter: Statement<[string, string], { count: number }>;
  readonly #getUsage: Statement<[string, string], UsageRow>;
  readonly #listUsage = new Map<string, Statement<unknown[], UsageRow>>();
  readonly #purgeIdempotency: Statement<[number, number]>;
  readonly #purgeCounters: Statement<[string, number]>;
  readonly #purgeAdminIdempotency: Statement<[number, number]>;
  readonly #insertAudit: Statement<unknown[]>;
  readonly #adminIdempotency: Statement<[string], AdminIdempotencyRow>;
  readonly #putAdminIdempotency: Statement<unknown[]>;
  readonly #totals: Database.Transaction<(query: UsageTotalsQuery) => UsageTotals>;
  readonly #previewUsage: Database.Transaction<(orgId: string, day: string) => { org: number; global: number }>;
  readonly #putLease: Statement<[string, number, number]>;
  readonly #dropEndedLeases: Statement<[number]>;
  readonly #writes: Pick<BookkeepingStore, "commitBatch" | "sweep" | "releaseOrphans" | "grantCredits">;

  constructor(
    db: Database.Database,
    private readonly write: <T>(fn: () => T) => Promise<T>,
  ) {
    this.#db = db;
    this.#rows = new SqliteBookRows(db);
    this.#balance = db.prepare("SELECT available, reserved, spent, granted FROM org_balances WHERE org_id = ?");
    this.#reservation = db.prepare(`SELECT ${RESERVATION_COLUMNS} FROM reservations WHERE id = ?`);
    this.#ledger = db.prepare(`SELECT ${LEDGER_COLUMNS} FROM ledger_entries WHERE org_id = ? ORDER BY id`);
    this.#counter = db.prepare("SELECT count FROM preview_counters WHERE scope = ? AND day = ?");
    this.#getUsage = db.prepare(`SELECT ${USAGE_COLUMNS} FROM usage_records WHERE org_id = ? AND request_id = ?`);
    this.#purgeIdempotency = db.prepare(
      "DELETE FROM idempotency_keys WHERE rowid IN (SELECT rowid FROM idempotency_keys WHERE expires_at_ms <= ? LIMIT ?)",
    );
    this.#purgeCounters = db.prepare(
      "DELETE FROM preview_counters WHERE rowid IN (SELECT rowid FROM preview_counters WHERE day < ? LIMIT ?)",
    );
    this.#purgeAdminIdempotency = db.prepare(
      "DELETE FROM admin_idempotency WHERE key IN (SELECT key FROM admin_idempotency WHERE expires_at_ms <= ? LIMIT ?)",
    );
    this.#insertAudit = db.prepare(`${AUDIT_INSERT} VALUES (${Array(AUDIT_PARAM_COUNT).fill("?").join(", ")})`);
    this.#adminIdempotency = db.prepare("SELECT request_hash, response, expires_at_ms FROM admin_idempotency WHERE key = ?");
    // An expired entry is replaced.
    this.#putAdminIdempotency = db.prepare(
      "INSERT OR REPLACE INTO admin_idempotency (key, request_hash, response, created_at_ms, expires_at_ms) VALUES (?, ?, ?, ?, ?)",
    );
    this.#putLease = db.prepare(
      "INSERT INTO gateway_instances (id, started_at_ms, lease_until_ms) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET lease_until_ms = excluded.lease_until_ms",
    );
    this.#dropEndedLeases = db.prepare(
      "DELETE FROM gateway_instances WHERE lease_until_ms < ? " +
        "AND NOT EXISTS (SELECT 1 FROM usage_records u WHERE u.outcome = 'in_flight' AND u.instance_id = gateway_instances.id)",
    );
    const totals = {
      days: db.prepare<unknown[], SumsRow & { day_start_ms: number }>(totalsQuery("day", false)),
      orgDays: db.prepare<unknown[], SumsRow & { day_start_ms: number }>(totalsQuery("day", true)),
      orgs: db.prepare<unknown[], SumsRow & { org_id: string; name: string | null }>(totalsQuery("org", false)),
      oneOrg: db.prepare<unknown[], SumsRow & { org_id: string; name: string | null }>(totalsQuery("org", true)),
    };
    // Both lists from one snapshot.
    this.#totals = db.transaction((q: UsageTotalsQuery) => {
      const params = q.orgId === undefined ? [q.fromMs, q.toMs] : [q.fromMs, q.toMs, q.orgId];
      const one = q.orgId !== undefined;
      return {
        days: (one ? totals.orgDays : totals.days).all(...params).map((r) => ({ dayStartMs: r.day_start_ms, ...toSums(r) })),
        organizations: (one ? totals.oneOrg : totals.orgs).all(...params).map((r) => ({ orgId: r.org_id, name: r.name, ...toSums(r) })),
      };
    });
    this.#previewUsage = db.transaction((orgId: string, day: string) => ({
      org: this.#counter.get(orgId, day)?.count ?? 0,
      global: this.#counter.get(GLOBAL_PREVIEW_SCOPE, day)?.count ?? 0,
    }));
    const failFast = bookkeepingWrites(async (program) => this.#runNow(() => this.#run(program())));
    const patient = bookkeepingWrites((program) => this.write(() => this.#runNow(() => this.#run(program()))));
    this.#writes = {
      commitBatch: failFast.commitBatch,
      sweep: patient.sweep,
      releaseOrphans: patient.releaseOrphans,
      grantCredits: patient.grantCredits,
    };
  }

  /**
   * `fn` (a program, and what goes with it) in one BEGIN IMMEDIATE transaction, synchronously: no other statement
   * can interleave.
   */
  #runNow<T>(fn: () => T): T {
    this.#db.exec("BEGIN IMMEDIATE");
    try {
      const result = fn();
      this.#db.exec("COMMIT");
      return result;
    } catch (err) {
      if (this.#db.inTransaction) this.#db.exec("ROLLBACK");
      throw err;
    }
  }

  /** Drives a program; the caller holds the transaction. */
  #run<T>(program: BookProgram<T>): T {
    return runSync(
      program,
      (q) => this.#rows.read(q),
      (w) => this.#rows.write(w),
    );
  }

  /** The grant program and its audit entry; the caller holds the transaction. */
  #grantAudited(input: GrantInput, actor: AuditActor): Balance {
    const balance = this.#run(grantOf(input)());
    this.#insertAudit.run(...auditParams(audits.creditsGranted(input, actor)));
    return balance;
  }

  commitBatch(batch: Parameters<BookkeepingStore["commitBatch"]>[0]) {
    return this.#writes.commitBatch(batch);
  }

  sweep(input: { nowMs: number; inFlightBeforeMs: number; limit: number }): Promise<SweepResult> {
    return this.#writes.sweep(input);
  }

  releaseOrphans(input: Parameters<BookkeepingStore["releaseOrphans"]>[0]): Promise<{ released: number }> {
    return this.#writes.releaseOrphans(input);
  }

  async renewLease(input: LeaseInput): Promise<void> {
    checkLease(input);
    return this.write(() =>
      this.#runNow(() => {
        this.#putLease.run(input.instanceId, input.startedAtMs, input.leaseUntilMs);
        this.#dropEndedLeases.run(input.nowMs - ENDED_LEASES_KEPT_MS);
      }),
    );
  }

  async grantCredits(input: GrantInput & { audit?: AuditActor }): Promise<Balance> {
    const { audit } = input;
    if (audit === undefined) return this.#writes.grantCredits(input);
    checkGrant(input);
    checkAudit(audit);
    return this.write(() => this.#runNow(() => this.#grantAudited(input, audit)));
  }

  /** Calls with one key are serialized by the write lock: the first grants, the others find its entry. */
  async grantCreditsOnce(input: GrantOnceInput): Promise<GrantOnceResult> {
    checkGrantOnce(input);
    return this.write(() =>
      this.#runNow((): GrantOnceResult => {
        const stored = storedAnswer(this.#adminIdempotency.get(input.idempotency.key), input.idempotency.requestHash, input.nowMs);
        if (stored) return stored;
        const balance = this.#grantAudited(input, input.audit);
        this.#putAdminIdempotency.run(...idempotencyParams(input, balance));
        return { kind: "granted", balance };
      }),
    );
  }

  async purge(input: { nowMs: number; keepFromDay: string; limit: number }): Promise<PurgeResult> {
    checkEpochMs(input.nowMs, "nowMs");
    checkDay(input.keepFromDay, "keepFromDay");
    checkCount(input.limit, "limit");
    return this.write(() => ({
      idempotencyKeys:
        this.#purgeIdempotency.run(input.nowMs, input.limit).changes + this.#purgeAdminIdempotency.run(input.nowMs, input.limit).changes,
      previewCounters: this.#purgeCounters.run(input.keepFromDay, input.limit).changes,
    }));
  }

  async usageTotals(query: UsageTotalsQuery): Promise<UsageTotals> {
    checkUsageTotalsQuery(query);
    return this.#totals.deferred(query);
  }

  async getBalance(orgId: string): Promise<Balance> {
    const row = this.#balance.get(orgId);
    return row ? { ...row } : { ...ZERO_BALANCE };
  }

  async getReservation(reservationId: string): Promise<Reservation | null> {
    const row = this.#reservation.get(reservationId);
    return row ? toReservation(row) : null;
  }

  async listLedger(orgId: string): Promise<LedgerEntry[]> {
    return this.#ledger.all(orgId).map(toLedgerEntry);
  }

  async previewUsage(orgId: string, day: string): Promise<{ org: number; global: number }> {
    checkPreviewOrg(orgId);
    checkDay(day);
    // Both counters from one snapshot.
    return this.#previewUsage.deferred(orgId, day);
  }

  async getUsage(orgId: string, requestId: string): Promise<UsageRecord | null> {
    const row = this.#getUsage.get(orgId, requestId);
    return row ? toUsage(row) : null;
  }

  async listUsage(orgId: string, query: UsageQuery): Promise<UsagePage> {
    checkUsageQuery(query);
    const { sql, params } = usageListQuery(orgId, query);
    let statement = this.#listUsage.get(sql);
    if (!statement) {
      statement = this.#db.prepare<unknown[], UsageRow>(sql);
      this.#listUsage.set(sql, statement);
    }
    const rows = statement.all(...params);
    const more = rows.length > query.limit;
    const records = (more ? rows.slice(0, query.limit) : rows).map(toUsage);
    const last = records[records.length - 1];
    return { records, nextCursor: more && last ? encodeUsageCursor({ createdAtMs: last.createdAtMs, requestId: last.requestId }) : null };
  }
}
