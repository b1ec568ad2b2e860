/**
 * The bookkeeping transactions run on connections with plan_cache_mode=force_generic_plan (postgres-connection.ts):
 * each statement is planned once per connection, without its parameters' values, and again after an ANALYZE of a table
 * it uses. This checks those generic plans as the bookkeeping connection makes them (EXPLAIN EXECUTE): every
 * statement the store sends there for admissions, completions, the sweep, the release of orphans and the grants finds
 * its rows by an index on tables of a few tens of thousands of rows once analyzed. (Below about a thousand rows, and on a
 * database never analyzed, where PostgreSQL assumes 10 pages per table, some of them read usage_records or
 * idempotency_keys whole until the next ANALYZE: postgres-statistics.test.ts.) Real PostgreSQL, a scratch database.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import pg from "pg";
import type { AdmitCommand } from "../../src/domain/bookkeeping.ts";
import { openPostgresStore, type PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { watchQueries } from "../support/pg-queries.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { admission, completion } from "./store-contract.ts";

const T0 = Date.UTC(2026, 0, 1);
const DAY = "2026-01-01";
const ROWS = 30_000;
const LARGE_TABLES = /Seq Scan on (usage_records|ledger_entries|idempotency_keys)\b/;
const ACTOR = { source: "cli", client: "plans-test", remoteAddress: null } as const;

/** A parameter value as an untyped literal (arrays in PostgreSQL's array syntax), which EXECUTE casts to the parameter's type. */
function literal(value: unknown): string {
  if (value === null || value === undefined) return "NULL";
  if (!Array.isArray(value)) return pg.escapeLiteral(String(value));
  const element = (e: unknown) => (e === null ? "NULL" : `"${String(e).replace(/["\\]/g, "\\$&")}"`);
  return pg.escapeLiteral(`{${value.map(element).join(",")}}`);
}

/** Every statement with parameters sent on a connection of the bookkeeping pool while `fn` runs, one per text. */
async function bookkeepingStatements(store: PostgresStore, fn: () => Promise<void>): Promise<pg.QueryConfig[]> {
  const bookkeeping = new Set<unknown>();
  const onAcquire = (client: unknown) => bookkeeping.add(client);
  store.bookkeepingPool.on("acquire", onAcquire);
  const sent = new Map<string, pg.QueryConfig>();
  try {
    await watchQueries(({ client, config }) => {
      const statement = config as pg.QueryConfig;
      if (bookkeeping.has(client) && typeof config === "object" && statement.values?.length) sent.set(statement.text, statement);
    }, fn);
  } finally {
    store.bookkeepingPool.off("acquire", onAcquire);
  }
  return [...sent.values()];
}

/** The generic plan of each statement on a bookkeeping connection (prepared there under a name of the test's). */
async function genericPlans(store: PostgresStore, statements: pg.QueryConfig[]): Promise<string[]> {
  const client = await store.bookkeepingPool.connect();
  try {
    const plans: string[] = [];
    for (const [i, statement] of statements.entries()) {
      await client.query(`PREPARE plans_test_${i} AS ${statement.text}`);
      const args = (statement.values ?? []).map(literal).join(", ");
      const rows = (await client.query<{ "QUERY PLAN": string }>(`EXPLAIN EXECUTE plans_test_${i}(${args})`)).rows;
      await client.query(`DEALLOCATE plans_test_${i}`);
      plans.push(`${statement.name ?? "(unnamed)"}: ${statement.text.slice(0, 100)}\n${rows.map((r) => r["QUERY PLAN"]).join("\n")}`);
    }
    return plans;
  } finally {
    client.release();
  }
}

const paid = (requestId: string, idempotent: boolean): AdmitCommand =>
  admission({
    requestId,
    orgId: "org_1",
    idempotency: idempotent ? { key: `k_${requestId}`, requestHash: "h", lockUntilMs: T0 + 60_000, expiresAtMs: T0 + 86_400_000 } : null,
    reservation: { amountMicrousd: 100, expiresAtMs: T0 + 120_000 },
    keyBudget: { keyId: "key_1", period: DAY, limitMicrousd: 1_000_000_000 },
  });

/**
 * Every kind of bookkeeping transaction once: admissions and completions (paid with Idempotency-Keys and a key budget,
 * preview), sweep, release, grants.
 */
async function everyTransaction(store: PostgresStore, round: number): Promise<void> {
  const id = (name: string) => `${name}_${round}`;
  const first = [paid(id("p1"), true), paid(id("p2"), true)];
  const preview = admission({ requestId: id("v1"), orgId: "org_1", quota: { day: DAY, orgLimit: 100, globalLimit: 1000 } });
  await store.commitBatch({ admissions: [...first, preview], completions: [] });
  const done = (a: AdmitCommand) =>
    completion({
      requestId: a.requestId,
      orgId: "org_1",
      costMicrousd: a.reservation ? 10 : 0,
      reserved: a.reservation !== null,
      keyBudget: a.keyBudget ? { keyId: a.keyBudget.keyId, period: a.keyBudget.period } : null,
      idempotency: a.idempotency && { key: a.idempotency.key, response: { status: 200, body: "{}", requestId: a.requestId } },
    });
  await store.commitBatch({ admissions: [paid(id("s1"), false)], completions: [...first, preview].map(done) });
  await store.sweep({ nowMs: T0 + 1, inFlightBeforeMs: T0 + 1, limit: 10 });
  await store.commitBatch({ admissions: [paid(id("o1"), false)], completions: [] });
  await store.releaseOrphans({ instanceId: "other", nowMs: T0, createdBeforeMs: T0 + 1, limit: 10 });
  await store.grantCredits({ orgId: "org_1", amountMicrousd: 1000, nowMs: T0, audit: ACTOR });
  await store.grantCreditsOnce({
    orgId: "org_1",
    amountMicrousd: 1,
    nowMs: T0,
    audit: ACTOR,
    idempotency: { key: id("g"), requestHash: "h" },
  });
}

