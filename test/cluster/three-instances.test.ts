import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import { openStore } from "../../src/store/open-store.ts";
import type { Store } from "../../src/store/store.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { sampleRequest, TICKET_HISTORY } from "../support/gateway-harness.ts";
import { type GatewayProcess, startGatewayProcess, waitUntilReady } from "../support/gateway-process.ts";
import { type ModelGate, startModelGate } from "../support/model-gate.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { byteBound } from "../support/token-bound.ts";

const REDIS_URL = process.env.TDS_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";
const LIMIT_PER_MINUTE = 20;
const CREDIT_FOR = 12; // reservations the credits cover; 60 requests = 3 × the rate limit = 5 × the credits

interface Cluster {
  store: Store;
  db: { url: string; name: string; drop(): Promise<void> };
  gateways: GatewayProcess[];
  orgId: string;
  key: string;
}

async function startCluster(fake: FakeModelServer, env: Record<string, string>): Promise<Cluster> {
  const db = await createTestDatabase("tds_cluster");
  const store = await openStore(db.url);
  const org = await store.createOrganization({ id: newOrganizationId(), name: "busy-org", nowMs: Date.now() });
  const key = generateApiKey();
  await store.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: Date.now() });
  const common = {
    TDS_DATABASE_URL: db.url,
    // Rate-limit keys are per organization id, which is random: runs never collide in Redis.
    TDS_REDIS_URL: REDIS_URL,
    TDS_MODEL_SERVICE_URL: fake.url,
    TDS_REQUESTS_PER_MINUTE: String(LIMIT_PER_MINUTE),
    ...env,
  };
  const gateways = await Promise.all([0, 1, 2].map(() => startGatewayProcess(common)));
  await Promise.all(gateways.map((g) => waitUntilReady(g)));
  return { store, db, gateways, orgId: org.id, key: key.raw };
}

async function stopCluster(c: Cluster | undefined) {
  if (!c) return;
  await Promise.all(c.gateways.map((g) => g.stop()));
  await c.store.close();
  await c.db.drop();
}

/**
 * 60 requests at once, spread round-robin over the three gateways. With a `gate` in front of the model, its calls
 * are held until every request is either answered or waiting there: every admission is decided before any
 * settlement gives credit back, however slowly the machine runs.
 */
