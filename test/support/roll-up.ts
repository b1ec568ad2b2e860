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

/** How many reservations are in each status, and that none was resolved twice (one ledger resolution each). */
export async function reservationStatuses(store: Store): Promise<Record<string, number>> {
  const rows = await rowsOf(store, "SELECT status, count(*) AS n FROM reservations GROUP BY status ORDER BY status");
  const resolutions = await rowsOf(
    store,
    "SELECT reservation_id, count(*) AS n FROM ledger_entries WHERE kind IN ('settle', 'release', 'expire') GROUP BY reservation_id HAVING count(*) > 1",
  );
  assert.deepEqual(resolutions, [], "every reservation resolved at most once in the ledger");
  return Object.fromEntries(rows.map((r) => [r.status as string, r.n as number]));
}
