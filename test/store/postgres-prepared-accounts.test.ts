/**
 * The accounts' statements (key lookups above all: one per event-loop turn of requests) run on PostgreSQL as named
 * prepared statements (postgres-accounts.ts): each connection parses one once, and PostgreSQL may keep its plan,
 * instead of parsing and planning it at every execution. Real PostgreSQL, a scratch database.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type pg from "pg";
import { openPostgresStore, type PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { watchQueries } from "../support/pg-queries.ts";
import { createTestDatabase } from "../support/postgres-db.ts";

const T0 = Date.UTC(2026, 0, 1);
const LOOKUPS = 12;

describe("PostgreSQL: the accounts' statements are prepared once per connection", () => {
  let db: Awaited<ReturnType<typeof createTestDatabase>>;
  let store: PostgresStore;

  before(async () => {
    db = await createTestDatabase("tds_prepared");
    // pool_size 3: one bookkeeping connection, two for reads.
    store = await openPostgresStore(db.url, { poolSize: 3 });
    await store.createOrganization({ id: "org_1", name: "one", nowMs: T0 });
    await store.createApiKey({ id: "key_1", orgId: "org_1", name: "k", hash: "a".repeat(64), nowMs: T0 });
  });
  after(async () => {
    await store?.close();
    await db?.drop();
  });

  it("sends a key lookup by name, and each read connection parses it once and runs it from its prepared statement", async () => {
    const sent: pg.QueryConfig[] = [];
    await watchQueries(
      ({ config }) => {
        if (typeof config === "object" && config !== null && (config as pg.QueryConfig).text?.includes("FROM api_keys k")) {
          sent.push(config as pg.QueryConfig);
        }
      },
      async () => {
        // One at a time: each its own event-loop turn, so its own query.
        for (let i = 0; i < LOOKUPS; i++) assert.equal((await store.findApiKeyForRequest("key_1"))?.key.id, "key_1");
        assert.equal(await store.findApiKeyForRequest("key_missing"), null);
      },
    );
    assert.equal(sent.length, LOOKUPS + 1, "one query per lookup");
    const names = new Set(sent.map((q) => q.name));
    assert.equal(names.size, 1, `one statement, by one name: ${[...names].join(", ")}`);
    const [name] = names;
    assert.match(name ?? "", /^tds_a_[0-9a-f]{24}$/);

    // Every read connection's prepared statements: the lookup is there once per connection that ran it, and the runs
    // counted by PostgreSQL (with a generic plan or a custom one) are all of them.
    const clients = await Promise.all([store.pool.connect(), store.pool.connect()]);
    try {
      const rows = (
        await Promise.all(
          clients.map(
            async (c) =>
              (
                await c.query<{ generic: number; custom: number }>(
                  "SELECT generic_plans::int AS generic, custom_plans::int AS custom FROM pg_prepared_statements WHERE name = $1",
                  [name],
                )
              ).rows,
          ),
        )
      ).flat();
      assert.ok(rows.length >= 1 && rows.length <= 2, `prepared on ${rows.length} connection(s)`);
      assert.equal(
        rows.reduce((n, r) => n + r.generic + r.custom, 0),
        LOOKUPS + 1,
        "every lookup ran from the prepared statement",
      );
    } finally {
      for (const c of clients) c.release();
    }
  });
});
