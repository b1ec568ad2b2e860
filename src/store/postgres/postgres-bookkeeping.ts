import type pg from "pg";
import type { AuditActor } from "../../domain/audit.ts";
import type { PurgeResult } from "../../domain/bookkeeping.ts";
import type { Balance } from "../../domain/credits.ts";
import {
  type AdminIdempotencyRow,
  audits,
  checkAudit,
  checkGrantOnce,
  type GrantOnceInput,
  idempotencyParams,
  type SumsRow,
  storedAnswer,
  type UsageTotalsQuery,
} from "../admin-rows.ts";
import type { GrantOnceResult } from "../administration.ts";
import { bookkeepingWrites, checkGrant, type GrantInput, grantOf } from "../bookkeeping/checked-writes.ts";
import { checkLease, ENDED_LEASES_KEPT_MS, type LeaseInput } from "../bookkeeping/leases.ts";
import { BookkeepingReads, type TotalsRows, type UsageListDialect, usagePageStatement } from "../bookkeeping/reads.ts";
import { type BookProgram, NO_WORK_IN_FLIGHT, runAsync } from "../bookkeeping/rows.ts";
import { SharedBlock } from "../bookkeeping/shared-blocks.ts";
import type { BookkeepingPart } from "../compose-store.ts";
import { checkCount, checkDay, checkEpochMs } from "../input-checks.ts";
import { postgres } from "../schema/table.ts";
import type { BookkeepingStore, UsageQuery } from "../store.ts";
import { dailySumColumns } from "../usage-daily-rows.ts";
import { insertAudit } from "./postgres-audit.ts";
import { readSnapshot, writeRows } from "./postgres-book-rows.ts";
import { hasNul, type Pipeline, pipelinedTransaction, withClient } from "./postgres-connection.ts";

/**
 * Usage pages in PostgreSQL. A time bound is a bigint parameter: created_at_ms is a whole number, so `>= x` and `< x`
 * mean the same with ceil(x); beyond the safe range every stored value is on one side of it.
 */
const USAGE_LIST: UsageListDialect = {
  timeBound: (ms) => Math.min(2 ** 53, Math.max(-(2 ** 53), Math.ceil(ms))),
  byOutcome: "usage_records",
};

/** The SQL and parameters of one usage page in PostgreSQL; exported for the query-plan test. */
export function postgresUsageListQuery(orgId: string, query: UsageQuery): { sql: string; params: unknown[] } {
  const { sql, params } = usagePageStatement(orgId, query, USAGE_LIST);
  return { sql: postgres.numbered(sql), params };
}

/**
 * Usage totals per day and per organization (with its name) in one statement (one snapshot, one pass over the daily
 * roll-up: at most one row per organization and day of the window): the day rows are those of the grouping set
 * without org_id. The sums are cast to bigint (sum(bigint) is numeric), which the pool parses to numbers like every bigint.
 */
function totalsQuery(oneOrg: boolean): string {
  return (
    `WITH t AS (SELECT d.day_start_ms, d.org_id, GROUPING(d.org_id) AS by_day, ${dailySumColumns("::bigint")} FROM usage_daily d ` +
    `WHERE d.day_start_ms >= $1 AND d.day_start_ms < $2${oneOrg ? " AND d.org_id = $3" : ""} ` +
    "GROUP BY GROUPING SETS ((d.day_start_ms), (d.org_id))) " +
    "SELECT t.*, o.name FROM t LEFT JOIN organizations o ON o.id = t.org_id " +
    "ORDER BY t.by_day, t.day_start_ms, t.sum_cost DESC, t.requests DESC, t.org_id"
  );
}

/** Takes the transaction advisory lock that serializes the grants of one admin idempotency key (until commit or rollback). */
const ADMIN_IDEMPOTENCY_LOCK = "SELECT pg_advisory_xact_lock(hashtext('admin-idem:' || $1))";

/**
 * The books in PostgreSQL. Every write is one READ COMMITTED transaction of a bookkeeping program, whose rows are
 * read and locked in one shared order (see postgres-book-rows.ts), pipelined: BEGIN goes with the first read, COMMIT
 * with the last write, so a batch costs two round trips; they run on the bookkeeping pool (force_generic_plan). Reads
 * are single statements, on the other pool.
 */
export class PostgresBookkeeping extends BookkeepingReads implements BookkeepingPart {
  readonly commitBatch: BookkeepingStore["commitBatch"];
  readonly sweep: BookkeepingStore["sweep"];
  readonly releaseOrphans: BookkeepingStore["releaseOrphans"];
  readonly returnHeldUnits: BookkeepingPart["returnHeldUnits"];
  readonly #grantCredits: BookkeepingStore["grantCredits"];
  protected readonly usageList = USAGE_LIST;

  constructor(
    private readonly pool: pg.Pool,
    private readonly bookkeepingPool: pg.Pool,
  ) {
    super();
    const writes = bookkeepingWrites((program) => pipelinedTransaction(bookkeepingPool, (p) => run(p, program())), new SharedBlock());
    this.commitBatch = writes.commitBatch;
    this.returnHeldUnits = writes.returnHeldUnits;
    this.sweep = writes.sweep;
    this.releaseOrphans = writes.releaseOrphans;
    this.#grantCredits = writes.grantCredits;
  }

