/**
 * The daily usage roll-up (usage_daily, migration 007) on SQLite and PostgreSQL: after a random mix of preview and
 * paid requests over several days and organizations — completed, failed, expired, swept, replayed, completed twice —
 * every row equals a direct count over usage_records, and so do the store's usage totals; several PostgreSQL
 * instances writing the same rows at once add up exactly; migration 007 fills the table from the records already stored.
 *
 * PostgreSQL: TDS_TEST_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/test), a fresh schema per test, named
 * like those of postgres-store.test.ts (which drops leftovers of killed runs); TDS_SKIP_POSTGRES=1 skips those tests.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import Database from "better-sqlite3";
import pg from "pg";
import type { AdmitCommand, CompleteCommand } from "../../src/domain/bookkeeping.ts";
import type { FinalOutcome } from "../../src/domain/usage-records.ts";
import { DAY_MS, utcDay } from "../../src/domain/utc-day.ts";
import { readMigrations } from "../../src/store/migration-files.ts";
import { applyPostgresMigrations, readPostgresMigrations } from "../../src/store/postgres/postgres-migrations.ts";
import { openPostgresStore, type PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { applyMigrations, SQLITE_MIGRATIONS_DIR } from "../../src/store/sqlite/migrations.ts";
import { openSqliteStore, type SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";
import { mulberry32 } from "../support/seeded-random.ts";
import { admission, completion, T0 } from "./store-contract.ts";

/** The usage_records columns as migration 006 left them (the records of an older version). */
const USAGE_COLUMNS_006 =
  "request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens, output_tokens, " +
  "cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms, deployment, attempts";

const BASE_URL = process.env.TDS_TEST_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const SKIP_POSTGRES = process.env.TDS_SKIP_POSTGRES === "1";
const MINUTE = 60_000;
const HOUR = 3_600_000;

const dirs: string[] = [];
after(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});
function tempPath(name: string): string {
  const dir = mkdtempSync(join(tmpdir(), "tds-usage-daily-"));
  dirs.push(dir);
  return join(dir, name);
}

// ── reading both sides ──

type Row = [orgId: string, dayStartMs: number, ...counts: number[]];
const COUNTS = "requests, in_flight, succeeded, failed, input_tokens, output_tokens, cost_microusd";

/** usage_daily as it is, and the same figures counted from usage_records; both ordered by organization and day. */
const ROLL_UP_SQL = `SELECT org_id, day_start_ms, ${COUNTS} FROM usage_daily ORDER BY org_id, day_start_ms`;
const DIRECT_SQL =
  "SELECT org_id, created_at_ms - created_at_ms % 86400000 AS day_start_ms, count(*) AS requests, " +
  "CAST(sum(CASE WHEN outcome = 'in_flight' THEN 1 ELSE 0 END) AS BIGINT) AS in_flight, " +
  "CAST(sum(CASE WHEN outcome = 'succeeded' THEN 1 ELSE 0 END) AS BIGINT) AS succeeded, " +
  "CAST(sum(CASE WHEN outcome NOT IN ('in_flight', 'succeeded') THEN 1 ELSE 0 END) AS BIGINT) AS failed, " +
  "CAST(sum(input_tokens) AS BIGINT) AS input_tokens, CAST(sum(output_tokens) AS BIGINT) AS output_tokens, " +
  "CAST(sum(cost_microusd) AS BIGINT) AS cost_microusd FROM usage_records GROUP BY 1, 2 ORDER BY 1, 2";

async function query(store: Store, sql: string): Promise<Row[]> {
  const rows =
    store.dialect === "sqlite"
      ? ((store as SqliteStore).db.prepare(sql).all() as Record<string, unknown>[])
      : (await (store as PostgresStore).pool.query<Record<string, unknown>>(sql)).rows;
  return rows.map((r) => Object.values(r).map((v) => (typeof v === "string" && /^-?\d+$/.test(v) ? Number(v) : v)) as Row);
}

