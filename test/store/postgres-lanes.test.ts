/**
 * Group commit lanes on a real PostgreSQL: several bookkeeping transactions of one instance (and of two instances)
 * in flight at once, the service-wide preview counter read without a lock and added to within its limit, and the
 * fallback when another lane took the last unit (the batch runs again with the counter locked).
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import pg from "pg";
import pino from "pino";
import type { AdmitCommand, AdmitResult } from "../../src/domain/bookkeeping.ts";
import { GroupCommit, laneOf } from "../../src/store/group-commit.ts";
import { openPostgresStore, type PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { startGateway } from "../support/gateway-harness.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { admission, completion } from "./store-contract.ts";

const SKIP = process.env.TDS_SKIP_POSTGRES === "1";
const T0 = 1_767_225_600_000;
const DAY = "2026-01-01";

const preview = (requestId: string, orgId: string, orgLimit: number, globalLimit: number): AdmitCommand =>
  admission({ requestId, orgId, quota: { day: DAY, orgLimit, globalLimit } });

/** Organizations whose steps go to different lanes of `lanes`, one per lane, the first found. */
function orgsInLanes(count: number, lanes: number): string[] {
  const byLane = new Map<number, string>();
  for (let i = 0; byLane.size < count; i++) if (!byLane.has(laneOf(`org_${i}`, lanes))) byLane.set(laneOf(`org_${i}`, lanes), `org_${i}`);
  return [...byLane.values()];
}

async function counter(store: PostgresStore, scope: string): Promise<number> {
  const { rows } = await store.pool.query<{ count: number }>("SELECT count FROM preview_counters WHERE scope = $1 AND day = $2", [
    scope,
    DAY,
  ]);
  return rows[0]?.count ?? 0;
}