  #query<R extends pg.QueryResultRow>(sql: string, params: readonly unknown[]): Promise<pg.QueryResult<R>> {
    return withClient(this.pool, (c) => c.query<R>(sql, params as unknown[]));
  }

  protected override holds(...texts: string[]): boolean {
    return !hasNul(...texts);
  }

  protected async rows<R>(sql: string, params: readonly unknown[]): Promise<R[]> {
    return (await this.#query<R & pg.QueryResultRow>(postgres.numbered(sql), params)).rows;
  }

  protected async totalsRows(query: UsageTotalsQuery): Promise<TotalsRows> {
    const params = query.orgId === undefined ? [query.fromMs, query.toMs] : [query.fromMs, query.toMs, query.orgId];
    type Row = SumsRow & { day_start_ms: number; org_id: string; name: string | null; by_day: number };
    const { rows } = await this.#query<Row>(totalsQuery(params.length === 3), params);
    return { days: rows.filter((r) => r.by_day === 1), organizations: rows.filter((r) => r.by_day !== 1) };
  }

  /** One statement: the lease upserted, leases ended long ago without work in flight deleted. */
  async renewLease(input: LeaseInput): Promise<void> {
    checkLease(input);
    await this.#query(
      "WITH lease AS (INSERT INTO gateway_instances (id, started_at_ms, lease_until_ms) VALUES ($1, $2, $3) " +
        "ON CONFLICT (id) DO UPDATE SET lease_until_ms = EXCLUDED.lease_until_ms RETURNING 1) " +
        `DELETE FROM gateway_instances g WHERE g.lease_until_ms < $4 AND g.id <> $1 AND ${NO_WORK_IN_FLIGHT}`,
      [input.instanceId, input.startedAtMs, input.leaseUntilMs, input.nowMs - ENDED_LEASES_KEPT_MS],
    );
  }

  async grantCredits(input: GrantInput & { audit?: AuditActor }): Promise<Balance> {
    const { audit } = input;
    if (audit === undefined) return this.#grantCredits(input);
    checkGrant(input);
    checkAudit(audit);
    return pipelinedTransaction(this.bookkeepingPool, (p) => grantAudited(p, input, audit));
  }

  /**
   * Calls with one key are serialized by a transaction advisory lock on it: the first grants and stores its answer,
   * the others wait for its commit and then find that answer.
   */
  async grantCreditsOnce(input: GrantOnceInput): Promise<GrantOnceResult> {
    checkGrantOnce(input);
    const { key, requestHash } = input.idempotency;
    return pipelinedTransaction(this.bookkeepingPool, async (p): Promise<GrantOnceResult> => {
      p.send({ text: ADMIN_IDEMPOTENCY_LOCK, values: [key] });
      const found = p.send<AdminIdempotencyRow>({
        text: "SELECT request_hash, response, expires_at_ms FROM admin_idempotency WHERE key = $1",
        values: [key],
      });
      await p.settle();
      const stored = storedAnswer((await found).rows[0], requestHash, input.nowMs);
      if (stored) return stored;
      const balance = await grantAudited(p, input, input.audit);
      // An expired entry is replaced.
      p.send({
        text:
          "INSERT INTO admin_idempotency (key, request_hash, response, created_at_ms, expires_at_ms) VALUES ($1, $2, $3, $4, $5) " +
          "ON CONFLICT (key) DO UPDATE SET request_hash = EXCLUDED.request_hash, response = EXCLUDED.response, " +
          "created_at_ms = EXCLUDED.created_at_ms, expires_at_ms = EXCLUDED.expires_at_ms",
        values: idempotencyParams(input, balance),
      });
      return { kind: "granted", balance };
    });
  }

  /** Deletes in bounded chunks, skipping rows another transaction holds. */
  async purge(input: { nowMs: number; keepFromDay: string; limit: number }): Promise<PurgeResult> {
    checkEpochMs(input.nowMs, "nowMs");
    checkDay(input.keepFromDay, "keepFromDay");
    checkCount(input.limit, "limit");
    const keys = await this.#query(
      "DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(SELECT ctid FROM idempotency_keys WHERE expires_at_ms <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED))",
      [input.nowMs, input.limit],
    );
    const adminKeys = await this.#query(
      "DELETE FROM admin_idempotency WHERE key = ANY(ARRAY(SELECT key FROM admin_idempotency WHERE expires_at_ms <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED))",
      [input.nowMs, input.limit],
    );
    const counters = await this.#query(
      "DELETE FROM preview_counters WHERE ctid = ANY(ARRAY(SELECT ctid FROM preview_counters WHERE day < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))",
      [input.keepFromDay, input.limit],
    );
    return { idempotencyKeys: (keys.rowCount ?? 0) + (adminKeys.rowCount ?? 0), previewCounters: counters.rowCount ?? 0 };
  }
}

/**
 * Drives a program; the caller holds the transaction. A write is sent without waiting for its answer: it goes out
 * with the next read, or with COMMIT.
 */
function run<T>(p: Pipeline, program: BookProgram<T>): Promise<T> {
  return runAsync(
    program,
    (q) => readSnapshot(p, q),
    async (w) => writeRows(p, w),
  );
}

/** The grant program and its audit entry; the caller holds the transaction. */
async function grantAudited(p: Pipeline, input: GrantInput, actor: AuditActor): Promise<Balance> {
  const balance = await run(p, grantOf(input)());
  await insertAudit(p.client, audits.creditsGranted(input, actor));
  return balance;
}
