import type { UsageQuery } from "../store.ts";
import { StoreInputError } from "../store-errors.ts";
import { decodeUsageCursor } from "../usage-cursor.ts";
import { USAGE_COLUMNS } from "../usage-rows.ts";
import { hasNul } from "./postgres-connection.ts";

/** The usage page query of PostgreSQL. */

/**
 * A time bound as a bigint parameter: created_at_ms is a whole number, so `>= x` and `< x` mean the same with
 * ceil(x); beyond the safe range every stored value is on one side of it. (SQLite compares with the fraction.)
 */
function timeBound(ms: number): number {
  return Math.min(2 ** 53, Math.max(-(2 ** 53), Math.ceil(ms)));
}

/**
 * The SQL and parameters of one usage page (limit + 1 rows, to know whether more follow), served by
 * usage_records_by_org_time. Exported for the query-plan test. As in SQLite, only one upper bound is used:
 * with a cursor and toMs, whichever is lower implies the other.
 */
export function postgresUsageListQuery(orgId: string, query: UsageQuery): { sql: string; params: unknown[] } {
  const cursor = query.cursor === undefined ? undefined : decodeUsageCursor(query.cursor);
  // No stored request id holds U+0000, so no page of ours can end at one: not a cursor we gave out.
  if (cursor !== undefined && hasNul(cursor.requestId))
    throw new StoreInputError("cursor is not a cursor returned by a previous page", "cursor");
  const params: unknown[] = [orgId];
  const p = (value: unknown) => {
    params.push(value);
    return `$${params.length}`;
  };
  const clauses = ["org_id = $1"];
  if (query.fromMs !== undefined) clauses.push(`created_at_ms >= ${p(timeBound(query.fromMs))}`);
  if (query.toMs !== undefined && (cursor === undefined || cursor.createdAtMs >= query.toMs)) {
    clauses.push(`created_at_ms < ${p(timeBound(query.toMs))}`);
  } else if (cursor !== undefined) {
    clauses.push(`(created_at_ms, request_id) < (${p(cursor.createdAtMs)}, ${p(cursor.requestId)})`);
  }
  if (query.outcome !== undefined) clauses.push(`outcome = ${p(query.outcome)}`);
  const limit = p(query.limit + 1);
  const sql = `SELECT ${USAGE_COLUMNS} FROM usage_records WHERE ${clauses.join(" AND ")} ORDER BY created_at_ms DESC, request_id DESC LIMIT ${limit}`;
  return { sql, params };
}
