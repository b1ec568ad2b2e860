import assert from "node:assert/strict";
import type { PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import type { SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";

/** Rows of a statement on either database, bigints as numbers. */
export async function rowsOf(store: Store, sql: string, params: unknown[] = []): Promise<Record<string, unknown>[]> {
  const rows =
    store.dialect === "sqlite"
      ? ((store as SqliteStore).db.prepare(sql.replace(/\$\d+/g, "?")).all(...params) as Record<string, unknown>[])
      : (await (store as PostgresStore).pool.query<Record<string, unknown>>(sql, params)).rows;
  return rows.map((r) =>
    Object.fromEntries(Object.entries(r).map(([k, v]) => [k, typeof v === "string" && /^-?\d+$/.test(v) ? Number(v) : v])),
  );
}

const COUNTS = "requests, in_flight, succeeded, failed, input_tokens, output_tokens, cost_microusd";

/** usage_daily equals a direct count over usage_records, row for row; returns the rows. */
export async function assertRollUpExact(store: Store, context = "usage_daily"): Promise<Record<string, unknown>[]> {
  const direct = await rowsOf(
    store,
    "SELECT org_id, created_at_ms - created_at_ms % 86400000 AS day_start_ms, count(*) AS requests, " +
      "CAST(sum(CASE WHEN outcome = 'in_flight' THEN 1 ELSE 0 END) AS BIGINT) AS in_flight, " +
      "CAST(sum(CASE WHEN outcome = 'succeeded' THEN 1 ELSE 0 END) AS BIGINT) AS succeeded, " +
      "CAST(sum(CASE WHEN outcome NOT IN ('in_flight', 'succeeded') THEN 1 ELSE 0 END) AS BIGINT) AS failed, " +
      "CAST(sum(input_tokens) AS BIGINT) AS input_tokens, CAST(sum(output_tokens) AS BIGINT) AS output_tokens, " +
      "CAST(sum(cost_microusd) AS BIGINT) AS cost_microusd FROM usage_records GROUP BY 1, 2 ORDER BY 1, 2",
  );
  const rolled = await rowsOf(store, `SELECT org_id, day_start_ms, ${COUNTS} FROM usage_daily ORDER BY org_id, day_start_ms`);
  assert.deepEqual(rolled, direct, `${context}: the roll-up equals the records`);
  return rolled;
}

/**
 * How many reservations (kept on usage records) are in each status, after checking that each has exactly one ledger
 * entry once resolved (settle, release or expire) and none while pending.
 */
export async function reservationStatuses(store: Store): Promise<Record<string, number>> {
  const rows = await rowsOf(
    store,
    "SELECT reservation_status AS status, count(*) AS n FROM usage_records WHERE reservation_status IS NOT NULL GROUP BY 1 ORDER BY 1",
  );
  const wrong = await rowsOf(
    store,
    "SELECT u.request_id, u.reservation_status, count(e.id) AS n FROM usage_records u " +
      "LEFT JOIN ledger_entries e ON e.reservation_id = u.request_id AND e.kind IN ('settle', 'release', 'expire') " +
      "WHERE u.reservation_status IS NOT NULL GROUP BY u.request_id, u.reservation_status " +
      "HAVING count(e.id) <> CASE WHEN u.reservation_status = 'pending' THEN 0 ELSE 1 END",
  );
  assert.deepEqual(wrong, [], "every reservation resolved exactly once in the ledger, none while pending");
  return Object.fromEntries(rows.map((r) => [r.status as string, r.n as number]));
}
