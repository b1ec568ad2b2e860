import type pg from "pg";
import { bookkeepingWrites, checkUsageQuery } from "../bookkeeping/books.ts";
import { runAsync } from "../bookkeeping/rows.ts";
import { LEDGER_COLUMNS, type LedgerRow, RESERVATION_COLUMNS, type ReservationRow, toLedgerEntry, toReservation, ZERO_BALANCE } from "../credit-rows.ts";
import { checkCount, checkDay, checkEpochMs, checkPreviewOrg, GLOBAL_PREVIEW_SCOPE } from "../input-checks.ts";
import type { Balance, BookkeepingStore, LedgerEntry, PurgeResult, Reservation, UsagePage, UsageQuery, UsageRecord } from "../store.ts";
import { encodeUsageCursor } from "../usage-cursor.ts";
import { toUsage, USAGE_COLUMNS, type UsageRow } from "../usage-rows.ts";
import { readSnapshot, writeRows } from "./postgres-book-rows.ts";
import { hasNul, transaction, withClient } from "./postgres-connection.ts";
import { postgresUsageListQuery } from "./postgres-usage.ts";

/**
 * The books in PostgreSQL. Every write is one READ COMMITTED transaction of a bookkeeping program, whose rows are
 * read and locked in one shared order (see postgres-book-rows.ts); reads are single statements.
 */
export class PostgresBooks implements BookkeepingStore {
  readonly commitBatch: BookkeepingStore["commitBatch"];
  readonly sweep: BookkeepingStore["sweep"];
  readonly grantCredits: BookkeepingStore["grantCredits"];

  constructor(private readonly pool: pg.Pool) {
    const writes = bookkeepingWrites((program) =>
      transaction(pool, (c) => runAsync(program(), (q) => readSnapshot(c, q), (w) => writeRows(c, w))),
    );
    this.commitBatch = writes.commitBatch;
    this.sweep = writes.sweep;
    this.grantCredits = writes.grantCredits;
  }

  #query<R extends pg.QueryResultRow>(sql: string, params: unknown[]): Promise<pg.QueryResult<R>> {
    return withClient(this.pool, (c) => c.query<R>(sql, params));
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
    const counters = await this.#query(
      "DELETE FROM preview_counters WHERE ctid = ANY(ARRAY(SELECT ctid FROM preview_counters WHERE day < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))",
      [input.keepFromDay, input.limit],
    );
    return { idempotencyKeys: keys.rowCount ?? 0, previewCounters: counters.rowCount ?? 0 };
  }

  async getBalance(orgId: string): Promise<Balance> {
    if (hasNul(orgId)) return { ...ZERO_BALANCE };
    const row = (await this.#query<Balance>("SELECT available, reserved, spent, granted FROM org_balances WHERE org_id = $1", [orgId])).rows[0];
    return row ? { available: row.available, reserved: row.reserved, spent: row.spent, granted: row.granted } : { ...ZERO_BALANCE };
  }

  async getReservation(reservationId: string): Promise<Reservation | null> {
    if (hasNul(reservationId)) return null;
    const row = (await this.#query<ReservationRow>(`SELECT ${RESERVATION_COLUMNS} FROM reservations WHERE id = $1`, [reservationId])).rows[0];
    return row ? toReservation(row) : null;
  }

  async listLedger(orgId: string): Promise<LedgerEntry[]> {
    if (hasNul(orgId)) return [];
    return (await this.#query<LedgerRow>(`SELECT ${LEDGER_COLUMNS} FROM ledger_entries WHERE org_id = $1 ORDER BY id`, [orgId])).rows.map(toLedgerEntry);
  }

  async previewUsage(orgId: string, day: string): Promise<{ org: number; global: number }> {
    checkPreviewOrg(orgId);
    checkDay(day);
    // Both counters from one statement, so from one snapshot.
    const rows = (
      await this.#query<{ scope: string; count: number }>("SELECT scope, count FROM preview_counters WHERE day = $1 AND scope = ANY($2::text[])", [
        day,
        hasNul(orgId) ? [GLOBAL_PREVIEW_SCOPE] : [orgId, GLOBAL_PREVIEW_SCOPE],
      ])
    ).rows;
    return {
      org: rows.find((r) => r.scope === orgId)?.count ?? 0,
      global: rows.find((r) => r.scope === GLOBAL_PREVIEW_SCOPE)?.count ?? 0,
    };
  }

  async getUsage(orgId: string, requestId: string): Promise<UsageRecord | null> {
    if (hasNul(orgId, requestId)) return null;
    const row = (await this.#query<UsageRow>(`SELECT ${USAGE_COLUMNS} FROM usage_records WHERE org_id = $1 AND request_id = $2`, [orgId, requestId])).rows[0];
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
