import type pg from "pg";
import {
  type AdminIdempotencyRow,
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
import { type BookProgram, runAsync } from "../bookkeeping/rows.ts";
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
import type { Balance, BookkeepingStore, LedgerEntry, PurgeResult, Reservation, UsagePage, UsageQuery, UsageRecord } from "../store.ts";
import { encodeUsageCursor } from "../usage-cursor.ts";
import { dailySumColumns } from "../usage-daily-rows.ts";
import { toUsage, USAGE_COLUMNS, type UsageRow } from "../usage-rows.ts";
import { insertAudit } from "./postgres-audit.ts";
import { readSnapshot, writeRows } from "./postgres-book-rows.ts";
import { type Client, hasNul, transaction, withClient } from "./postgres-connection.ts";
import { postgresUsageListQuery } from "./postgres-usage.ts";

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
 * read and locked in one shared order (see postgres-book-rows.ts); reads are single statements.
 */
export class PostgresBooks implements BooksPart {
  readonly commitBatch: BookkeepingStore["commitBatch"];
  readonly sweep: BookkeepingStore["sweep"];
  readonly releaseOrphans: BookkeepingStore["releaseOrphans"];
  readonly #grantCredits: BookkeepingStore["grantCredits"];

  constructor(private readonly pool: pg.Pool) {
    const writes = bookkeepingWrites((program) => transaction(pool, (c) => run(c, program())));
    this.commitBatch = writes.commitBatch;
    this.sweep = writes.sweep;
    this.releaseOrphans = writes.releaseOrphans;
    this.#grantCredits = writes.grantCredits;
  }

  #query<R extends pg.QueryResultRow>(sql: string, params: unknown[]): Promise<pg.QueryResult<R>> {
    return withClient(this.pool, (c) => c.query<R>(sql, params));
  }

  /** One statement: the lease upserted, leases ended long ago without work in flight deleted. */
  async renewLease(input: LeaseInput): Promise<void> {
    checkLease(input);
    await this.#query(
      "WITH lease AS (INSERT INTO gateway_instances (id, started_at_ms, lease_until_ms) VALUES ($1, $2, $3) " +
        "ON CONFLICT (id) DO UPDATE SET lease_until_ms = EXCLUDED.lease_until_ms RETURNING 1) " +
        "DELETE FROM gateway_instances g WHERE g.lease_until_ms < $4 AND g.id <> $1 " +
        "AND NOT EXISTS (SELECT 1 FROM usage_records u WHERE u.outcome = 'in_flight' AND u.instance_id = g.id)",
      [input.instanceId, input.startedAtMs, input.leaseUntilMs, input.nowMs - ENDED_LEASES_KEPT_MS],
    );
  }

  async grantCredits(input: GrantInput & { audit?: AuditActor }): Promise<Balance> {
    const { audit } = input;
    if (audit === undefined) return this.#grantCredits(input);
    checkGrant(input);
    checkAudit(audit);
    return transaction(this.pool, (c) => grantAudited(c, input, audit));
  }

  /**
   * Calls with one key are serialized by a transaction advisory lock on it: the first grants and stores its answer,
   * the others wait for its commit and then find that answer.
   */
  async grantCreditsOnce(input: GrantOnceInput): Promise<GrantOnceResult> {
    checkGrantOnce(input);
    const { key, requestHash } = input.idempotency;
    return transaction(this.pool, async (c): Promise<GrantOnceResult> => {
      await c.query(ADMIN_IDEMPOTENCY_LOCK, [key]);
      const row = (
        await c.query<AdminIdempotencyRow>("SELECT request_hash, response, expires_at_ms FROM admin_idempotency WHERE key = $1", [key])
      ).rows[0];
      const stored = storedAnswer(row, requestHash, input.nowMs);
      if (stored) return stored;
      const balance = await grantAudited(c, input, input.audit);
      // An expired entry is replaced.
      await c.query(
        "INSERT INTO admin_idempotency (key, request_hash, response, created_at_ms, expires_at_ms) VALUES ($1, $2, $3, $4, $5) " +
          "ON CONFLICT (key) DO UPDATE SET request_hash = EXCLUDED.request_hash, response = EXCLUDED.response, " +
          "created_at_ms = EXCLUDED.created_at_ms, expires_at_ms = EXCLUDED.expires_at_ms",
        idempotencyParams(input, balance),
      );
      return { kind: "granted", balance };
    });
  }

  async usageTotals(query: UsageTotalsQuery): Promise<UsageTotals> {
    checkUsageTotalsQuery(query);
    if (query.orgId !== undefined && hasNul(query.orgId)) return { days: [], organizations: [] };
    const params = query.orgId === undefined ? [query.fromMs, query.toMs] : [query.fromMs, query.toMs, query.orgId];
    const rows = (
      await this.#query<SumsRow & { day_start_ms: number | null; org_id: string | null; name: string | null; by_day: number }>(
        totalsQuery(params.length === 3),
        params,
      )
    ).rows;
    const totals: UsageTotals = { days: [], organizations: [] };
    for (const row of rows) {
      if (row.by_day === 1) totals.days.push({ dayStartMs: row.day_start_ms!, ...toSums(row) });
      else totals.organizations.push({ orgId: row.org_id!, name: row.name, ...toSums(row) });
    }
    return totals;
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

  async getBalance(orgId: string): Promise<Balance> {
    if (hasNul(orgId)) return { ...ZERO_BALANCE };
    const row = (await this.#query<Balance>("SELECT available, reserved, spent, granted FROM org_balances WHERE org_id = $1", [orgId]))
      .rows[0];
    return row ? { available: row.available, reserved: row.reserved, spent: row.spent, granted: row.granted } : { ...ZERO_BALANCE };
  }

  async getReservation(reservationId: string): Promise<Reservation | null> {
    if (hasNul(reservationId)) return null;
    const row = (await this.#query<ReservationRow>(`SELECT ${RESERVATION_COLUMNS} FROM reservations WHERE id = $1`, [reservationId]))
      .rows[0];
    return row ? toReservation(row) : null;
  }

  async listLedger(orgId: string): Promise<LedgerEntry[]> {
    if (hasNul(orgId)) return [];
    return (await this.#query<LedgerRow>(`SELECT ${LEDGER_COLUMNS} FROM ledger_entries WHERE org_id = $1 ORDER BY id`, [orgId])).rows.map(
      toLedgerEntry,
    );
  }

  async previewUsage(orgId: string, day: string): Promise<{ org: number; global: number }> {
    checkPreviewOrg(orgId);
    checkDay(day);
    // Both counters from one statement, so from one snapshot.
    const rows = (
      await this.#query<{ scope: string; count: number }>(
        "SELECT scope, count FROM preview_counters WHERE day = $1 AND scope = ANY($2::text[])",
        [day, hasNul(orgId) ? [GLOBAL_PREVIEW_SCOPE] : [orgId, GLOBAL_PREVIEW_SCOPE]],
      )
    ).rows;
    return {
      org: rows.find((r) => r.scope === orgId)?.count ?? 0,
      global: rows.find((r) => r.scope === GLOBAL_PREVIEW_SCOPE)?.count ?? 0,
    };
  }

  async getUsage(orgId: string, requestId: string): Promise<UsageRecord | null> {
    if (hasNul(orgId, requestId)) return null;
    const row = (
      await this.#query<UsageRow>(`SELECT ${USAGE_COLUMNS} FROM usage_records WHERE org_id = $1 AND request_id = $2`, [orgId, requestId])
    ).rows[0];
    return row ? toUsage(row) : null;
  }

  async listUsage(orgId: string, query: UsageQuery): Promise<UsagePage> {
    checkUsageQuery(query);
    const { sql, params } = postgresUsageListQuery(orgId, query);
    if (hasNul(orgId)) return { records: [], nextCursor: null };
    const rows = (await this.#query<UsageRow>(sql, params)).rows;
    const more = rows.length > query.limit;
    const records = (more ? rows.slice(0, query.limit) : rows).map(toUsage);
    const last = records[records.length - 1];
    return { records, nextCursor: more && last ? encodeUsageCursor({ createdAtMs: last.createdAtMs, requestId: last.requestId }) : null };
  }
}

/** Drives a program; the caller holds the transaction. */
function run<T>(c: Client, program: BookProgram<T>): Promise<T> {
  return runAsync(
    program,
    (q) => readSnapshot(c, q),
    (w) => writeRows(c, w),
  );
}

/** The grant program and its audit entry; the caller holds the transaction. */
async function grantAudited(c: Client, input: GrantInput, actor: AuditActor): Promise<Balance> {
  const balance = await run(c, grantOf(input)());
  await insertAudit(c, audits.creditsGranted(input, actor));
  return balance;
}