async function burst(c: Cluster, body: unknown, gate?: ModelGate): Promise<number[]> {
  const total = 3 * LIMIT_PER_MINUTE;
  let answered = 0;
  const openWhenDecided = () => {
    if (gate && answered + gate.held() === total) gate.open();
  };
  gate?.onHold(openWhenDecided);
  return Promise.all(
    Array.from({ length: total }, async (_, i) => {
      const res = await fetch(`${c.gateways[i % 3]!.url}/v1/systemone`, {
        method: "POST",
        headers: { authorization: `Bearer ${c.key}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      await res.arrayBuffer();
      if (res.status !== 200) {
        answered++;
        openWhenDecided();
      }
      return res.status;
    }),
  );
}

const count = (statuses: number[], s: number) => statuses.filter((x) => x === s).length;

/** How many times the cluster's rate limiters switched to their local fallback (tds_rate_limiter_fallback_events_total). */
async function fallbackEvents(c: Cluster): Promise<number> {
  const texts = await Promise.all(c.gateways.map(async (g) => (await fetch(`${g.url}/metrics`)).text()));
  return texts.reduce((sum, text) => sum + Number(/^tds_rate_limiter_fallback_events_total (\d+)$/m.exec(text)?.[1] ?? 0), 0);
}

describe("three gateway processes on PostgreSQL + Redis share one truth", () => {
  let fake: FakeModelServer;
  let paid: Cluster | undefined;
  let preview: Cluster | undefined;
  const gates: ModelGate[] = [];

  before(async () => {
    fake = await startFakeModelServer();
  });
  after(async () => {
    await stopCluster(paid);
    await stopCluster(preview);
    await Promise.all(gates.map((g) => g.close()));
    await fake.close();
  });

  test("paid: 3× the rate limit and 5× the credits at once — never more than either; the books balance", async (t) => {
    const gate = await startModelGate(fake.url);
    gates.push(gate);
    paid = await startCluster(fake, {
      TDS_SERVICE_MODE: "paid",
      TDS_PRICE_PER_MILLION_INPUT_USD: "1",
      TDS_MODEL_SERVICE_URL: gate.url,
    });
    const body = sampleRequest({ state: { tag: randomBytes(4).toString("hex"), history: TICKET_HISTORY } });
    // Each reservation is the request's token bound × 1 USD per million: its bound in microUSD.
    const reservation = byteBound(body);
    await paid.store.grantCredits({ orgId: paid.orgId, amountMicrousd: CREDIT_FOR * reservation, nowMs: Date.now() });
    const statuses = await burst(paid, body, gate);
    assert.equal(count(statuses, 200), CREDIT_FOR, JSON.stringify(statuses));
    // Exactly the limit passes the shared limiter while Redis answers every check within its command timeout (200 ms);
    // a check it does not answer in time (a loaded machine) is answered by the instance's own fallback limiter,
    // which limits each instance to the same per-minute limit: more may pass then, never more than each instance's.
    const fallbacks = await fallbackEvents(paid);
    const passed = 3 * LIMIT_PER_MINUTE - count(statuses, 429);
    t.diagnostic(`${passed} passed the rate limiter; ${fallbacks} switches to the local fallback`);
    if (fallbacks === 0) assert.equal(passed, LIMIT_PER_MINUTE, "exactly the limit passed the shared rate limiter");
    else assert.ok(passed >= LIMIT_PER_MINUTE && passed <= 3 * LIMIT_PER_MINUTE, `${passed} passed the rate limiters`);
    assert.equal(count(statuses, 402), passed - CREDIT_FOR, "the rest of what passed the rate limit found no credit");

    const usage = (await paid.store.listUsage(paid.orgId, { limit: 200 })).records;
    assert.equal(usage.length, CREDIT_FOR);
    const charged = usage.reduce((sum, r) => sum + r.costMicrousd, 0);
    const balance = await paid.store.getBalance(paid.orgId);
    assert.deepEqual(balance, {
      available: CREDIT_FOR * reservation - charged,
      reserved: 0,
      spent: charged,
      granted: CREDIT_FOR * reservation,
    });
    const ledger = await paid.store.listLedger(paid.orgId);
    assert.equal(
      ledger.reduce((s, e) => s + e.availableDelta, 0),
      balance.available + balance.reserved,
    );
    assert.equal(ledger.filter((e) => e.kind !== "grant").length, CREDIT_FOR, "one ledger entry per paid request");
    assert.equal(
      ledger.reduce((s, e) => s + e.spentDelta, 0),
      balance.spent,
    );

    const client = new pg.Client({ connectionString: paid.db.url });
    await client.connect();
    const { rows } = await client.query<{ status: string; n: string }>(
      "SELECT reservation_status AS status, count(*) AS n FROM usage_records WHERE reservation_status IS NOT NULL GROUP BY 1",
    );
    await client.end();
    assert.deepEqual(
      Object.fromEntries(rows.map((r) => [r.status, Number(r.n)])),
      { settled: CREDIT_FOR },
      "every reservation resolved exactly once",
    );
    for (const r of usage) assert.equal((await paid.store.getReservation(r.requestId))?.costMicrousd, r.costMicrousd);
  });

  test("preview: the day counters equal the number of accepted requests", async () => {
    preview = await startCluster(fake, {
      TDS_SERVICE_MODE: "preview",
      TDS_PREVIEW_REQUEST_LIMIT: String(CREDIT_FOR),
    });
    const statuses = await burst(preview, sampleRequest({ state: { tag: randomBytes(4).toString("hex") } }));
    assert.equal(count(statuses, 200), CREDIT_FOR);
    assert.equal(count(statuses, 429), 3 * LIMIT_PER_MINUTE - CREDIT_FOR);
    const day = new Date().toISOString().slice(0, 10);
    assert.deepEqual(await preview.store.previewUsage(preview.orgId, day), { org: CREDIT_FOR, global: CREDIT_FOR });
    assert.equal((await preview.store.listUsage(preview.orgId, { limit: 200 })).records.length, CREDIT_FOR);
  });
});
