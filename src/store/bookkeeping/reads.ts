import type { Balance, LedgerEntry, Reservation } from "../../domain/credits.ts";
import { USAGE_OUTCOMES, type UsageRecord, type UsageTotals } from "../../domain/usage-records.ts";
import { checkUsageTotalsQuery, keysetPage, type SumsRow, toSums, type UsageTotalsQuery } from "../admin-rows.ts";
import type { BookkeepingPart } from "../compose-store.ts";
import { checkDay, checkPageLimit, checkPreviewOrg, checkText, GLOBAL_PREVIEW_SCOPE } from "../input-checks.ts";
import type { DbRow } from "../schema/table.ts";
import {
  BALANCE_FIELDS,
  KEY_SPEND_FIELDS,
  keySpends,
  ledgerEntries,
  orgBalances,
  RESERVATION_FIELDS,
  reservationOf,
  USAGE_RECORD_FIELDS,
  usageRecords,
} from "../schema/tables.ts";
import { runSqlAsync, type SqlProgram } from "../sql-program.ts";
import type { UsagePage, UsageQuery } from "../store.ts";
import { StoreInputError } from "../store-errors.ts";
import { badCursor, decodeUsageCursor, encodeUsageCursor, type UsageCursor } from "../usage-cursor.ts";
import { checkBudgetPeriod } from "./checked-writes.ts";

/**
 * The reading half of the books, the same for every adapter: the arguments are checked and the rows mapped here,
 * written once with `?` placeholders; an adapter only runs a statement (and the usage totals, whose SQL differs).
 */

export const ZERO_BALANCE: Balance = Object.freeze({ available: 0, reserved: 0, spent: 0, granted: 0 });

const USAGE_COLUMNS = usageRecords.list(USAGE_RECORD_FIELDS);
/** A reservation is read from its request's usage record. */
const RESERVATION_WITH = ["requestId", "orgId", "createdAtMs", "completedAtMs", "costMicrousd", ...RESERVATION_FIELDS] as const;

const READS = {
  balance: `SELECT ${orgBalances.list(BALANCE_FIELDS)} FROM org_balances WHERE org_id = ?`,
  reservation: `SELECT ${usageRecords.list(RESERVATION_WITH)} FROM usage_records WHERE request_id = ?`,
  ledger: `SELECT ${ledgerEntries.list()} FROM ledger_entries WHERE org_id = ? ORDER BY id`,
  // Both figures from one statement, so from one snapshot. The service-wide one is the requests counted, the
  // organizations' sum: the '*' row also holds the units that processes keep in blocks (see SharedBlock).
  previewCount: "SELECT count FROM preview_counters WHERE scope = ? AND day = ?",
  previewUsage:
    "SELECT CAST(COALESCE(SUM(CASE WHEN scope = ? THEN count END), 0) AS BIGINT) AS org, CAST(COALESCE(SUM(count), 0) AS BIGINT) AS global " +
    `FROM preview_counters WHERE day = ? AND scope <> '${GLOBAL_PREVIEW_SCOPE}'`,
  usage: `SELECT ${USAGE_COLUMNS} FROM usage_records WHERE org_id = ? AND request_id = ?`,
  keySpend: `SELECT ${keySpends.list(KEY_SPEND_FIELDS)} FROM key_spend WHERE key_id = ? AND period = ?`,
} as const;

const toUsageRecord = (row: DbRow): UsageRecord => usageRecords.fromRow(row, USAGE_RECORD_FIELDS);

/** The rows of the usage totals, per day and per organization, from one snapshot of the daily roll-up. */
export interface TotalsRows {
  days: (SumsRow & { day_start_ms: number })[];
  organizations: (SumsRow & { org_id: string; name: string | null })[];
}

/** How a dialect pages through usage records. */
export interface UsageListDialect {
  /** A time bound as the parameter the dialect compares created_at_ms with. */
  timeBound(ms: number): number;
  /** The table of a page filtered by outcome (SQLite names the index it must use). */
  byOutcome: string;
}

/**
 * The SQL and parameters of one usage page, in its order (keysetPage adds the limit), served by
 * usage_records_by_org_time (with an outcome, usage_records_by_org_outcome_time). Only one upper bound is used:
 * with a cursor and toMs, whichever is lower implies the other, so the database seeks to it instead of scanning the
 * earlier pages.
 */
export function usageListSql(
  orgId: string,
  query: UsageQuery,
  dialect: UsageListDialect,
  cursor: UsageCursor | undefined = query.cursor === undefined ? undefined : decodeUsageCursor(query.cursor),
): { sql: string; params: unknown[] } {
  const clauses = ["org_id = ?"];
  const params: unknown[] = [orgId];
  if (query.fromMs !== undefined) {
    clauses.push("created_at_ms >= ?");
    params.push(dialect.timeBound(query.fromMs));
  }
  if (query.toMs !== undefined && (cursor === undefined || cursor.createdAtMs >= query.toMs)) {
    clauses.push("created_at_ms < ?");
    params.push(dialect.timeBound(query.toMs));
  } else if (cursor !== undefined) {
    clauses.push("(created_at_ms, request_id) < (?, ?)");
    params.push(cursor.createdAtMs, cursor.requestId);
  }
  if (query.outcome !== undefined) {
    clauses.push("outcome = ?");
    params.push(query.outcome);
  }
  const table = query.outcome !== undefined ? dialect.byOutcome : "usage_records";
  const sql = `SELECT ${USAGE_COLUMNS} FROM ${table} WHERE ${clauses.join(" AND ")} ORDER BY created_at_ms DESC, request_id DESC`;
  return { sql, params };
}

