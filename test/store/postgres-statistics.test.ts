/**
 * The PostgreSQL store keeps the planner statistics of its tables fresh (postgres-statistics.ts): a refresh analyzes the
 * tables past autovacuum's analyze threshold and nothing else, never waits for another instance's ANALYZE, survives a
 * role that may not analyze, and, the point of it, makes PostgreSQL plan the prepared bookkeeping statements again once
 * a table grew (their generic plans: the bookkeeping connections have plan_cache_mode=force_generic_plan). Real PostgreSQL (15 or newer: pg_stat_force_next_flush), a scratch database; autovacuum may be off.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, describe, it } from "node:test";
import pg from "pg";
import {
  ANALYZE_SCALE_FACTOR,
  ANALYZE_THRESHOLD_ROWS,
  GATEWAY_TABLES,
  refreshStatistics,
  StatisticsRefresher,
} from "../../src/store/postgres/postgres-statistics.ts";
import { openPostgresStore, type PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { watchQueries } from "../support/pg-queries.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { admission, completion } from "./store-contract.ts";

const T0 = Date.UTC(2026, 0, 1);
const NOTHING = { analyzed: [], locked: [], failed: [] };

/** Makes this session's table counters visible to the others now (flushed before the statement's answer is sent). */
async function flushStats(client: pg.ClientBase): Promise<void> {
  await client.query("SELECT pg_stat_force_next_flush()");
}

/** `count` completed usage records of org_1 with ids `${prefix}1` …, counted in the statistics at once. */
async function insertUsage(client: pg.ClientBase, prefix: string, count: number): Promise<void> {
  await client.query(
    "INSERT INTO usage_records (request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, " +
      "input_tokens, output_tokens, cost_microusd, gateway_latency_ms, completed_at_ms) " +
      "SELECT $1 || g, 'org_1', 'key_1', g, 'api', 'm', 'paid', 'succeeded', 200, 1, 1, 0, 1, g FROM generate_series(1, $2::int) g",
    [prefix, count],
  );
  await flushStats(client);
}

async function statsOf(client: pg.ClientBase, table: string): Promise<{ analyzed: boolean; modified: number }> {
  const row = (
    await client.query<{ analyzed: boolean; modified: number }>(
      "SELECT last_analyze IS NOT NULL AS analyzed, n_mod_since_analyze::int AS modified FROM pg_stat_user_tables " +
        "WHERE schemaname = current_schema() AND relname = $1",
      [table],
    )
  ).rows[0];
  assert.ok(row, `no statistics row for ${table}`);
  return row;
}

/** A parameter value as an untyped literal (arrays in PostgreSQL's array syntax), which EXECUTE casts to the parameter's type. */
function literal(value: unknown): string {
  if (value === null) return "NULL";
  if (!Array.isArray(value)) return pg.escapeLiteral(String(value));
  const element = (e: unknown) => (e === null ? "NULL" : `"${String(e).replace(/["\\]/g, "\\$&")}"`);
  return pg.escapeLiteral(`{${value.map(element).join(",")}}`);
}

/** The plan PostgreSQL uses for the next execution of a prepared statement (on the pool's one connection). */
async function planOf(pool: pg.Pool, statement: pg.QueryConfig): Promise<string> {
  const args = (statement.values ?? []).map(literal).join(", ");
  const rows = (await pool.query<{ "QUERY PLAN": string }>(`EXPLAIN EXECUTE ${statement.name}(${args})`)).rows;
  return rows.map((r) => r["QUERY PLAN"]).join("\n");
}

/** How often a prepared statement of the pool's one connection was run with its generic plan and with a custom plan. */
async function planCounts(pool: pg.Pool, statement: pg.QueryConfig): Promise<{ generic: number; custom: number; pid: number }> {
  const row = (
    await pool.query<{ generic: number; custom: number; pid: number }>(
      "SELECT generic_plans::int AS generic, custom_plans::int AS custom, pg_backend_pid() AS pid FROM pg_prepared_statements WHERE name = $1",
      [statement.name],
    )
  ).rows[0];
  assert.ok(row, `${statement.name} is prepared on the connection`);
  return row;
}

