import type { UsageOutcome, UsageQuery, UsageRecord } from "../store.ts";
import { decodeUsageCursor } from "../sqlite/usage-cursor.ts";
import { StoreInputError } from "../store-errors.ts";
import { conflictOr, hasNul, type Client } from "./postgres-connection.ts";

/** Usage records in PostgreSQL: the row mapping, the insert (also used inside settle/release transactions) and the page query. */

export interface UsageRow {
  request_id: string;
  org_id: string;
  key_id: string;
  created_at_ms: number;
  source: UsageRecord["source"];
  model: string;
  mode: UsageRecord["mode"];
  outcome: UsageOutcome;
  http_status: number;
  input_tokens: number;
  output_tokens: number;
  cost_microusd: number;
  latency_ms: number | null;
  gateway_latency_ms: number;
  error_detail: string | null;
  over_reservation: boolean;
}

export const USAGE_COLUMNS =
  "request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens, output_tokens, " +
  "cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation";

const INSERT_USAGE = `INSERT INTO usage_records (${USAGE_COLUMNS}) VALUES (${Array.from({ length: 16 }, (_, i) => `$${i + 1}`).join(", ")})`;

export function toUsage(row: UsageRow): UsageRecord {
  return {
    requestId: row.request_id,
    orgId: row.org_id,
    keyId: row.key_id,
    createdAtMs: row.created_at_ms,
    source: row.source,
    model: row.model,
    mode: row.mode,
    outcome: row.outcome,
    httpStatus: row.http_status,
    inputTokens: row.input_tokens,
    outputTokens: row.output_tokens,
    costMicrousd: row.cost_microusd,
    latencyMs: row.latency_ms,
    gatewayLatencyMs: row.gateway_latency_ms,
    errorDetail: row.error_detail,
    overReservation: row.over_reservation,
  };
}

/** Inserts one usage record; StoreConflictError on a duplicate request id. Values the schema refuses fail with the pg error, as in SQLite. */
export async function insertUsageRow(client: Client, record: UsageRecord): Promise<void> {
  try {
    await client.query(INSERT_USAGE, [
      record.requestId,
      record.orgId,
      record.keyId,
      record.createdAtMs,
      record.source,
      record.model,
      record.mode,
      record.outcome,
      record.httpStatus,
      record.inputTokens,
      record.outputTokens,
      record.costMicrousd,
      record.latencyMs ?? null,
      record.gatewayLatencyMs,
      record.errorDetail ?? null,
      record.overReservation ? true : false,
    ]);
  } catch (err) {
    conflictOr(err, `A usage record with request id ${JSON.stringify(record.requestId)} already exists`);
  }
}

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
  if (cursor !== undefined && hasNul(cursor.requestId)) throw new StoreInputError("cursor is not a cursor returned by a previous page", "cursor");
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
