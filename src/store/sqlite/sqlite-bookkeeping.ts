import type Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
import type { AuditActor } from "../../domain/audit.ts";
import type { PurgeResult, SweepResult } from "../../domain/bookkeeping.ts";
import type { Balance } from "../../domain/credits.ts";
import {
  type AdminIdempotencyRow,
  auditParams,
  audits,
  checkAudit,
  checkGrantOnce,
  type GrantOnceInput,
  INSERT_AUDIT,
  idempotencyParams,
  storedAnswer,
  type UsageTotalsQuery,
} from "../admin-rows.ts";
import type { GrantOnceResult } from "../administration.ts";
import { bookkeepingWrites, checkGrant, type GrantInput, grantOf } from "../bookkeeping/checked-writes.ts";
import { checkLease, ENDED_LEASES_KEPT_MS, type LeaseInput } from "../bookkeeping/leases.ts";
import { BookkeepingReads, type TotalsRows, type UsageListDialect, usagePageStatement } from "../bookkeeping/reads.ts";
import { type BookProgram, NO_WORK_IN_FLIGHT, runSync } from "../bookkeeping/rows.ts";
import { SharedBlock } from "../bookkeeping/shared-blocks.ts";
import type { BookkeepingPart } from "../compose-store.ts";
import { checkCount, checkDay, checkEpochMs } from "../input-checks.ts";
import type { DbRow } from "../schema/table.ts";
import type { BookkeepingStore, UsageQuery } from "../store.ts";
import { dailySumColumns } from "../usage-daily-rows.ts";
import { SqliteBookRows } from "./sqlite-book-rows.ts";

/**
 * Usage pages in SQLite: time bounds compared with their fraction; with an outcome, its index (migration 004) is never
 * worse than the time index (the same order, and only that outcome's rows), named because without statistics SQLite
 * takes the time index when both from and to are set.
 */
const USAGE_LIST: UsageListDialect = {
  timeBound: (ms) => ms,
  byOutcome: "usage_records INDEXED BY usage_records_by_org_outcome_time",
};

/** The SQL and parameters of one usage page in SQLite; exported for the query-plan test. */
export const usageListQuery = (orgId: string, query: UsageQuery) => usagePageStatement(orgId, query, USAGE_LIST);

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
export class SqliteBookkeeping extends BookkeepingReads implements BookkeepingPart {
  readonly #db: Database.Database;
  readonly #rows: SqliteBookRows;
  /** Read statements by their SQL, each prepared once. */
  readonly #reads = new Map<string, Statement<unknown[], DbRow>>();
  readonly #purgeIdempotency: Statement<[number, number]>;
  readonly #purgeCounters: Statement<[string, number]>;
  readonly #purgeAdminIdempotency: Statement<[number, number]>;
  readonly #insertAudit: Statement<unknown[]>;
  readonly #adminIdempotency: Statement<[string], AdminIdempotencyRow>;
  readonly #putAdminIdempotency: Statement<unknown[]>;
  readonly #totals: Database.Transaction<(query: UsageTotalsQuery) => TotalsRows>;
  readonly #putLease: Statement<[string, number, number]>;
  readonly #dropEndedLeases: Statement<[number]>;
  readonly #writes: Pick<BookkeepingPart, "commitBatch" | "sweep" | "releaseOrphans" | "grantCredits" | "returnHeldUnits">;
  protected readonly usageList = USAGE_LIST;

  constructor(
    db: Database.Database,
    private readonly write: <T>(fn: () => T) => Promise<T>,
  ) {
    super();
    this.#db = db;
    this.#rows = new SqliteBookRows(db);
    this.#purgeIdempotency = db.prepare(
      "DELETE FROM idempotency_keys WHERE rowid IN (SELECT rowid FROM idempotency_keys WHERE expires_at_ms <= ? LIMIT ?)",
    );
    this.#purgeCounters = db.prepare(
      "DELETE FROM preview_counters WHERE rowid IN (SELECT rowid FROM preview_counters WHERE day < ? LIMIT ?)",
    );
    this.#purgeAdminIdempotency = db.prepare(
      "DELETE FROM admin_idempotency WHERE key IN (SELECT key FROM admin_idempotency WHERE expires_at_ms <= ? LIMIT ?)",
    );
    this.#insertAudit = db.prepare(INSERT_AUDIT);
    this.#adminIdempotency = db.prepare("SELECT request_hash, response, expires_at_ms FROM admin_idempotency WHERE key = ?");
    // An expired entry is replaced.
    this.#putAdminIdempotency = db.prepare(
      "INSERT OR REPLACE INTO admin_idempotency (key, request_hash, response, created_at_ms, expires_at_ms) VALUES (?, ?, ?, ?, ?)",
    );
    this.#putLease = db.prepare(
      "INSERT INTO gateway_instances (id, started_at_ms, lease_until_ms) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET lease_until_ms = excluded.lease_until_ms",
    );
    this.#dropEndedLeases = db.prepare(`DELETE FROM gateway_instances AS g WHERE g.lease_until_ms < ? AND ${NO_WORK_IN_FLIGHT}`);
    const totals = {
      days: db.prepare<unknown[], TotalsRows["days"][number]>(totalsQuery("day", false)),
      orgDays: db.prepare<unknown[], TotalsRows["days"][number]>(totalsQuery("day", true)),
      orgs: db.prepare<unknown[], TotalsRows["organizations"][number]>(totalsQuery("org", false)),
      oneOrg: db.prepare<unknown[], TotalsRows["organizations"][number]>(totalsQuery("org", true)),
    };
    // Both lists from one snapshot.
    this.#totals = db.transaction((q: UsageTotalsQuery) => {
      const params = q.orgId === undefined ? [q.fromMs, q.toMs] : [q.fromMs, q.toMs, q.orgId];
      const one = q.orgId !== undefined;
      return {
        days: (one ? totals.orgDays : totals.days).all(...params),
        organizations: (one ? totals.oneOrg : totals.orgs).all(...params),
      };
    });
    const block = new SharedBlock();
    const failFast = bookkeepingWrites(async (program) => this.#runNow(() => this.#run(program())), block);
    const patient = bookkeepingWrites((program) => this.write(() => this.#runNow(() => this.#run(program()))), block);
    this.#writes = {
      commitBatch: failFast.commitBatch,
      returnHeldUnits: patient.returnHeldUnits,
      sweep: patient.sweep,
      releaseOrphans: patient.releaseOrphans,
      grantCredits: patient.grantCredits,
    };
  }

  protected async rows<R = DbRow>(sql: string, params: readonly unknown[]): Promise<R[]> {
    let statement = this.#reads.get(sql);
    if (!statement) {
      statement = this.#db.prepare<unknown[], DbRow>(sql);
      this.#reads.set(sql, statement);
    }
    return statement.all(...params) as R[];
  }

  protected async totalsRows(query: UsageTotalsQuery): Promise<TotalsRows> {
    return this.#totals.deferred(query);
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

  returnHeldUnits(): Promise<void> {
    return this.#writes.returnHeldUnits();
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
}
