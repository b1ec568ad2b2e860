/**
 * The session settings of the PostgreSQL adapter's connections come in the startup packet (pg's `options`), merged
 * with the operator's own `options`: no statement on any connection sets anything. Real PostgreSQL, a scratch database.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { clientConfig, connectionSettings } from "../../src/store/postgres/postgres-connection.ts";
import { openPostgresStore, type PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { watchQueries } from "../support/pg-queries.ts";
import { createTestDatabase } from "../support/postgres-db.ts";

type Db = Awaited<ReturnType<typeof createTestDatabase>>;

/** Every statement text any pg client of this process sends while `fn` runs (pooled connections included). */
async function statementsSent(fn: () => Promise<void>): Promise<string[]> {
  const sent: string[] = [];
  await watchQueries(({ config }) => sent.push(typeof config === "string" ? config : ((config as { text?: string }).text ?? "")), fn);
  return sent;
}

interface SessionRow {
  jit: string;
  seqscan: string;
  seqscan_source: string;
  joins: string;
  plans: string;
  plans_source: string;
  jit_source: string;
  st: string;
  idle: string;
  path: string;
}

const SESSION =
  "SELECT current_setting('jit') AS jit, current_setting('plan_cache_mode') AS plans, current_setting('statement_timeout') AS st, " +
  "current_setting('enable_seqscan') AS seqscan, (SELECT source FROM pg_settings WHERE name = 'enable_seqscan') AS seqscan_source, " +
  "current_setting('enable_hashjoin') || ' ' || current_setting('enable_mergejoin') AS joins, " +
  "current_setting('idle_in_transaction_session_timeout') AS idle, current_setting('search_path') AS path, " +
  "(SELECT source FROM pg_settings WHERE name = 'plan_cache_mode') AS plans_source, (SELECT source FROM pg_settings WHERE name = 'jit') AS jit_source";

describe("PostgreSQL session settings", () => {
  let db: Db;
  const stores: PostgresStore[] = [];
  const open = async (url: string, options = {}) => {
    const store = await openPostgresStore(url, options);
    stores.push(store);
    return store;
  };

  before(async () => {
    db = await createTestDatabase("tds_session");
  });
  after(async () => {
    await Promise.all(stores.map((s) => s.close()));
    await db.drop();
  });

  it("gives every pooled connection jit off and the timeouts from the startup packet, generic plans and no Seq Scans nor hash or merge joins to the bookkeeping ones, with no SET sent", async () => {
    let rows: SessionRow[] = [];
    // Opened first: the migration connection is not the request path; the rows below come from pooled connections.
    const store = await open(db.url, { poolSize: 2, statementTimeoutMs: 2345, keepStatisticsFresh: true });
    const sent = await statementsSent(async () => {
      const clients = [await store.pool.connect(), await store.bookkeepingPool.connect()];
      try {
        rows = await Promise.all(clients.map(async (c) => (await c.query<SessionRow>(SESSION)).rows[0]!));
      } finally {
        for (const c of clients) c.release();
      }
      const org = await store.createOrganization({ id: "org_session", name: "session", nowMs: Date.now() });
      await store.grantCredits({ orgId: org.id, amountMicrousd: 10, nowMs: Date.now() });
    });
    for (const row of rows) {
      assert.deepEqual([row.jit, row.st, row.idle], ["off", "2345ms", "2345ms"], "the store's settings on a pooled connection");
      // 'client': from the startup packet; a SET would make it 'session'.
      assert.equal(row.jit_source, "client");
    }
    const [read, bookkeeping] = rows;
    assert.deepEqual([read?.plans, read?.plans_source], ["auto", "default"], "reads: plan_cache_mode is left to the server");
    assert.deepEqual(
      [bookkeeping?.plans, bookkeeping?.plans_source],
      ["force_generic_plan", "client"],
      "bookkeeping transactions: generic plans, from the startup packet",
    );
    assert.deepEqual([read?.seqscan, read?.seqscan_source, read?.joins], ["on", "default", "on on"], "reads: left to the server");
    assert.deepEqual(
      [bookkeeping?.seqscan, bookkeeping?.seqscan_source, bookkeeping?.joins],
      ["off", "client", "off off"],
      "bookkeeping transactions: by index, no hash or merge joins",
    );
    const setting = sent.filter((text) => /^\s*(SET|RESET)\b/i.test(text) || /set_config\s*\(/i.test(text));
    assert.deepEqual(setting, [], "no statement sets a session setting");
    assert.ok(
      sent.some((text) => text.startsWith("BEGIN")),
      "the wrapper saw the store's statements",
    );
  });

  it("without statistics kept fresh (a CLI run, or tables the store could not analyze), bookkeeping connections plan each execution", async () => {
    const store = await open(db.url, { poolSize: 2 });
    const client = await store.bookkeepingPool.connect();
    try {
      const row = (await client.query<SessionRow>(SESSION)).rows[0]!;
      assert.deepEqual([row.plans, row.plans_source], ["auto", "default"]);
      assert.deepEqual([row.seqscan, row.joins], ["off", "off off"], "by index all the same");
    } finally {
      client.release();
    }
  });

  it("keeps the operator's options from the URL, whose values win over the store's", async () => {
    const operator = "-c search_path=public,pg_catalog -c statement_timeout=4321 -c jit=on";
    const store = await open(`${db.url}?options=${encodeURIComponent(operator)}&application_name=tds-session-test`, {
      statementTimeoutMs: 1000,
    });
    const row = (await store.pool.query<SessionRow & { app: string }>(`${SESSION}, current_setting('application_name') AS app`)).rows[0]!;
    assert.equal(row.path, "public,pg_catalog", "the operator's search_path");
    assert.equal(row.st, "4321ms", "the operator's statement_timeout wins over statement_timeout_ms");
    assert.equal(row.jit, "on", "the operator's jit wins");
    assert.equal(row.idle, "1s", "the store's own settings stay where the operator set nothing");
    assert.equal(row.app, "tds-session-test");
  });
});

describe("a connection's own statement timeout", () => {
  it("comes after the operator's options, so the migrations' longer timeout is not shortened by the URL's", () => {
    const settings = connectionSettings("postgres://127.0.0.1/test?options=-c%20statement_timeout%3D3000");
    const pooled = clientConfig(settings).options ?? "";
    const migrating = clientConfig(settings, { statementTimeoutMs: 600_000 }).options ?? "";
    assert.match(pooled, /statement_timeout=3000$/, "the operator's value wins on pooled connections");
    assert.match(migrating, /statement_timeout=600000$/, "the migration connection's own timeout wins on it");
  });
});
