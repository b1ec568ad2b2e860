/**
 * The bookkeeping transactions run on connections with plan_cache_mode=force_generic_plan (postgres-connection.ts):
 * each statement is planned once per connection, without its parameters' values, and again after an ANALYZE of a table
 * it uses. This checks those generic plans as the bookkeeping connection makes them (EXPLAIN EXECUTE): every
 * statement the store sends there for admissions, completions, the sweep, the release of orphans and the grants finds
 * its rows by an index: on a new database never analyzed (PostgreSQL assumes 10 pages per table, and a Seq Scan of a few
 * rows costs less than an index scan, but its generic plan would be kept as the table grows), and on tables of a few
 * tens of thousands of rows once analyzed. Real PostgreSQL, a scratch database.
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

/** Partial: only the usage records in flight (migration 003). */
const IN_FLIGHT_INDEX = "usage_records_in_flight";
interface PlanNode {
  "Node Type": string;
  "Relation Name"?: string;
  "Index Name"?: string;
  "Index Cond"?: string;
  Plans?: PlanNode[];
}

/**
 * What makes a plan read more than the rows it asks for: a Seq Scan of a table, an index scan without an Index Cond
 * (the whole index; but for the partial index of the records in flight, which holds only them),
 * a hash or merge join (each reads one side whole; the bookkeeping statements join a batch's keys to primary keys).
 */
function unkeyed(node: PlanNode, found: string[] = []): string[] {
  const type = node["Node Type"];
  const table = node["Relation Name"] ?? "";
  if (type === "Seq Scan" && table) found.push(`Seq Scan on ${table}`);
  const wholeIndex = (type === "Index Scan" || type === "Index Only Scan") && !node["Index Cond"];
  if (wholeIndex && node["Index Name"] !== IN_FLIGHT_INDEX) found.push(`${type} of all of ${node["Index Name"]}`);
  if (type === "Hash Join" || type === "Merge Join") found.push(type);
  for (const child of node.Plans ?? []) unkeyed(child, found);
  return found;
}

/** The generic plan of each statement on a bookkeeping connection (prepared there under a name of the test's). */
async function genericPlans(store: PostgresStore, statements: pg.QueryConfig[]): Promise<Array<{ statement: string; plan: PlanNode }>> {
  const client = await store.bookkeepingPool.connect();
  try {
    const plans: Array<{ statement: string; plan: PlanNode }> = [];
    for (const [i, statement] of statements.entries()) {
      await client.query(`PREPARE plans_test_${i} AS ${statement.text}`);
      const args = (statement.values ?? []).map(literal).join(", ");
      const rows = (
        await client.query<{ "QUERY PLAN": Array<{ Plan: PlanNode }> }>(`EXPLAIN (FORMAT JSON) EXECUTE plans_test_${i}(${args})`)
      ).rows;
      await client.query(`DEALLOCATE plans_test_${i}`);
      plans.push({ statement: `${statement.name ?? "(unnamed)"}: ${statement.text.slice(0, 100)}`, plan: rows[0]!["QUERY PLAN"][0]!.Plan });
    }
    return plans;
  } finally {
    client.release();
  }
}

/** Every plan reads only the rows it asks for; `when` says in which state of the tables. */
function assertKeyed(plans: Array<{ statement: string; plan: PlanNode }>, when: string): void {
  const found = plans.flatMap(({ statement, plan }) => unkeyed(plan).map((problem) => `${problem} in ${statement}`));
  assert.deepEqual(found, [], `${when}:\n${found.join("\n")}`);
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

  it("runs on a connection of the bookkeeping pool, each plan reading only the rows it asks for: never analyzed, analyzed small, and large", async () => {
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

    const analyzed = await sql.query<{ relname: string }>(
      "SELECT relname FROM pg_stat_user_tables WHERE relname IN ('usage_records', 'ledger_entries', 'idempotency_keys') " +
        "AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)",
    );
    assert.deepEqual(analyzed.rows, [], "the large tables were never analyzed yet");
    assertKeyed(await genericPlans(store, statements), "a few rows, never analyzed");

    // Analyzed while small: by the store's refresh, as soon as usage_records holds 50 rows (most of them completed, so
    // that few of the rows a completion asks for are in flight), then once every large table does.
    const analyzedSmall = async (from: number, to: number, tables: string[]) => {
      for (let round = from; round < to; round++) await everyTransaction(store, round);
      // The store's backends report their rows at most once a second.
      const counted = async () =>
        (await sql.query("SELECT count(*)::int AS n FROM pg_stat_user_tables WHERE relname = ANY($1) AND n_live_tup >= 50", [tables]))
          .rows[0].n === tables.length;
      for (let waited = 0; !(await counted()); waited += 100) {
        assert.ok(waited < 10_000, "the rows written were counted in the statistics");
        await new Promise((r) => setTimeout(r, 100));
      }
      // By this refresh, or by the store's own timer just before it.
      await store.refreshStatistics();
      const analyzed = await sql.query<{ relname: string }>(
        "SELECT relname FROM pg_stat_user_tables WHERE relname = ANY($1) AND last_analyze IS NOT NULL ORDER BY relname",
        [tables],
      );
      assert.deepEqual(
        analyzed.rows.map((r) => r.relname),
        [...tables].sort(),
        "analyzed",
      );
      const rows = await sql.query<{ n: number }>("SELECT count(*)::int AS n FROM usage_records");
      assertKeyed(await genericPlans(store, statements), `analyzed with ${rows.rows[0]!.n} usage records`);
    };
    await analyzedSmall(100, 110, ["usage_records"]);
    await analyzedSmall(110, 130, ["usage_records", "ledger_entries", "idempotency_keys"]);

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
    assertKeyed(plans, "tens of thousands of rows, analyzed");
    const inFlightIndex = (name: string) => {
      const plan = JSON.stringify(plans.find((p) => p.statement.startsWith(`${name}:`))?.plan ?? null);
      assert.match(plan, new RegExp(`"Index Name":"${IN_FLIGHT_INDEX}"`), plan);
    };
    inFlightIndex("tds_dueInFlight");
    inFlightIndex("tds_orphanedInFlight");

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
