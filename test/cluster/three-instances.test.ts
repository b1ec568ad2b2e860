import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import { openStore } from "../../src/store/open-store.ts";
import type { Store } from "../../src/store/store.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { sampleRequest, TICKET_HISTORY } from "../support/gateway-harness.ts";
import { type GatewayProcess, startGatewayProcess } from "../support/gateway-process.ts";
import { createTestDatabase } from "../support/postgres-db.ts";

const REDIS_URL = process.env.TDS_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";
const LIMIT_PER_MINUTE = 20;
const RESERVATION_MICROUSD = 1000; // 1000 reserve tokens × 1 USD per million
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
  return { store, db, gateways, orgId: org.id, key: key.raw };
}

async function stopCluster(c: Cluster | undefined) {
  if (!c) return;
  await Promise.all(c.gateways.map((g) => g.stop()));
  await c.store.close();
  await c.db.drop();
}

/** 60 requests at once, spread round-robin over the three gateways. */
async function burst(c: Cluster, body: unknown): Promise<number[]> {
  return Promise.all(
    Array.from({ length: 3 * LIMIT_PER_MINUTE }, async (_, i) => {
      const res = await fetch(`${c.gateways[i % 3]!.url}/v1/systemone`, {
        method: "POST",
        headers: { authorization: `Bearer ${c.key}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      await res.arrayBuffer();
      return res.status;
    }),
  );
}

const count = (statuses: number[], s: number) => statuses.filter((x) => x === s).length;

describe("three gateway processes on PostgreSQL + Redis share one truth", () => {
  let fake: FakeModelServer;
  let paid: Cluster | undefined;
  let preview: Cluster | undefined;

  before(async () => {
    fake = await startFakeModelServer();
  });
  after(async () => {
    await stopCluster(paid);
    await stopCluster(preview);
    await fake.close();
  });

  test("paid: 3× the rate limit and 5× the credits at once — never more than either; the books balance", async () => {
    paid = await startCluster(fake, {
      TDS_SERVICE_MODE: "paid",
      TDS_PRICE_PER_MILLION_INPUT_USD: "1",
      TDS_RESERVE_TOKENS: "1000",
    });
    await paid.store.grantCredits({ orgId: paid.orgId, amountMicrousd: CREDIT_FOR * RESERVATION_MICROUSD, nowMs: Date.now() });
    // A slow model: every reservation is attempted before any is settled.
    // Its token bound is over reserve_tokens (TICKET_HISTORY): each reservation is the cap, RESERVATION_MICROUSD.
    const statuses = await burst(
      paid,
      sampleRequest({ state: { fake_behavior: "delay:1500", tag: randomBytes(4).toString("hex"), history: TICKET_HISTORY } }),
    );
    assert.equal(count(statuses, 200), CREDIT_FOR, JSON.stringify(statuses));
    assert.equal(count(statuses, 402), LIMIT_PER_MINUTE - CREDIT_FOR, "the rest of the rate limit found no credit");
    assert.equal(count(statuses, 429), 2 * LIMIT_PER_MINUTE, "exactly the limit passed the shared rate limiter");

    const usage = (await paid.store.listUsage(paid.orgId, { limit: 200 })).records;
    assert.equal(usage.length, CREDIT_FOR);
    const charged = usage.reduce((sum, r) => sum + r.costMicrousd, 0);
    const balance = await paid.store.getBalance(paid.orgId);
    assert.deepEqual(balance, {
      available: CREDIT_FOR * RESERVATION_MICROUSD - charged,
      reserved: 0,
      spent: charged,
      granted: CREDIT_FOR * RESERVATION_MICROUSD,
    });
    const ledger = await paid.store.listLedger(paid.orgId);
    assert.equal(
      ledger.reduce((s, e) => s + e.availableDelta, 0),
      balance.available,
    );
    assert.equal(
      ledger.reduce((s, e) => s + e.spentDelta, 0),
      balance.spent,
    );

    const client = new pg.Client({ connectionString: paid.db.url });
    await client.connect();
    const { rows } = await client.query<{ status: string; n: string }>("SELECT status, count(*) AS n FROM reservations GROUP BY status");
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