/** The roll-up equals the direct count, row for row, and the store's totals (per day, per organization, of one) agree. */
async function assertExact(store: Store, context: string): Promise<Row[]> {
  const direct = await query(store, DIRECT_SQL);
  assert.deepEqual(await query(store, ROLL_UP_SQL), direct, `${context}: usage_daily = the records`);
  if (direct.length === 0) return direct;
  const fromMs = Math.min(...direct.map((r) => r[1]));
  const toMs = Math.max(...direct.map((r) => r[1])) + DAY_MS;
  const sumOf = (rows: Row[]) => ({
    requests: rows.reduce((s, r) => s + r[2]!, 0),
    inputTokens: rows.reduce((s, r) => s + r[6]!, 0),
    outputTokens: rows.reduce((s, r) => s + r[7]!, 0),
    costMicrousd: rows.reduce((s, r) => s + r[8]!, 0),
  });
  const days = (rows: Row[]) =>
    [...new Set(rows.map((r) => r[1]))]
      .sort((a, b) => a - b)
      .map((day) => ({ dayStartMs: day, ...sumOf(rows.filter((r) => r[1] === day)) }));
  const totals = await store.usageTotals({ fromMs, toMs });
  assert.deepEqual(totals.days, days(direct), `${context}: totals per day`);
  const orgIds = [...new Set(direct.map((r) => r[0]))];
  assert.deepEqual(
    new Map(totals.organizations.map(({ orgId, name: _, ...sums }) => [orgId, sums])),
    new Map(orgIds.map((id) => [id, sumOf(direct.filter((r) => r[0] === id))])),
    `${context}: totals per organization`,
  );
  for (const orgId of orgIds) {
    const one = await store.usageTotals({ fromMs, toMs, orgId });
    assert.deepEqual(one.days, days(direct.filter((r) => r[0] === orgId)), `${context}: ${orgId} per day`);
  }
  return direct;
}

// ── a random mix of requests ──

const PAID_ORGS = ["org_paid_1", "org_paid_2", "org_paid_3"];
const PREVIEW_ORGS = ["org_preview_1", "org_preview_2"];
const FAILURES: [Exclude<FinalOutcome, "reservation_expired" | "succeeded">, number][] = [
  ["model_error", 502],
  ["context_rejected", 422],
  ["gateway_error", 500],
];

interface Running {
  orgId: string;
  reservation: number | null;
}

/**
 * About five days of traffic in batches, as the group committer sends them: admissions (preview with quotas, paid
 * with reservations that sometimes expire first, some with a reused Idempotency-Key), completions of every outcome
 * (some after a UTC midnight, some twice, some of requests the sweep already completed) and sweeps.
 */
async function randomMix(store: Store, seed: number, steps: number, check: (step: number) => Promise<void>): Promise<void> {
  const random = mulberry32(seed);
  const pick = <T>(list: readonly T[]): T => list[Math.floor(random() * list.length)]!;
  const int = (min: number, max: number) => min + Math.floor(random() * (max - min + 1));
  for (const id of [...PAID_ORGS, ...PREVIEW_ORGS]) await store.createOrganization({ id, name: `name of ${id}`, nowMs: T0 });
  for (const id of PAID_ORGS.slice(0, 2)) await store.grantCredits({ orgId: id, amountMicrousd: 1_000_000_000, nowMs: T0 });
  // The third paid organization has little: some of its admissions are refused (nothing recorded).
  await store.grantCredits({ orgId: PAID_ORGS[2]!, amountMicrousd: 20_000, nowMs: T0 });

  const running = new Map<string, Running>();
  const done: [requestId: string, orgId: string][] = [];
  let now = T0 + 20 * HOUR;
  let n = 0;
  for (let step = 1; step <= steps; step++) {
    now += int(0, 40 * MINUTE);
    const admissions: AdmitCommand[] = [];
    for (let i = int(0, 3); i > 0; i--) {
      const requestId = `req_${seed}_${++n}`;
      const idempotency =
        random() < 0.15
          ? { key: `key_${int(1, 6)}`, requestHash: `hash_${int(1, 2)}`, lockUntilMs: now + MINUTE, expiresAtMs: now + DAY_MS }
          : null;
      if (random() < 0.5) {
        const orgId = pick(PAID_ORGS);
        const amount = int(100, 5000);
        admissions.push(
          admission({
            requestId,
            orgId,
            nowMs: now,
            idempotency,
            reservation: { amountMicrousd: amount, expiresAtMs: now + int(10 * MINUTE, 3 * HOUR) },
          }),
        );
      } else {
        const orgId = pick(PREVIEW_ORGS);
        admissions.push(
          admission({ requestId, orgId, nowMs: now, idempotency, quota: { day: utcDay(now), orgLimit: 40, globalLimit: 60 } }),
        );
      }
    }
    const completions: CompleteCommand[] = [];
    const candidates = [...running.keys()];
    for (let i = int(0, 3); i > 0 && candidates.length > 0; i--) {
      const requestId = candidates.splice(Math.floor(random() * candidates.length), 1)[0]!;
      const r = running.get(requestId)!;
      const failure = random() < 0.35 ? pick(FAILURES) : null;
      const reserved = r.reservation !== null;
      completions.push(
        completion({
          requestId,
          orgId: r.orgId,
          nowMs: now,
          outcome: failure ? failure[0] : "succeeded",
          httpStatus: failure ? failure[1] : 200,
          inputTokens: int(0, 3000),
          outputTokens: int(0, 200),
          costMicrousd: !failure && reserved ? int(0, r.reservation!) : 0,
          errorDetail: failure ? "failed" : null,
          reserved,
          idempotency: null,
        }),
      );
    }
    // A duplicate delivery of a completion, or one of a request the sweep completed: changes nothing.
    if (done.length > 0 && random() < 0.1) {
      const [requestId, orgId] = pick(done);
      completions.push(completion({ requestId, orgId, nowMs: now }));
    }
    const result = await store.commitBatch({ admissions, completions });
    result.admissions.forEach((a, i) => {
      const command = admissions[i]!;
      if (a.kind === "admitted")
        running.set(command.requestId, { orgId: command.orgId, reservation: command.reservation?.amountMicrousd ?? null });
    });
    for (const c of completions) {
      if (running.delete(c.requestId)) done.push([c.requestId, c.orgId]);
    }
    if (random() < 0.08) {
      await store.sweep({ nowMs: now, inFlightBeforeMs: now - 2 * HOUR, limit: int(1, 5) });
      const stillRunning = await Promise.all([...running].map(async ([id, r]) => [id, await store.getUsage(r.orgId, id)] as const));
      for (const [id, record] of stillRunning) {
        if (record?.outcome !== "in_flight") {
          running.delete(id);
          done.push([id, record!.orgId]);
        }
      }
    }
    await check(step);
  }
}