/** Every statement a pg client of this process sends with a name (the store's prepared statements) while `fn` runs. */
async function preparedStatementsSent(fn: () => Promise<void>): Promise<pg.QueryConfig[]> {
  const sent: pg.QueryConfig[] = [];
  await watchQueries(({ config }) => {
    if (typeof config === "object" && config !== null && "name" in config) sent.push(config as pg.QueryConfig);
  }, fn);
  return sent;
}

/** Admits and completes requests `from` … `to - 1` of org_1, one batch each. */
async function admitAndComplete(store: PostgresStore, from: number, to: number): Promise<void> {
  for (let i = from; i < to; i++) {
    await store.commitBatch({ admissions: [admission({ requestId: `req_${i}`, orgId: "org_1" })], completions: [] });
    await store.commitBatch({ admissions: [], completions: [completion({ requestId: `req_${i}`, orgId: "org_1" })] });
  }
}

describe("PostgreSQL planner statistics kept fresh by the store", () => {
  let db: Awaited<ReturnType<typeof createTestDatabase>> | undefined;
  let schemas = 0;
  const stores: PostgresStore[] = [];
  const clients: pg.Client[] = [];

  const connect = async (url: string) => {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    clients.push(client);
    return client;
  };
  const open = async (url: string, options: Parameters<typeof openPostgresStore>[1] = {}) => {
    const store = await openPostgresStore(url, options);
    stores.push(store);
    return store;
  };
  /**
   * A schema of its own in the scratch database (its search_path: the store's tables go there), a store on it and a
   * plain connection to it.
   */
  const scratch = async (options: Parameters<typeof openPostgresStore>[1] = {}) => {
    db ??= await createTestDatabase("tds_stats");
    const schema = `stats_${++schemas}`;
    await (await connect(db.url)).query(`CREATE SCHEMA ${schema}`);
    const url = `${db.url}?options=${encodeURIComponent(`-c search_path=${schema}`)}`;
    const store = await open(url, options);
    // After the check the store makes as it opens, so that the test's rows are not analyzed by it.
    assert.deepEqual(await store.refreshStatistics(), NOTHING);
    return { url, schema, store, sql: await connect(url) };
  };

  after(async () => {
    await Promise.all(stores.map((s) => s.close()));
    await Promise.all(clients.map((c) => c.end()));
    await db?.drop();
  });

  it("knows every table of the migrations", async () => {
    const { sql } = await scratch();
    const tables = (
      await sql.query<{ name: string }>(
        "SELECT relname AS name FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname <> 'schema_migrations' ORDER BY 1",
      )
    ).rows.map((r) => r.name);
    assert.deepEqual(tables, [...GATEWAY_TABLES]);
  });

  it("analyzes a table past the threshold, not one below it, and nothing at a second refresh", async () => {
    const { store, sql } = await scratch();
    await sql.query("INSERT INTO organizations (id, name, created_at_ms) SELECT 'org_' || g, 'o' || g, 1 FROM generate_series(1, 21) g");
    await insertUsage(sql, "a", 3 * ANALYZE_THRESHOLD_ROWS);

    assert.deepEqual(await store.refreshStatistics(), { ...NOTHING, analyzed: ["usage_records"] });
    assert.deepEqual(await statsOf(sql, "usage_records"), { analyzed: true, modified: 0 });
    assert.deepEqual(await statsOf(sql, "organizations"), { analyzed: false, modified: 21 }, "21 rows: below the threshold");
    assert.deepEqual(await store.refreshStatistics(), NOTHING, "nothing changed since");

    // Analyzed with 150 rows: due again after 50 + 0.1 × 150 = 65 changes.
    const due = ANALYZE_THRESHOLD_ROWS + ANALYZE_SCALE_FACTOR * 3 * ANALYZE_THRESHOLD_ROWS;
    await insertUsage(sql, "b", due - 1);
    assert.deepEqual(await store.refreshStatistics(), NOTHING, "one change short of the threshold");
    await insertUsage(sql, "c", 1);
    assert.deepEqual(await store.refreshStatistics(), { ...NOTHING, analyzed: ["usage_records"] });
    assert.equal((await statsOf(sql, "usage_records")).modified, 0);
  });

  it("makes PostgreSQL plan the prepared bookkeeping statements again once a table grew; they read by key at every size", async () => {
    // pool_size 2: one bookkeeping connection, where every bookkeeping statement and the checks below run; generic
    // plans there, as the store keeps the statistics fresh.
    const { store, sql } = await scratch({ poolSize: 2, keepStatisticsFresh: true });
    await store.createOrganization({ id: "org_1", name: "one", nowMs: T0 });
    await insertUsage(sql, "small", 200);
    assert.deepEqual((await store.refreshStatistics()).analyzed, ["usage_records"], "analyzed while small");

    // The completion's read (its usage record, by key) and write (the record updated by key), 8 times each.
    const requests = 8;
    const sent = await preparedStatementsSent(() => admitAndComplete(store, 0, requests));
    const read = sent.findLast((q) => q.text.includes("FROM usage_records WHERE request_id = ANY("));
    const write = sent.findLast((q) => q.text.includes("UPDATE usage_records u SET"));
    assert.ok(read?.name && write?.name, "the completion's read and write are prepared statements");
    assert.equal(sent.filter((q) => q.name === read.name).length, requests);

    const small = await planCounts(store.bookkeepingPool, read);
    assert.deepEqual([small.generic, small.custom], [requests, 0], "generic plans only (force_generic_plan)");
    // An index scan, or a bitmap scan of the index (the generic plan of `= ANY($1)` assumes 10 keys): on 200 rows a
    // Seq Scan would cost less, and its plan would be kept as the table grows (enable_seqscan=off and no hash or merge
    // joins on the bookkeeping connections, postgres-connection.ts).
    const byKey = (plan: string) => {
      assert.match(plan, /Index Scan (using|on) usage_records_pkey/, plan);
      assert.match(plan, /Index Cond: \(.*request_id/, plan);
      assert.doesNotMatch(plan, /Seq Scan|Hash Join|Merge Join/, plan);
    };
    const whileSmall = await Promise.all([read, write].map((statement) => planOf(store.bookkeepingPool, statement)));
    whileSmall.forEach(byKey);

    await insertUsage(sql, "large", 40_000);
    // Without a refresh the generic plans made on 200 rows stay, estimates and all.
    assert.deepEqual(await Promise.all([read, write].map((statement) => planOf(store.bookkeepingPool, statement))), whileSmall);

    assert.deepEqual((await store.refreshStatistics()).analyzed, ["usage_records"]);
    const grown = await Promise.all([read, write].map((statement) => planOf(store.bookkeepingPool, statement)));
    grown.forEach(byKey);
    // Planned again: the estimates come from the new statistics.
    for (const [i, plan] of grown.entries()) assert.notEqual(plan, whileSmall[i], plan);

    // From then on each execution runs that plan, planned once: no custom plan.
    const large = await planCounts(store.bookkeepingPool, read);
    assert.equal(large.pid, small.pid, "the same connection throughout");
    await admitAndComplete(store, requests, 2 * requests);
    assert.deepEqual(await planCounts(store.bookkeepingPool, read), { ...large, generic: large.generic + requests });
  });

  it("refreshes periodically only when asked (a serving gateway), not in a store opened for a command", async () => {
    const { url, sql } = await scratch();
    await insertUsage(sql, "a", 100);
    await (await open(url)).close();
    assert.deepEqual(await statsOf(sql, "usage_records"), { analyzed: false, modified: 100 }, "no ANALYZE at open or close");
    // The first refresh is done before the store is returned.
    await open(url, { keepStatisticsFresh: true });
    assert.deepEqual(await statsOf(sql, "usage_records"), { analyzed: true, modified: 0 });
  });

  it("never waits for another session's ANALYZE: two stores refreshing at once both return, a held table is left", async () => {
    const { url, store, sql } = await scratch({ statementTimeoutMs: 3000 });
    const other = await open(url, { statementTimeoutMs: 3000 });
    assert.deepEqual(await other.refreshStatistics(), NOTHING);
    await sql.query("INSERT INTO organizations (id, name, created_at_ms) SELECT 'org_' || g, 'o' || g, 1 FROM generate_series(1, 60) g");
    await insertUsage(sql, "a", 100);
    const holder = await connect(url);
    await holder.query("BEGIN");
    // The lock an ANALYZE holds (another instance analyzing usage_records right now).
    await holder.query("LOCK TABLE usage_records IN SHARE UPDATE EXCLUSIVE MODE");
    const [mine, theirs] = await Promise.all([store.refreshStatistics(), other.refreshStatistics()]);
    await holder.query("ROLLBACK");

    for (const refresh of [mine, theirs]) {
      assert.deepEqual(refresh.failed, []);
      assert.deepEqual(
        refresh.locked.filter((t) => t !== "organizations"),
        ["usage_records"],
        JSON.stringify(refresh),
      );
      assert.ok(!refresh.analyzed.includes("usage_records"));
    }
    // organizations: analyzed by one of them, or by both one after the other; skipped by one only while the other held it.
    assert.ok([...mine.analyzed, ...theirs.analyzed].includes("organizations"), JSON.stringify({ mine, theirs }));
    assert.deepEqual(await statsOf(sql, "organizations"), { analyzed: true, modified: 0 });
    assert.deepEqual(await statsOf(sql, "usage_records"), { analyzed: false, modified: 100 });
    assert.deepEqual(await store.refreshStatistics(), { ...NOTHING, analyzed: ["usage_records"] }, "taken at the next refresh");
  });

  it("reports a table the role may not analyze (PostgreSQL only warns) once, and does not fail", async () => {
    const { url, schema, sql } = await scratch();
    await insertUsage(sql, "a", 100);
    const role = `tds_stats_${randomBytes(4).toString("hex")}`;
    await sql.query(`CREATE ROLE ${role} LOGIN`);
    await sql.query(`GRANT USAGE ON SCHEMA ${schema} TO ${role}`);
    const asRole = new URL(url);
    asRole.username = role;
    const pool = new pg.Pool({ connectionString: asRole.toString(), max: 1 });
    try {
      const refresh = await refreshStatistics(pool);
      assert.deepEqual(refresh.analyzed, []);
      assert.deepEqual(
        refresh.failed.map((f) => f.table),
        ["usage_records"],
      );
      assert.match(refresh.failed[0]!.message, /usage_records/);

      const problems: string[] = [];
      const refresher = new StatisticsRefresher(pool, (message) => problems.push(message));
      await refresher.refreshNow();
      await refresher.refreshNow();
      assert.equal(problems.length, 1, JSON.stringify(problems));
      assert.match(problems[0]!, /^ANALYZE of usage_records did not run: /);
      await refresher.stop();

      // A serving store on that role: the bookkeeping statements are not given generic plans, and it says why.
      await sql.query(`GRANT CREATE ON SCHEMA ${schema} TO ${role}`);
      await sql.query(`GRANT SELECT ON ALL TABLES IN SCHEMA ${schema} TO ${role}`);
      const told: string[] = [];
      const store = await open(asRole.toString(), { keepStatisticsFresh: true, onStatisticsProblem: (m) => told.push(m) });
      const client = await store.bookkeepingPool.connect();
      try {
        assert.equal((await client.query("SELECT current_setting('plan_cache_mode') AS m")).rows[0].m, "auto");
      } finally {
        client.release();
      }
      assert.match(told.join("\n"), /ANALYZE of usage_records did not run[\s\S]*planned at every execution/);
      await store.close();
    } finally {
      await pool.end();
      await sql.query(`DROP OWNED BY ${role}`);
      await sql.query(`DROP ROLE ${role}`);
    }
    assert.deepEqual(await statsOf(sql, "usage_records"), { analyzed: false, modified: 100 });
  });

  it("reports a refresh that fails to the caller, and stops with the store", async () => {
    const { store } = await scratch();
    const problems: string[] = [];
    const refresher = new StatisticsRefresher(store.pool, (message) => problems.push(message));
    await store.close();
    await assert.rejects(refresher.refreshNow(), /pool/);
    assert.equal(problems.length, 1);
    assert.match(problems[0]!, /^The refresh of the tables' planner statistics failed/);
    await assert.rejects(store.refreshStatistics(), "closed: no refresh runs");
  });
});
