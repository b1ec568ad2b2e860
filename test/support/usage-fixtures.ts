import type { UsageRecord } from "../../src/domain/usage-records.ts";
import type { PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { postgres, sqlite } from "../../src/store/schema/table.ts";
import { USAGE_RECORD_FIELDS, usageDaily, usageRecords } from "../../src/store/schema/tables.ts";
import type { SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";
import { addToUsageDaily, UsageDailyDeltas } from "../../src/store/usage-daily-rows.ts";

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
  const stored = (r: SeedRecord): UsageRecord => ({
    ...r,
    completedAtMs: r.completedAtMs === undefined ? r.createdAtMs : r.completedAtMs,
    deployment: r.deployment ?? null,
    attempts: r.attempts ?? 0,
  });
  const daily = new UsageDailyDeltas();
  for (const r of records) daily.addRecord(r);
  if (store.dialect === "sqlite") {
    const db = (store as SqliteStore).db;
    const insert = db.prepare(sqlite.insert(usageRecords, USAGE_RECORD_FIELDS));
    const addDaily = db.prepare(addToUsageDaily(`VALUES (${sqlite.placeholders(usageDaily.fields.length)})`));
    const insertAll = db.transaction(() => {
      for (const r of records) insert.run(...usageRecords.params(sqlite, stored(r), USAGE_RECORD_FIELDS));
      for (const d of daily.list()) addDaily.run(...usageDaily.params(sqlite, d));
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
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const insert = `INSERT INTO usage_records (${usageRecords.list(USAGE_RECORD_FIELDS)}) VALUES (${postgres.placeholders(USAGE_RECORD_FIELDS.length)})`;
    for (const r of records) await client.query(insert, usageRecords.params(postgres, stored(r), USAGE_RECORD_FIELDS));
    for (const d of daily.list())
      await client.query(addToUsageDaily(`VALUES (${postgres.placeholders(usageDaily.fields.length)})`), usageDaily.params(postgres, d));
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