/** What the mix produced, by outcome: every kind must be there for the test to mean something. */
async function outcomesOf(store: Store): Promise<Set<string>> {
  const sql = "SELECT DISTINCT outcome FROM usage_records";
  const rows =
    store.dialect === "sqlite"
      ? ((store as SqliteStore).db.prepare(sql).all() as { outcome: string }[])
      : (await (store as PostgresStore).pool.query<{ outcome: string }>(sql)).rows;
  return new Set(rows.map((r) => r.outcome));
}

function describeRollUp(name: string, open: () => Promise<Store>): void {
  describe(`usage_daily: ${name}`, () => {
    it("after a random mix of requests over several days and organizations, equals a direct count of the records", async () => {
      const store = await open();
      try {
        await randomMix(store, 7, 320, async (step) => {
          if (step % 80 === 0) await assertExact(store, `step ${step}`);
        });
        const rows = await assertExact(store, "the end");
        assert.ok(new Set(rows.map((r) => r[1])).size >= 4, "several days");
        assert.ok(new Set(rows.map((r) => r[0])).size >= 5, "several organizations");
        const outcomes = await outcomesOf(store);
        for (const outcome of ["in_flight", "succeeded", "model_error", "context_rejected", "reservation_expired", "gateway_error"])
          assert.ok(outcomes.has(outcome), `the mix has ${outcome}: ${[...outcomes].join(", ")}`);
        // Everything in flight is swept at last: still exact, and nothing in flight is left in the roll-up.
        await store.sweep({ nowMs: T0 + 30 * DAY_MS, inFlightBeforeMs: T0 + 30 * DAY_MS, limit: 10_000 });
        const swept = await assertExact(store, "after the last sweep");
        assert.equal(
          swept.reduce((s, r) => s + r[3]!, 0),
          0,
        );
      } finally {
        await store.close();
      }
    });
  });
}

// ── SQLite ──

describeRollUp("SQLite", async () => openSqliteStore(tempPath("mix.sqlite")));

/** A few records of every outcome, written as a version before 007 wrote them (no roll-up). */
const OLD_RECORDS: [string, string, number, string, number, number, number][] = [
  ["old_1", "org_a", T0 + 5, "succeeded", 120, 7, 300],
  ["old_2", "org_a", T0 + DAY_MS - 1, "model_error", 15, 0, 0],
  ["old_3", "org_a", T0 + DAY_MS, "in_flight", 0, 0, 0],
  ["old_4", "org_b", T0 + 2 * DAY_MS + 9, "reservation_expired", 0, 0, 0],
  ["old_5", "org_b", T0 + 2 * DAY_MS + 10, "gateway_error", 0, 0, 0],
  ["old_6", "org_b", T0 + 2 * DAY_MS + 11, "context_rejected", 4000, 0, 0],
  ["old_7", "org_a", T0 + 3 * DAY_MS, "succeeded", 1, 2, 3],
];

