import type pg from "pg";
import {
  type AdminIdempotencyRow,
  audits,
  checkAudit,
  checkGrantOnce,
  checkUsageTotalsQuery,
  DAY_MS,
  type GrantOnceInput,
  idempotencyParams,
  type SumsRow,
  storedAnswer,
  sumColumns,
  toSums,
  type UsageTotalsQuery,
} from "../admin-rows.ts";
import type { AuditActor, GrantOnceResult, UsageTotals } from "../administration.ts";
import { bookkeepingWrites, checkGrant, checkUsageQuery, type GrantInput, grantOf } from "../bookkeeping/books.ts";
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
import { toUsage, USAGE_COLUMNS, type UsageRow } from "../usage-rows.ts";
import { insertAudit } from "./postgres-audit.ts";
import { readSnapshot, writeRows } from "./postgres-book-rows.ts";
import { type Client, hasNul, transaction, withClient } from "./postgres-connection.ts";
import { postgresUsageListQuery } from "./postgres-usage.ts";

/**
 * Usage totals per day and per organization in one statement (one snapshot, one pass over the records): the day rows
 * are those of the grouping set without org_id. The sums are cast to bigint (sum(bigint) is numeric), which the
 * pool parses to numbers like every bigint.
 */
function totalsQuery(oneOrg: boolean): string {
  return (
    `SELECT (created_at_ms / ${DAY_MS}) * ${DAY_MS} AS day_start_ms, org_id, GROUPING(org_id) AS by_day, ${sumColumns("::bigint")} ` +
    `FROM usage_records WHERE created_at_ms >= $1 AND created_at_ms < $2${oneOrg ? " AND org_id = $3" : ""} ` +
    `GROUP BY GROUPING SETS ((created_at_ms / ${DAY_MS}), (org_id)) ` +
    "ORDER BY by_day, day_start_ms, sum_cost DESC, requests DESC, org_id"
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
  readonly #grantCredits: BookkeepingStore["grantCredits"];

  constructor(private readonly pool: pg.Pool) {
    const writes = bookkeepingWrites((program) => transaction(pool, (c) => run(c, program())));
    this.commitBatch = writes.commitBatch;
    this.sweep = writes.sweep;
    this.#grantCredits = writes.grantCredits;
  }

  #query<R extends pg.QueryResultRow>(sql: string, params: unknown[]): Promise<pg.QueryResult<R>> {
    return withClient(this.pool, (c) => c.query<R>(sql, params));
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
      await this.#query<SumsRow & { day_start_ms: number | null; org_id: string | null; by_day: number }>(
        totalsQuery(params.length === 3),
        params,
      )
    ).rows;
    const totals: UsageTotals = { days: [], organizations: [] };
    for (const row of rows) {
      if (row.by_day === 1) totals.days.push({ dayStartMs: row.day_start_ms!, ...toSums(row) });
      else totals.organizations.push({ orgId: row.org_id!, ...toSums(row) });
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
