import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import type { ModelService } from "../../src/models/model-service.ts";
import { openSystemOneHttpService } from "../../src/models/systemone-http/systemone-http-service.ts";
import type { Store } from "../../src/store/store.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { allUsage, assertLedgerMatches, eventually } from "../support/books.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { createTestDatabase } from "../support/postgres-db.ts";

const PAID = {
  TDS_SERVICE_MODE: "paid",
  TDS_PRICE_PER_MILLION_INPUT_USD: "1",
  TDS_RESERVATION_TTL_SECONDS: "60",
  TDS_MODEL_TIMEOUT_MS: "5000",
};
const GRANT = 50_000;

async function withClient<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

/** Books and reservations after the sweep: nothing pending, no money lost or charged twice. */
async function assertBooks(store: Store, orgId: string, db: string) {
  const balance = await assertLedgerMatches(store, orgId);
  assert.equal(balance.reserved, 0, "no reservation left pending after the sweep");
  const settled = await withClient(
    db,
    async (c) =>
      (await c.query<{ s: string | null }>("SELECT sum(cost_microusd) AS s FROM usage_records WHERE reservation_status = 'settled'"))
        .rows[0]!.s,
  );
  assert.equal(balance.spent, Number(settled ?? 0), "spent equals the sum of settled costs");
  return balance;
}

describe("PostgreSQL backends killed around settlement", () => {
  let fake: FakeModelServer;
  let upstream: ModelService;
  before(async () => {
    fake = await startFakeModelServer();
    upstream = openSystemOneHttpService({ baseUrl: fake.url });
  });
  after(async () => {
    await upstream.close();
    await fake.close();
  });

  async function gatewayWith(decide: ModelService["decide"], clock: FixedClock) {
    const db = await createTestDatabase("tds_fault");
    const service: ModelService = { listModels: (o) => upstream.listModels(o), decide, close: async () => {} };
    const gw = await startGateway({ clock, modelService: service, env: { ...PAID, TDS_DATABASE_URL: db.url } });
    await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: GRANT, nowMs: clock.nowMs() });
    return { gw, db };
  }

  /** Past the reservation TTL, swept until no request is in flight (a completion running in the background is waited for). */
  async function finish(gw: Gateway, db: { url: string; drop(): Promise<void> }, clock: FixedClock) {
    clock.advance(61_000);
    await eventually("every accepted request completed", async () => {
      await gw.app.sweepBooks();
      return (await allUsage(gw.store, gw.orgId)).every((r) => r.outcome !== "in_flight");
    });
    const balance = await assertBooks(gw.store, gw.orgId, db.url);
    return balance;
  }

  test("every store connection killed between reservation and settlement: a documented status, no lost or double charge", async () => {
    const clock = new FixedClock(Date.now());
    let dbName = "";
    const { gw, db } = await gatewayWith(async (call, o) => {
      await withClient(process.env.TDS_TEST_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/test", (c) =>
        c.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", [dbName]),
      );
      return upstream.decide(call, o);
    }, clock);
    dbName = new URL(db.url).pathname.slice(1);
    try {
      const statuses: number[] = [];
      for (let i = 0; i < 3; i++) {
        const res = await gw.decide(sampleRequest({ state: { i } }));
        await res.text();
        statuses.push(res.status);
        assert.ok(res.status === 200 || res.status === 503, `status ${res.status}`);
      }
      const balance = await finish(gw, db, clock);
      const records = await allUsage(gw.store, gw.orgId);
      const succeeded = records.filter((r) => r.outcome === "succeeded");
      assert.equal(succeeded.length, statuses.filter((s) => s === 200).length, "one succeeded record per answered request");
      assert.ok(records.length <= statuses.length, "at most one record per request");
      assert.equal(
        balance.spent,
        succeeded.reduce((s, r) => s + r.costMicrousd, 0),
        "charged exactly what was answered",
      );
    } finally {
      await gw.close();
      await db.drop();
    }
  });

  test("the backend killed in the middle of the completion transaction: 503, rolled back, completed again with nothing charged", async () => {
    const clock = new FixedClock(Date.now());
    let dbUrl = "";
    let orgId = "";
    let killed = 0;
    let killer: Promise<void> = Promise.resolve();
    const { gw, db } = await gatewayWith(async (call, o) => {
      const answer = await upstream.decide(call, o);
      // Hold the organization's balance row so the settlement blocks inside its transaction, then kill it there.
      const locker = new pg.Client({ connectionString: dbUrl });
      await locker.connect();
      await locker.query("BEGIN");
      await locker.query("SELECT * FROM org_balances WHERE org_id = $1 FOR UPDATE", [orgId]);
      killer = (async () => {
        const dbName = new URL(dbUrl).pathname.slice(1);
        for (let i = 0; i < 1500 && killed === 0; i++) {
          const { rows } = await locker.query<{ pid: number }>(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
            [dbName],
          );
          for (const r of rows) {
            await locker.query("SELECT pg_terminate_backend($1)", [r.pid]);
            killed++;
          }
          if (killed === 0) await new Promise((r) => setTimeout(r, 20));
        }
        await locker.query("ROLLBACK");
        await locker.end();
      })();
      return answer;
    }, clock);
    dbUrl = db.url;
    orgId = gw.orgId;
    try {
      const res = await gw.decide(sampleRequest());
      const text = await res.text();
      await killer;
      assert.equal(killed, 1, "the settlement was caught waiting inside its transaction and killed");
      assert.equal(res.status, 503, text);
      assert.match(JSON.parse(text).detail, /Storage is temporarily unavailable/);
      const requestId = res.headers.get("x-service-request-id")!;
      // The completion was rolled back; a second one (nothing charged) runs after the answer.
      await eventually("completed in the background", async () => (await gw.store.getUsage(gw.orgId, requestId))?.outcome !== "in_flight");
      const record = await gw.store.getUsage(gw.orgId, requestId);
      assert.deepEqual([record?.outcome, record?.httpStatus, record?.costMicrousd], ["gateway_error", 503, 0]);
      const balance = await finish(gw, db, clock);
      assert.deepEqual(balance, { available: GRANT, reserved: 0, spent: 0, granted: GRANT });
      assert.equal((await gw.store.getReservation(requestId))?.status, "released");
      assert.equal((await gw.decide(sampleRequest())).status, 200, "the pool recovers without a restart");
    } finally {
      await gw.close();
      await db.drop();
    }
  });
});