/** `count` copies of the first row of `table` matching `where`, with `vary` giving some columns' expressions of g. */
async function copyRows(sql: pg.Client, table: string, where: string, count: number, vary: Record<string, string>): Promise<void> {
  const columns = (
    await sql.query<{ name: string }>(
      "SELECT column_name AS name FROM information_schema.columns WHERE table_name = $1 AND table_schema = current_schema() " +
        "AND is_generated = 'NEVER' AND is_identity = 'NO' ORDER BY ordinal_position",
      [table],
    )
  ).rows.map((r) => r.name);
  const select = columns.map((c) => vary[c] ?? `t.${c}`).join(", ");
  await sql.query(
    `INSERT INTO ${table} (${columns.join(", ")}) SELECT ${select} FROM (SELECT * FROM ${table} WHERE ${where} LIMIT 1) t, generate_series(1, ${count}) g`,
  );
}

describe("PostgreSQL: the generic plans of the bookkeeping statements", { timeout: 120_000 }, () => {
  let db: Awaited<ReturnType<typeof createTestDatabase>>;
  let store: PostgresStore;
  let sql: pg.Client;

  before(async () => {
    db = await createTestDatabase("tds_plans");
    // pool_size 3: one bookkeeping connection, two for reads.
    store = await openPostgresStore(db.url, { poolSize: 3, keepStatisticsFresh: true });
    sql = new pg.Client({ connectionString: db.url });
    await sql.connect();
    await store.createOrganization({ id: "org_1", name: "one", nowMs: T0 });
    await store.createApiKey({ id: "key_1", orgId: "org_1", name: "k", hash: "a".repeat(64), nowMs: T0 });
    await store.grantCredits({ orgId: "org_1", amountMicrousd: 1_000_000_000, nowMs: T0 });
  });
  after(async () => {
    await store?.close();
    await sql?.end();
    await db?.drop();
  });

  it("runs on a connection of the bookkeeping pool, with no Seq Scan on the large tables once they are analyzed", async () => {
    const statements = await bookkeepingStatements(store, () => everyTransaction(store, 0));
    const named = statements.filter((s) => s.name?.startsWith("tds_"));
    assert.ok(named.length >= 8, `the store's prepared statements were seen: ${statements.map((s) => s.name).join(", ")}`);
    assert.ok(
      statements.some((s) => s.name === "tds_dueInFlight") && statements.some((s) => s.name === "tds_orphanedInFlight"),
      "the sweep's and the release's reads",
    );
    assert.ok(
      statements.filter((s) => /INSERT INTO key_spend/.test(s.text)).length >= 2,
      "the key spend's locked read (created at 0 where missing) and its write",
    );

    await copyRows(sql, "usage_records", "outcome = 'succeeded'", ROWS, {
      request_id: "'bulk_' || g",
      created_at_ms: "t.created_at_ms - g",
      completed_at_ms: "t.completed_at_ms - g",
    });
    await copyRows(sql, "ledger_entries", "reservation_id IS NOT NULL", ROWS, { reservation_id: "'bulk_' || g" });
    await copyRows(sql, "idempotency_keys", "true", ROWS / 3, { key: "'bulk_' || g", request_id: "'bulk_' || g" });
    await sql.query("SELECT pg_stat_force_next_flush()");
    const refresh = await store.refreshStatistics();
    for (const table of ["usage_records", "ledger_entries", "idempotency_keys"]) assert.ok(refresh.analyzed.includes(table), table);

    const plans = await genericPlans(store, statements);
    for (const plan of plans) assert.doesNotMatch(plan, LARGE_TABLES, plan);
    const sweep = plans.find((p) => p.startsWith("tds_dueInFlight:"));
    assert.match(sweep ?? "", /Index Scan using usage_records_in_flight on usage_records/, sweep);
    const orphans = plans.find((p) => p.startsWith("tds_orphanedInFlight:"));
    assert.match(orphans ?? "", /Index Scan using usage_records_in_flight on usage_records/, orphans);

    // The store's own prepared statements were planned generically, on the bookkeeping connection.
    await everyTransaction(store, 1);
    const client = await store.bookkeepingPool.connect();
    const counts = await client
      .query<{ name: string; generic: number; custom: number }>(
        "SELECT name, generic_plans::int AS generic, custom_plans::int AS custom FROM pg_prepared_statements",
      )
      .finally(() => client.release());
    const prepared = counts.rows.filter((r) => r.name.startsWith("tds_"));
    assert.ok(prepared.length >= 8, JSON.stringify(counts.rows));
    for (const row of prepared) assert.deepEqual([row.name, row.custom], [row.name, 0], "never a custom plan");
    assert.ok(prepared.every((row) => row.generic > 0));
  });
});