function oldRecordParams([id, org, at, outcome, input, output, cost]: (typeof OLD_RECORDS)[number], flag: unknown): unknown[] {
  const final = outcome !== "in_flight";
  return [
    id,
    org,
    "key_1",
    at,
    "api",
    "jev-1",
    cost > 0 ? "paid" : "preview",
    outcome,
    final ? 200 : null,
    input,
    output,
    cost,
    null,
    1,
    null,
    flag,
    final ? at + 10 : null,
    null,
    0,
  ];
}

describe("usage_daily: migration 007 on SQLite", () => {
  it("fills the roll-up from the records already stored; completions afterwards keep it exact", async () => {
    const path = tempPath("before-007.sqlite");
    const old = new Database(path);
    try {
      applyMigrations(
        old,
        readMigrations(SQLITE_MIGRATIONS_DIR).filter((m) => m.version < 7),
      );
      const insert = old.prepare(`INSERT INTO usage_records (${USAGE_COLUMNS_006}) VALUES (${Array(19).fill("?").join(", ")})`);
      for (const r of OLD_RECORDS) insert.run(...oldRecordParams(r, 0));
    } finally {
      old.close();
    }
    const store = openSqliteStore(path);
    try {
      assert.deepEqual(await query(store, ROLL_UP_SQL), [
        ["org_a", T0, 2, 0, 1, 1, 135, 7, 300],
        ["org_a", T0 + DAY_MS, 1, 1, 0, 0, 0, 0, 0],
        ["org_a", T0 + 3 * DAY_MS, 1, 0, 1, 0, 1, 2, 3],
        ["org_b", T0 + 2 * DAY_MS, 3, 0, 0, 3, 4000, 0, 0],
      ]);
      await assertExact(store, "after the migration");
      // The record that was in flight before the upgrade completes after it.
      await store.commitBatch({
        admissions: [],
        completions: [completion({ requestId: "old_3", orgId: "org_a", nowMs: T0 + 2 * DAY_MS })],
      });
      await store.commitBatch({ admissions: [admission({ requestId: "new_1", orgId: "org_a", nowMs: T0 + DAY_MS + 1 })], completions: [] });
      await assertExact(store, "after writes through the books");
      const indexes = store.db.prepare("SELECT name FROM sqlite_master WHERE type = 'index' ORDER BY name").pluck().all();
      assert.ok(indexes.includes("usage_daily_by_org"));
      assert.ok(!indexes.includes("usage_records_by_time"), "the time index of 006 is gone");
    } finally {
      await store.close();
    }
  });

  it("on an empty database the roll-up is empty", async () => {
    const store = openSqliteStore(":memory:");
    try {
      assert.deepEqual(await query(store, ROLL_UP_SQL), []);
    } finally {
      await store.close();
    }
  });
});

// ── PostgreSQL ──

async function reachable(): Promise<boolean> {
  const client = new pg.Client({ connectionString: BASE_URL, connectionTimeoutMillis: 3000 });
  client.on("error", () => undefined);
  try {
    await client.connect();
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => undefined);
  }
}

if (SKIP_POSTGRES) {
  it("usage_daily on PostgreSQL", { skip: "TDS_SKIP_POSTGRES=1" }, () => undefined);
} else if (!(await reachable())) {
  it("PostgreSQL is reachable for the usage_daily tests", () => {
    assert.fail(`PostgreSQL is not reachable at ${BASE_URL}; set TDS_SKIP_POSTGRES=1 to skip these tests`);
  });
} else {
  definePostgresTests();
}