/** One usage page's statement as listUsage runs it (limit + 1 rows, to know whether more follow): for the query-plan tests. */
export function usagePageStatement(orgId: string, query: UsageQuery, dialect: UsageListDialect): { sql: string; params: unknown[] } {
  const { sql, params } = usageListSql(orgId, query, dialect);
  return { sql: `${sql} LIMIT ?`, params: [...params, query.limit + 1] };
}

type ReadMethod =
  | "getBalance"
  | "getReservation"
  | "listLedger"
  | "previewUsage"
  | "previewCount"
  | "keySpend"
  | "getUsage"
  | "listUsage"
  | "usageTotals";

export abstract class BookkeepingReads implements Pick<BookkeepingPart, ReadMethod> {
  /** The rows of one statement written with `?` placeholders. */
  protected abstract rows<R = DbRow>(sql: string, params: readonly unknown[]): Promise<R[]>;
  /** The totals of a checked query, both lists from one snapshot. */
  protected abstract totalsRows(query: UsageTotalsQuery): Promise<TotalsRows>;
  protected abstract readonly usageList: UsageListDialect;

  /** False for text this database cannot hold (PostgreSQL: U+0000): no stored row can equal it, so none is read. */
  protected holds(..._texts: string[]): boolean {
    return true;
  }

  #read<T>(program: SqlProgram<T>): Promise<T> {
    return runSqlAsync(program, async ({ sql, params }) => {
      const rows = await this.rows(sql, params);
      return { rows, changes: rows.length };
    });
  }

  async getBalance(orgId: string): Promise<Balance> {
    const [row] = this.holds(orgId) ? await this.rows(READS.balance, [orgId]) : [];
    return row ? orgBalances.fromRow(row, BALANCE_FIELDS) : { ...ZERO_BALANCE };
  }

  async getReservation(reservationId: string): Promise<Reservation | null> {
    const [row] = this.holds(reservationId) ? await this.rows(READS.reservation, [reservationId]) : [];
    return row ? reservationOf(usageRecords.fromRow(row, RESERVATION_WITH)) : null;
  }

  async listLedger(orgId: string): Promise<LedgerEntry[]> {
    if (!this.holds(orgId)) return [];
    return (await this.rows(READS.ledger, [orgId])).map((row) => ledgerEntries.fromRow(row));
  }

  async previewCount(orgId: string, day: string): Promise<number> {
    checkPreviewOrg(orgId);
    checkDay(day);
    const [row] = this.holds(orgId) ? await this.rows<{ count: number }>(READS.previewCount, [orgId, day]) : [];
    return Number(row?.count ?? 0);
  }

  async previewUsage(orgId: string, day: string): Promise<{ org: number; global: number }> {
    checkPreviewOrg(orgId);
    checkDay(day);
    // Text the database cannot hold is no organization's id: "" is none either.
    const [row] = await this.rows<{ org: number; global: number }>(READS.previewUsage, [this.holds(orgId) ? orgId : "", day]);
    return { org: Number(row?.org ?? 0), global: Number(row?.global ?? 0) };
  }

  async keySpend(keyId: string, period: string): Promise<{ reservedMicrousd: number; spentMicrousd: number }> {
    checkText(keyId, "keyId");
    checkBudgetPeriod(period);
    const [row] = this.holds(keyId) ? await this.rows(READS.keySpend, [keyId, period]) : [];
    return row ? keySpends.fromRow(row, KEY_SPEND_FIELDS) : { reservedMicrousd: 0, spentMicrousd: 0 };
  }

  async getUsage(orgId: string, requestId: string): Promise<UsageRecord | null> {
    const [row] = this.holds(orgId, requestId) ? await this.rows(READS.usage, [orgId, requestId]) : [];
    return row ? toUsageRecord(row) : null;
  }

  async listUsage(orgId: string, query: UsageQuery): Promise<UsagePage> {
    checkUsageQuery(query);
    const cursor = query.cursor === undefined ? undefined : decodeUsageCursor(query.cursor);
    // No stored request id holds such a value, so no page of ours can end at one: not a cursor we gave out.
    if (cursor !== undefined && !this.holds(cursor.requestId)) throw badCursor();
    if (!this.holds(orgId)) return { records: [], nextCursor: null };
    const { sql, params } = usageListSql(orgId, query, this.usageList, cursor);
    const page = await this.#read(keysetPage(sql, params, query.limit, toUsageRecord, encodeUsageCursor));
    return { records: page.items, nextCursor: page.nextCursor };
  }

  async usageTotals(query: UsageTotalsQuery): Promise<UsageTotals> {
    checkUsageTotalsQuery(query);
    if (query.orgId !== undefined && !this.holds(query.orgId)) return { days: [], organizations: [] };
    const rows = await this.totalsRows(query);
    return {
      days: rows.days.map((r) => ({ dayStartMs: r.day_start_ms, ...toSums(r) })),
      organizations: rows.organizations.map((r) => ({ orgId: r.org_id, name: r.name, ...toSums(r) })),
    };
  }
}

/** The checks of a usage page query, the same for every adapter. */
function checkUsageQuery(query: UsageQuery): void {
  checkPageLimit(query.limit);
  for (const [value, field] of [
    [query.fromMs, "fromMs"],
    [query.toMs, "toMs"],
  ] as const) {
    if (value !== undefined && !Number.isFinite(value))
      throw new StoreInputError(`${field} must be a finite number of epoch milliseconds`, field);
  }
  if (query.outcome !== undefined && !USAGE_OUTCOMES.includes(query.outcome)) {
    throw new StoreInputError(`outcome must be one of ${USAGE_OUTCOMES.join(", ")}`, "outcome");
  }
}