describe("PostgreSQL: group commit lanes", { skip: SKIP, timeout: 120_000 }, () => {
  let db: Awaited<ReturnType<typeof createTestDatabase>>;
  let stores: PostgresStore[] = [];
  const open = async (poolSize = 6) => {
    const store = await openPostgresStore(db.url, { poolSize });
    stores.push(store);
    return store;
  };

  before(async () => {
    db = await createTestDatabase("tds_lanes");
  });
  after(async () => {
    await Promise.all(stores.map((s) => s.close()));
    stores = [];
    await db.drop();
  });

  it("many organizations' preview admissions in 4 lanes of two instances: exactly the service's limit admitted, every counter exact", async () => {
    await (await open()).pool.query("TRUNCATE preview_counters, usage_records, usage_daily");
    const instances = [new GroupCommit(await open(), { lanes: 4 }), new GroupCommit(await open(), { lanes: 4 })];
    const orgs = Array.from({ length: 24 }, (_, i) => `org_p${i}`);
    const work: Promise<AdmitResult>[] = [];
    // 400 requests over a few event-loop turns, so that batches of every lane overlap: 150 allowed for the service.
    for (let turn = 0; turn < 8; turn++) {
      for (let i = 0; i < 50; i++) {
        const n = turn * 50 + i;
        work.push(instances[n % 2]!.admit(preview(`p${n}`, orgs[n % orgs.length]!, 30, 150)));
      }
      await new Promise((r) => setImmediate(r));
    }
    const results = await Promise.all(work);
    assert.equal(results.filter((r) => r.kind === "admitted").length, 150);
    assert.equal(results.filter((r) => r.kind === "quota_exhausted" && r.scope === "global").length, 250);
    const store = stores[0]!;
    assert.equal(await counter(store, "*"), 150, "the service-wide counter");
    const orgCounts = await Promise.all(orgs.map((o) => counter(store, o)));
    assert.equal(
      orgCounts.reduce((a, b) => a + b, 0),
      150,
      `the organizations' counters: ${orgCounts.join(", ")}`,
    );
    for (const [i, orgId] of orgs.entries()) {
      const { rows } = await store.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM usage_records WHERE org_id = $1", [orgId]);
      assert.equal(rows[0]!.n, orgCounts[i], `a usage record per counted request of ${orgId}`);
    }
    const daily = await store.pool.query<{ n: number }>("SELECT sum(requests)::int AS n FROM usage_daily");
    assert.equal(daily.rows[0]!.n, 150, "the daily roll-up");
  });

  it("two lanes race for the last unit: the loser's addition fails, it runs again with the counter locked and is refused", async () => {
    const store = await open();
    await store.pool.query("TRUNCATE preview_counters, usage_records, usage_daily");
    const [orgA, orgB, orgC] = orgsInLanes(3, 3) as [string, string, string];
    const books = new GroupCommit(store, { lanes: 3 });
    assert.deepEqual(await Promise.all([books.admit(preview("c1", orgC, 10, 3)), books.admit(preview("c2", orgC, 10, 3))]), [
      { kind: "admitted" },
      { kind: "admitted" },
    ]);
    // The organization's counter of A is held by another transaction: A's read waits for it, its statement's snapshot
    // already taken, so it reads the service-wide counter as 2 however long it waits.
    await store.pool.query("INSERT INTO preview_counters (scope, day, count) VALUES ($1, $2, 0)", [orgA, DAY]);
    const blocker = new pg.Client({ connectionString: db.url });
    await blocker.connect();
    try {
      await blocker.query("BEGIN");
      await blocker.query("SELECT 1 FROM preview_counters WHERE scope = $1 AND day = $2 FOR UPDATE", [orgA, DAY]);
      let transactions = 0;
      store.bookkeepingPool.on("acquire", () => transactions++);
      const a = books.admit(preview("a1", orgA, 10, 3));
      for (let waited = 0; ; waited++) {
        const { rows } = await blocker.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        );
        if (rows[0]!.n > 0) break;
        assert.ok(waited < 500, "A's read waits for the lock");
        await new Promise((r) => setTimeout(r, 10));
      }
      assert.deepEqual(await books.admit(preview("b1", orgB, 10, 3)), { kind: "admitted" }, "B's lane is not held up");
      await blocker.query("COMMIT");
      assert.deepEqual(await a, { kind: "quota_exhausted", scope: "global" });
      assert.equal(transactions, 3, "A ran twice (the second time with the counter locked), B once");
    } finally {
      await blocker.end();
    }
    assert.equal(await counter(store, "*"), 3);
    assert.deepEqual([await counter(store, orgA), await counter(store, orgB), await counter(store, orgC)], [0, 1, 2]);
    const { rows } = await store.pool.query<{ request_id: string }>("SELECT request_id FROM usage_records ORDER BY request_id");
    assert.deepEqual(
      rows.map((r) => r.request_id),
      ["b1", "c1", "c2"],
    );
  });

  it("paid admissions and completions of many organizations in 4 lanes of two instances: every balance exact", async () => {
    const instances = [new GroupCommit(await open(), { lanes: 4 }), new GroupCommit(await open(), { lanes: 4 })];
    const store = stores.at(-1)!;
    const orgs = Array.from({ length: 8 }, (_, i) => `org_paid${i}`);
    for (const id of orgs) {
      await store.createOrganization({ id, name: id, nowMs: T0 });
      await store.grantCredits({ orgId: id, amountMicrousd: 700, nowMs: T0 });
    }
    // 150 admissions of 7 per organization for 700: exactly 100 each are admitted.
    const admitted: { requestId: string; orgId: string }[] = [];
    const work: Promise<void>[] = [];
    for (let n = 0; n < 1200; n++) {
      const orgId = orgs[n % orgs.length]!;
      const requestId = `paid_${n}`;
      const command = admission({ requestId, orgId, reservation: { amountMicrousd: 7, expiresAtMs: T0 + 3_600_000 } });
      work.push(
        instances[n % 2]!.admit(command).then((r) => {
          if (r.kind === "admitted") admitted.push({ requestId, orgId });
          else assert.equal(r.kind, "insufficient_credits");
        }),
      );
      if (n % 100 === 99) await new Promise((r) => setImmediate(r));
    }
    await Promise.all(work);
    for (const orgId of orgs) assert.equal(admitted.filter((a) => a.orgId === orgId).length, 100, orgId);
    // Each completed on the other instance, charging 5 of the 7 reserved.
    const completed = await Promise.all(
      admitted.map(({ requestId, orgId }, i) =>
        instances[(i + 1) % 2]!.complete(completion({ requestId, orgId, nowMs: T0 + 1, costMicrousd: 5, reserved: true })),
      ),
    );
    assert.ok(
      completed.every((c) => c.kind === "completed"),
      JSON.stringify(completed.find((c) => c.kind !== "completed")),
    );
    for (const orgId of orgs) {
      assert.deepEqual(await store.getBalance(orgId), { available: 200, reserved: 0, spent: 500, granted: 700 }, orgId);
    }
  });

  it("a gateway whose pool is too small for its lanes runs fewer (pool_size − 2) and says so at start", async () => {
    const lines: Array<Record<string, unknown>> = [];
    const logger = pino({ level: "info" }, { write: (text: string) => void lines.push(JSON.parse(text)) });
    const gw = await startGateway({
      env: { TDS_DATABASE_URL: `${db.url}?pool_size=4`, TDS_BOOKKEEPING_LANES: "5" },
      loggerInstance: logger,
    });
    try {
      assert.equal(gw.config.bookkeepingLanes, 5);
      const warning = lines.find((l) => typeof l.msg === "string" && l.msg.startsWith("TDS_BOOKKEEPING_LANES"));
      assert.equal(warning?.level, 40, JSON.stringify(lines.map((l) => l.msg)));
      assert.match(String(warning?.msg), /is 5 but the PostgreSQL pool_size 4 .*: 2 run; raise pool_size to 7/);
    } finally {
      await gw.close();
    }
  });
});
