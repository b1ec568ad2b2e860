import type { PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import type { SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store, UsageRecord } from "../../src/store/store.ts";
import { addToUsageDaily, USAGE_DAILY_PARAM_COUNT, UsageDailyDeltas, usageDailyParams } from "../../src/store/usage-daily-rows.ts";
import { USAGE_COLUMNS } from "../../src/store/usage-rows.ts";

/**
 * Writes usage records as they are (any outcome, cost and time) straight into the table, and counts them in the daily
 * roll-up (usage_daily) in the same transaction: history fixtures for the usage pages, summaries and the console
 * (completedAtMs defaults to createdAtMs, deployment to null, attempts to 0). Requests go through
 * store.commitBatch; this bypasses it on purpose.
 */
export type SeedRecord = Omit<UsageRecord, "completedAtMs" | "deployment" | "attempts"> & {
  completedAtMs?: number | null;
  deployment?: string | null;
  attempts?: number;
};

export async function seedUsage(store: Store, records: SeedRecord[]): Promise<void> {
  const values = (r: SeedRecord, flag: unknown) => [
    r.requestId,
    r.orgId,
    r.keyId,
    r.createdAtMs,
    r.source,
    r.model,
    r.mode,
    r.outcome,
    r.httpStatus,
    r.inputTokens,
    r.outputTokens,
    r.costMicrousd,
    r.latencyMs,
    r.gatewayLatencyMs,
    r.errorDetail,
    flag,
    r.completedAtMs === undefined ? r.createdAtMs : r.completedAtMs,
    r.deployment ?? null,
    r.attempts ?? 0,
  ];
  const daily = new UsageDailyDeltas();
  for (const r of records) daily.addRecord(r);
  if (store.dialect === "sqlite") {
    const db = (store as SqliteStore).db;
    const insert = db.prepare(`INSERT INTO usage_records (${USAGE_COLUMNS}) VALUES (${Array(19).fill("?").join(", ")})`);
    const addDaily = db.prepare(addToUsageDaily(`VALUES (${Array(USAGE_DAILY_PARAM_COUNT).fill("?").join(", ")})`));
    const insertAll = db.transaction(() => {
      for (const r of records) insert.run(...values(r, r.overReservation ? 1 : 0));
      for (const d of daily.list()) addDaily.run(...usageDailyParams(d));
    });
    // The serving connection does not wait for locks (busy_timeout 0), and the checkpoint thread may hold the write
    // lock for a moment (a RESTART checkpoint after many writes): wait as the gateway's own writes do.
    for (let attempt = 0; ; attempt++) {
      try {
        return insertAll();
      } catch (err) {
        if ((err as { code?: string }).code !== "SQLITE_BUSY" || attempt >= 200) throw err;
        await new Promise((r) => setTimeout(r, 10));
      }
    }
  }
  const pool = (store as PostgresStore).pool;
  const placeholders = (n: number) => Array.from({ length: n }, (_, i) => `$${i + 1}`).join(", ");
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    for (const r of records)
      await client.query(`INSERT INTO usage_records (${USAGE_COLUMNS}) VALUES (${placeholders(19)})`, values(r, r.overReservation));
    for (const d of daily.list())
      await client.query(addToUsageDaily(`VALUES (${placeholders(USAGE_DAILY_PARAM_COUNT)})`), usageDailyParams(d));
    await client.query("COMMIT");
  } catch (err) {
    await client.query("ROLLBACK").catch(() => undefined);
    throw err;
  } finally {
    client.release();
  }
}

/** A final usage record with defaults (completed when it was created). */
export function finalRecord(overrides: Partial<UsageRecord> & Pick<UsageRecord, "requestId" | "orgId" | "createdAtMs">): UsageRecord {
  return {
    keyId: "key_1",
    completedAtMs: overrides.createdAtMs,
    source: "api",
    model: "fake-small",
    mode: "preview",
    outcome: "succeeded",
    httpStatus: 200,
    inputTokens: 10,
    outputTokens: 1,
    costMicrousd: 0,
    latencyMs: 1,
    gatewayLatencyMs: 1,
    errorDetail: null,
    overReservation: false,
    deployment: "default",
    attempts: 1,
    ...overrides,
  };
}

/** A seeded record as the CLI tests use it: a paid success of "jev-1" costing 1500 microUSD, unless overridden. */
export function paidSeedRecord(requestId: string, orgId: string, createdAtMs: number, overrides: Partial<SeedRecord> = {}): SeedRecord {
  return {
    requestId,
    orgId,
    keyId: "key_1",
    createdAtMs,
    source: "api",
    model: "jev-1",
    mode: "paid",
    outcome: "succeeded",
    httpStatus: 200,
    inputTokens: 120,
    outputTokens: 7,
    costMicrousd: 1500,
    latencyMs: 12.5,
    gatewayLatencyMs: 14.25,
    errorDetail: null,
    overReservation: false,
    ...overrides,
  };
}