function definePostgresTests(): void {
  const admin = new pg.Pool({ connectionString: BASE_URL, max: 2 });
  admin.on("error", () => undefined);
  const run = `${Math.floor(Date.now() / 1000)}_${randomBytes(3).toString("hex")}`;
  const schemas: string[] = [];
  const stores: Store[] = [];

  async function freshSchemaUrl(): Promise<string> {
    const schema = `tds_test_${run}_${schemas.length + 1}`;
    await admin.query(`CREATE SCHEMA ${schema}`);
    schemas.push(schema);
    return `${BASE_URL}${BASE_URL.includes("?") ? "&" : "?"}options=${encodeURIComponent(`-c search_path=${schema}`)}`;
  }

  async function open(url: string): Promise<PostgresStore> {
    const store = await openPostgresStore(url);
    stores.push(store);
    return store;
  }

  after(async () => {
    await Promise.all(stores.map((s) => s.close().catch(() => undefined)));
    if (schemas.length > 0) await admin.query(`DROP SCHEMA IF EXISTS ${schemas.join(", ")} CASCADE`);
    await admin.end();
  });

  describeRollUp("PostgreSQL", async () => openPostgresStore(await freshSchemaUrl()));

  describe("usage_daily: PostgreSQL instances at once", () => {
    it("two instances admitting and completing requests of the same organizations and days at once add up exactly", async () => {
      const url = await freshSchemaUrl();
      const a = await open(url);
      const b = await open(url);
      for (const id of ["org_x", "org_y"]) await a.createOrganization({ id, name: id, nowMs: T0 });
      // Each batch touches both organizations on two days, in an order of its own.
      const batch = (instance: string, i: number): AdmitCommand[] => {
        const rows = [
          ["org_x", T0 + 10],
          ["org_y", T0 + DAY_MS + 10],
          ["org_x", T0 + DAY_MS + 20],
          ["org_y", T0 + 30],
        ] as const;
        const ordered = i % 2 === 0 ? rows : [...rows].reverse();
        return ordered.map(([orgId, nowMs], j) => admission({ requestId: `${instance}_${i}_${j}`, orgId, nowMs, mode: "preview" }));
      };
      const admitAll = (store: PostgresStore, instance: string) =>
        (async () => {
          for (let i = 0; i < 25; i++) {
            const result = await store.commitBatch({ admissions: batch(instance, i), completions: [] });
            assert.ok(result.admissions.every((r) => r.kind === "admitted"));
          }
        })();
      await Promise.all([admitAll(a, "a"), admitAll(b, "b"), admitAll(a, "c"), admitAll(b, "d")]);
      await assertExact(a, "after concurrent admissions");
      // Every instance completes requests admitted by the others.
      const completeAll = (store: PostgresStore, instance: string) =>
        (async () => {
          for (let i = 0; i < 25; i++) {
            const completions = batch(instance, i).map((c) =>
              completion({ requestId: c.requestId, orgId: c.orgId, nowMs: T0 + 2 * DAY_MS, inputTokens: i }),
            );
            const result = await store.commitBatch({ admissions: [], completions });
            assert.ok(result.completions.every((r) => r.kind === "completed"));
          }
        })();
      await Promise.all([completeAll(b, "a"), completeAll(a, "b"), completeAll(b, "c"), completeAll(a, "d")]);
      const rows = await assertExact(a, "after concurrent completions");
      assert.equal(
        rows.reduce((s, r) => s + r[2]!, 0),
        4 * 25 * 4,
      );
      assert.equal(
        rows.reduce((s, r) => s + r[3]!, 0),
        0,
        "nothing in flight",
      );
    });
  });

  describe("usage_daily: migration 007 on PostgreSQL", () => {
    it("fills the roll-up from the records already stored; completions afterwards keep it exact", async () => {
      const url = await freshSchemaUrl();
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        await applyPostgresMigrations(
          client,
          readPostgresMigrations().filter((m) => m.version < 7),
        );
        for (const r of OLD_RECORDS) {
          const params = oldRecordParams(r, false);
          await client.query(
            `INSERT INTO usage_records (${USAGE_COLUMNS_006}) VALUES (${params.map((_, i) => `$${i + 1}`).join(", ")})`,
            params,
          );
        }
      } finally {
        await client.end();
      }
      const store = await open(url);
      assert.deepEqual(await query(store, ROLL_UP_SQL), [
        ["org_a", T0, 2, 0, 1, 1, 135, 7, 300],
        ["org_a", T0 + DAY_MS, 1, 1, 0, 0, 0, 0, 0],
        ["org_a", T0 + 3 * DAY_MS, 1, 0, 1, 0, 1, 2, 3],
        ["org_b", T0 + 2 * DAY_MS, 3, 0, 0, 3, 4000, 0, 0],
      ]);
      await assertExact(store, "after the migration");
      await store.commitBatch({
        admissions: [],
        completions: [completion({ requestId: "old_3", orgId: "org_a", nowMs: T0 + 2 * DAY_MS })],
      });
      await store.commitBatch({ admissions: [admission({ requestId: "new_1", orgId: "org_a", nowMs: T0 + DAY_MS + 1 })], completions: [] });
      await assertExact(store, "after writes through the books");
      const indexes = (
        await store.pool.query<{ name: string }>("SELECT indexname AS name FROM pg_indexes WHERE schemaname = current_schema()")
      ).rows.map((r) => r.name);
      assert.ok(indexes.includes("usage_daily_by_org"));
      assert.ok(!indexes.includes("usage_records_by_time"), "the time index of 006 is gone");
    });
  });
}
