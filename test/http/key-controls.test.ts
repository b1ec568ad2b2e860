/**
 * Each API key's own limits, through a real listening gateway: a key expiring while in use (401 from then on, the
 * request in flight finished), a key limited to one model (403 for another, nothing recorded, also for batches), its
 * own per-minute limit beside an unlimited key of the same organization (429 with Retry-After, the organization's
 * count untouched), its budget under concurrency on SQLite and on PostgreSQL (k of n paid requests, never over the
 * budget; a failure releases its reservation there too; batch requests count), rotation (the old key refused once its
 * grace ends; the old and new keys share one budget and one per-minute count) and last_used_at in the admin key list
 * after a flush.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { formatUsd } from "../../src/domain/money.ts";
import { utcPeriod } from "../../src/domain/utc-day.ts";
import { batchLine, ndjson, submitBatch } from "../batches/batch-support.ts";
import { startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { allUsage, assertLedgerMatches, eventually } from "../support/books.ts";
import { errorBody, json } from "../support/contract-check.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { type Gateway, type GatewayOptions, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { startModelGate } from "../support/model-gate.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { byteBound } from "../support/token-bound.ts";

const ADMIN_TOKEN = "adm-keyctl-7Hq2Wm9Zr4Lx8Nc3Vb6Ts1Pd";
/** 1 USD per million input tokens: a paid request reserves its token bound in microUSD. */
const PAID = { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1" };
const T0 = Date.UTC(2026, 10, 28, 10);

interface KeySettingsJson {
  name?: string;
  expires_at?: string | null;
  models?: string[] | null;
  requests_per_minute?: number | null;
  budget?: { usd: string; period: "day" | "month" } | null;
}

async function admin(gw: Gateway, method: string, path: string, body?: unknown): Promise<{ status: number; json: any }> {
  const res = await fetch(`${gw.url}/admin/v1${path}`, {
    method,
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  return { status: res.status, json: text === "" ? null : JSON.parse(text) };
}

/** A key of the gateway's organization with these settings, made through the admin API. */
async function createKey(gw: Gateway, settings: KeySettingsJson): Promise<{ id: string; key: string }> {
  const created = await admin(gw, "POST", `/organizations/${gw.orgId}/keys`, settings);
  assert.equal(created.status, 201, JSON.stringify(created.json));
  return { id: created.json.id, key: created.json.key };
}

async function keyList(gw: Gateway): Promise<Record<string, any>[]> {
  const listed = await admin(gw, "GET", `/organizations/${gw.orgId}/keys`);
  assert.equal(listed.status, 200, JSON.stringify(listed.json));
  return listed.json.data;
}

function decideAs(gw: Gateway, key: string, body: unknown = sampleRequest()): Promise<Response> {
  return fetch(`${gw.url}/v1/systemone`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

async function statusOf(res: Response): Promise<number> {
  await res.arrayBuffer();
  return res.status;
}

/** The request was refused before it was accepted: no usage record has its request id. */
async function assertNotRecorded(gw: Gateway, res: Response): Promise<void> {
  const requestId = res.headers.get("x-service-request-id");
  assert.ok(requestId);
  assert.equal(await gw.store.getUsage(gw.orgId, requestId), null, `no usage record for ${requestId}`);
}

async function rejections(gw: Gateway, reason: string): Promise<number> {
  const text = await (await fetch(`${gw.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`tds_admission_rejections_total{reason="${reason}"}`));
  return line ? Number(line.split(" ").pop()) : 0;
}

/** The batch's results once it has ended, read through the store (its key may be refused by then). */
async function storedResults(gw: Gateway, batchId: string): Promise<{ status: number; body: any }[]> {
  const until = Date.now() + 60_000;
  for (;;) {
    const batch = await gw.store.batches.getBatch(gw.orgId, batchId);
    if (batch && ["completed", "cancelled", "expired"].includes(batch.status)) break;
    if (Date.now() > until) assert.fail(`batch ${batchId} did not end: ${JSON.stringify(batch)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const results = await gw.store.batches.results(gw.orgId, batchId, { afterPosition: -1, limit: 100 });
  return results!.map((r) => ({ status: r.status, body: JSON.parse(r.body) }));
}

async function submitted(gw: Gateway, key: string, lines: unknown[], model?: string): Promise<string> {
  const res = await submitBatch({ url: gw.url, key }, ndjson(lines), model ? { model } : {});
  const text = await res.text();
  assert.equal(res.status, 202, text);
  return JSON.parse(text).id;
}

async function withGateway(options: GatewayOptions, run: (gw: Gateway) => Promise<void>): Promise<void> {
  const gw = await startGateway({ ...options, env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN, ...options.env } });
  try {
    await run(gw);
  } finally {
    await gw.close();
  }
}

describe("per-key controls", () => {
  test("a key expiring while in use: 200 before, the request in flight finishes, 401 expired_api_key after, nothing recorded", async () => {
    const clock = new FixedClock(T0);
    await withGateway({ clock }, async (gw) => {
      const expiresAt = T0 + 60_000;
      const { key } = await createKey(gw, { name: "ci", expires_at: new Date(expiresAt).toISOString() });
      assert.equal(await statusOf(await decideAs(gw, key)), 200);
      clock.set(expiresAt - 1);
      assert.equal(await statusOf(await decideAs(gw, key)), 200, "1 ms before its expiry");

      // A request accepted before the expiry is answered after it.
      const slow = decideAs(gw, key, sampleRequest({ state: { ticket: "slow", fake_behavior: "delay:300" } }));
      await eventually(
        "the slow request in flight",
        async () => (await allUsage(gw.store, gw.orgId)).some((r) => r.outcome === "in_flight"),
        30_000,
      );
      clock.set(expiresAt);
      assert.equal(await statusOf(await slow), 200);

      const before = (await allUsage(gw.store, gw.orgId)).length;
      const refused = await decideAs(gw, key);
      const { detail } = await errorBody(refused, 401);
      assert.equal(refused.headers.get("www-authenticate"), "Bearer");
      assert.match(detail, /expired/);
      assert.ok(detail.includes(new Date(expiresAt).toISOString()), detail);
      await assertNotRecorded(gw, refused);
      assert.equal((await allUsage(gw.store, gw.orgId)).length, before, "nothing recorded for the refused request");
      const models = await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
      await errorBody(models, 401);
      assert.equal(await statusOf(await gw.decide(sampleRequest())), 200, "the organization's other key works");
    });
  });

  test("an expired key refuses the batch requests that had not run, as the API would", async () => {
    const clock = new FixedClock(T0);
    await withGateway({ clock, runBatches: false }, async (gw) => {
      const expiresAt = T0 + 60_000;
      const { key } = await createKey(gw, { expires_at: new Date(expiresAt).toISOString() });
      const id = await submitted(gw, key, [batchLine(0), batchLine(1)]);
      clock.set(expiresAt);
      gw.app.batchRunner.start();
      const results = await storedResults(gw, id);
      assert.deepEqual(
        results.map((r) => r.status),
        [401, 401],
      );
      assert.match(results[0]!.body.detail, /expired/);
      assert.equal(gw.fake!.calls.decide, 0);
    });
  });

  test("a key limited to one model: 200 for it (named or the default), 403 naming the model for another, nothing recorded or run", async () => {
    await withGateway({}, async (gw) => {
      const { key } = await createKey(gw, { models: ["fake-small"] });
      assert.equal(await statusOf(await decideAs(gw, key, sampleRequest({ model: "fake-small" }))), 200);
      assert.equal(await statusOf(await decideAs(gw, key)), 200, "the default model, fake-small");
      const calls = gw.fake!.calls.decide;
      const before = (await allUsage(gw.store, gw.orgId)).length;

      const refused = await decideAs(gw, key, sampleRequest({ model: "fake-large" }));
      const { detail } = await errorBody(refused, 403);
      assert.match(detail, /may not use the model "fake-large"/);
      assert.match(detail, /"fake-small"/);
      await assertNotRecorded(gw, refused);
      assert.equal((await allUsage(gw.store, gw.orgId)).length, before, "nothing recorded");
      assert.equal(gw.fake!.calls.decide, calls, "the model was not called");
      assert.equal(await rejections(gw, "model_not_allowed"), 1);
      assert.equal(await statusOf(await gw.decide(sampleRequest({ model: "fake-large" }))), 200, "a key without a list may");

      // Batches: ?model= is refused at submission; a line naming another model gets the API's 403 as its result.
      const batch = await submitBatch({ url: gw.url, key }, ndjson([batchLine(0)]), { model: "fake-large" });
      const batchRefusal = await errorBody(batch, 403);
      assert.match(batchRefusal.detail, /"fake-large"/);
      const id = await submitted(gw, key, [{ ...batchLine(0), model: "fake-large" }, batchLine(1)]);
      const results = await storedResults(gw, id);
      assert.deepEqual(
        results.map((r) => r.status),
        [403, 200],
      );
      assert.match(results[0]!.body.detail, /"fake-large"/);
    });
  });

  test("batches with a model service that lists the models: ?model= an alias is checked as the model it names, as decisions are", async () => {
    await withGateway({ env: { TDS_MODEL_ALIASES: "big=fake-large" } }, async (gw) => {
      const { key } = await createKey(gw, { models: ["fake-large"] });
      assert.equal(await statusOf(await decideAs(gw, key, sampleRequest({ model: "big" }))), 200, "a decision for the alias");
      const id = await submitted(gw, key, [batchLine(0)], "big");
      assert.deepEqual(
        (await storedResults(gw, id)).map((r) => r.status),
        [200],
      );
      const other = await errorBody(await submitBatch({ url: gw.url, key }, ndjson([batchLine(0)]), { model: "fake-small" }), 403);
      assert.match(other.detail, /"fake-small"/);
      const unknown = await errorBody(await submitBatch({ url: gw.url, key }, ndjson([batchLine(0)]), { model: "nope" }), 422);
      assert.match(unknown.detail, /nope/);
    });
  });

  test("batches when the models cannot be listed: ?model= is checked as given", async () => {
    await withGateway({ fake: false, runBatches: false, env: { TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9" } }, async (gw) => {
      const { key } = await createKey(gw, { models: ["fake-large"] });
      await submitted(gw, key, [batchLine(0)], "fake-large");
      const other = await errorBody(await submitBatch({ url: gw.url, key }, ndjson([batchLine(0)]), { model: "big" }), 403);
      assert.match(other.detail, /"big"/);
    });
  });

  test("a key's per-minute limit beside an unlimited key of its organization: 429 with Retry-After, the other key unaffected", async () => {
    await withGateway({ env: { TDS_REQUESTS_PER_MINUTE: "6" } }, async (gw) => {
      const limited = await createKey(gw, { name: "script", requests_per_minute: 3 });
      for (let i = 0; i < 3; i++) assert.equal(await statusOf(await decideAs(gw, limited.key)), 200, `request ${i + 1}`);
      for (let i = 0; i < 5; i++) {
        const res = await decideAs(gw, limited.key);
        const { detail } = await errorBody(res, 429);
        assert.match(detail, /this API key/);
        assert.match(detail, /requests_per_minute = 3/);
        const retryAfter = Number(res.headers.get("retry-after"));
        assert.ok(Number.isInteger(retryAfter) && retryAfter >= 1 && retryAfter <= 60, String(retryAfter));
        await assertNotRecorded(gw, res);
      }
      // The key's refused requests did not count in the organization's 6: the other key has the 3 left.
      for (let i = 0; i < 3; i++) assert.equal(await statusOf(await gw.decide(sampleRequest())), 200, `other key, request ${i + 1}`);
      const orgLimited = await gw.decide(sampleRequest());
      const { detail } = await errorBody(orgLimited, 429);
      assert.match(detail, /of the organization/);
      assert.equal(await rejections(gw, "key_rate_limited"), 5);
      // Reads count only against the organization's read limit.
      const usage = await fetch(`${gw.url}/v1/usage`, { headers: { authorization: `Bearer ${limited.key}` } });
      assert.equal(await statusOf(usage), 200);
    });
  });

  for (const dialect of ["sqlite", "postgres"] as const) {
    test(`a key budget under concurrency on ${dialect}: k of n paid requests succeed, the spend never over the budget`, async () => {
      const k = 6;
      const n = 4 * k;
      const db = dialect === "postgres" ? await createTestDatabase("tds_key_budget") : null;
      const fake = await startFakeModelServer();
      const gate = await startModelGate(fake.url);
      try {
        const env = { ...PAID, TDS_MODEL_SERVICE_URL: gate.url, ...(db ? { TDS_DATABASE_URL: db.url } : {}) };
        await withGateway({ fake: false, env }, async (gw) => {
          const body = sampleRequest();
          const bound = byteBound(body);
          const budget = k * bound;
          await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 100 * budget, nowMs: Date.now() });
          const { id: keyId, key } = await createKey(gw, { budget: { usd: formatUsd(budget), period: "month" } });

          // Every model call waits at the gate until each request is refused or waiting there.
          let answered = 0;
          let pending: Promise<Response>[] = [];
          await new Promise<void>((allDecided) => {
            const checkDecided = () => {
              if (answered + gate.held() === n) allDecided();
            };
            gate.onHold(checkDecided);
            pending = Array.from({ length: n }, () =>
              decideAs(gw, key, body).finally(() => {
                answered++;
                checkDecided();
              }),
            );
          });
          assert.equal(gate.held(), k, "exactly k admitted");
          const period = utcPeriod("month", Date.now());
          assert.deepEqual(await gw.store.keySpend(keyId, period), { reservedMicrousd: budget, spentMicrousd: 0 });
          gate.open();
          const responses = await Promise.all(pending);
          const ok = responses.filter((r) => r.status === 200);
          const refused = responses.filter((r) => r.status === 402);
          assert.equal(ok.length, k);
          assert.equal(refused.length, n - k);
          const { detail } = await errorBody(refused[0]!, 402);
          assert.match(detail, /API key's budget/);
          assert.ok(detail.includes(`${formatUsd(budget)} USD per UTC month`), detail);
          assert.ok(detail.includes(`${formatUsd(bound)} USD for at most ${bound} input`), detail);
          await assertNotRecorded(gw, refused[1]!);

          const costs = await Promise.all(ok.map(async (r) => (await json(r)).usage.cost_microusd as number));
          const spent = costs.reduce((a, b) => a + b, 0);
          assert.ok(spent > 0 && spent <= budget);
          assert.deepEqual(await gw.store.keySpend(keyId, period), { reservedMicrousd: 0, spentMicrousd: spent });
          const balance = await assertLedgerMatches(gw.store, gw.orgId);
          assert.deepEqual([balance.spent, balance.reserved], [spent, 0], "the organization was charged exactly the key's spend");
          assert.equal(await rejections(gw, "key_budget_exhausted"), n - k);

          // What is left of the budget decides the next request; the organization's other key is not limited by it.
          const next = await decideAs(gw, key, body);
          assert.equal(await statusOf(next), budget - spent >= bound ? 200 : 402);
          assert.equal(await statusOf(await gw.decide(body)), 200);
          const after = await gw.store.keySpend(keyId, period);
          assert.ok(after.spentMicrousd <= budget && after.reservedMicrousd === 0, JSON.stringify(after));
        });
      } finally {
        await gate.close();
        await fake.close();
        await db?.drop();
      }
    });
  }

  test("a paid request of a key with a budget that fails after admission releases its reservation there too", async () => {
    await withGateway({ env: PAID }, async (gw) => {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000_000, nowMs: Date.now() });
      const { id: keyId, key } = await createKey(gw, { budget: { usd: "1", period: "day" } });
      const failed = await decideAs(gw, key, sampleRequest({ state: { ticket: "x", fake_behavior: "status:500" } }));
      await errorBody(failed, 502);
      const period = utcPeriod("day", Date.now());
      assert.deepEqual(await gw.store.keySpend(keyId, period), { reservedMicrousd: 0, spentMicrousd: 0 });
      const ok = await json(await decideAs(gw, key));
      assert.deepEqual(await gw.store.keySpend(keyId, period), { reservedMicrousd: 0, spentMicrousd: ok.usage.cost_microusd });
    });
  });

  test("a key budget applies to batch requests: refused with 402, the organization's credits untouched", async () => {
    await withGateway({ env: PAID }, async (gw) => {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000_000, nowMs: Date.now() });
      const { key } = await createKey(gw, { budget: { usd: "0", period: "day" } });
      const { detail } = await errorBody(await decideAs(gw, key), 402);
      assert.match(detail, /API key's budget/);
      const id = await submitted(gw, key, [batchLine(0), batchLine(1)]);
      const results = await storedResults(gw, id);
      assert.deepEqual(
        results.map((r) => r.status),
        [402, 402],
      );
      assert.match(results[0]!.body.detail, /API key's budget/);
      const balance = await assertLedgerMatches(gw.store, gw.orgId);
      assert.deepEqual([balance.spent, balance.reserved], [0, 0]);
    });
  });

  test("rotation: the new key has the old one's settings; the old key works during the grace and is refused after it", async () => {
    const clock = new FixedClock(T0);
    await withGateway({ clock }, async (gw) => {
      const old = await createKey(gw, { name: "backend", models: ["fake-small"] });
      const rotated = await admin(gw, "POST", `/keys/${old.id}/rotate`, { grace_seconds: 60 });
      assert.equal(rotated.status, 201, JSON.stringify(rotated.json));
      const fresh = { id: rotated.json.id as string, key: rotated.json.key as string };
      assert.notEqual(fresh.id, old.id);
      assert.equal(rotated.json.replaces, old.id);
      assert.equal(rotated.json.old_key_retires_at, new Date(T0 + 60_000).toISOString());
      assert.deepEqual(rotated.json.models, ["fake-small"]);

      assert.equal(await statusOf(await decideAs(gw, fresh.key)), 200);
      await errorBody(await decideAs(gw, fresh.key, sampleRequest({ model: "fake-large" })), 403);
      clock.set(T0 + 59_999);
      assert.equal(await statusOf(await decideAs(gw, old.key)), 200, "the old key during its grace");

      clock.set(T0 + 60_000);
      const refused = await decideAs(gw, old.key);
      const { detail } = await errorBody(refused, 401);
      assert.match(detail, /rotated/);
      assert.ok(detail.includes(fresh.id), detail);
      await assertNotRecorded(gw, refused);
      assert.equal(await statusOf(await decideAs(gw, fresh.key)), 200, "the new key after the grace");
      const listed = await keyList(gw);
      const oldListed = listed.find((k) => k.id === old.id)!;
      assert.equal(oldListed.replaced_by, fresh.id);
      assert.equal(oldListed.retires_at, new Date(T0 + 60_000).toISOString());
    });
  });

  test("rotation: the new key spends the old key's budget, not a fresh one; both keys draw on what is left during the grace", async () => {
    const clock = new FixedClock(T0);
    await withGateway({ clock, env: PAID }, async (gw) => {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000_000, nowMs: T0 });
      const spending = (tokens: number) => sampleRequest({ state: { ticket: "x", fake_behavior: `tokens:${tokens}:0` } });
      const bound = byteBound(spending(1));
      // The old key spends all but bound - 1 of its budget: no request of either key fits in what is left.
      const cost = bound - 10;
      const budget = cost + bound - 1;
      const old = await createKey(gw, { name: "backend", budget: { usd: formatUsd(budget), period: "day" } });
      const first = await json(await decideAs(gw, old.key, spending(cost)));
      assert.equal(first.usage.cost_microusd, cost);
      const period = utcPeriod("day", T0);
      assert.deepEqual(await gw.store.keySpend(old.id, period), { reservedMicrousd: 0, spentMicrousd: cost });

      const rotated = await admin(gw, "POST", `/keys/${old.id}/rotate`, { grace_seconds: 60 });
      assert.equal(rotated.status, 201, JSON.stringify(rotated.json));
      const fresh = { id: rotated.json.id as string, key: rotated.json.key as string };
      assert.deepEqual(rotated.json.budget, { usd: formatUsd(budget), period: "day" });
      for (const [who, key] of [
        ["the new key", fresh.key],
        ["the old key in its grace", old.key],
      ] as const) {
        const refused = await decideAs(gw, key, spending(1));
        const { detail } = await errorBody(refused, 402);
        assert.match(detail, /API key's budget/, who);
        assert.ok(detail.includes(`has ${formatUsd(bound - 1)} USD left`), `${who}: ${detail}`);
        await assertNotRecorded(gw, refused);
      }
      assert.deepEqual(await gw.store.keySpend(old.id, period), { reservedMicrousd: 0, spentMicrousd: cost });
      assert.deepEqual(await gw.store.keySpend(fresh.id, period), { reservedMicrousd: 0, spentMicrousd: 0 }, "no budget of its own");

      // A second rotation keeps the one budget: the key rotated from the new one spends it too.
      const again = await admin(gw, "POST", `/keys/${fresh.id}/rotate`, { grace_seconds: 60 });
      assert.equal(again.status, 201, JSON.stringify(again.json));
      await errorBody(await decideAs(gw, again.json.key, spending(1)), 402);

      // The next UTC day starts the lineage's budget again, for the newest key as for the others.
      clock.set(T0 + 86_400_000);
      assert.equal(await statusOf(await decideAs(gw, again.json.key, spending(cost))), 200);
      const nextPeriod = utcPeriod("day", T0 + 86_400_000);
      assert.deepEqual(await gw.store.keySpend(old.id, nextPeriod), { reservedMicrousd: 0, spentMicrousd: cost });
      const balance = await assertLedgerMatches(gw.store, gw.orgId);
      assert.deepEqual([balance.spent, balance.reserved], [2 * cost, 0]);
    });
  });

  test("rotation: the old key and the new one count in one per-minute limit during the grace", async () => {
    const clock = new FixedClock(T0);
    await withGateway({ clock, env: { TDS_REQUESTS_PER_MINUTE: "100" } }, async (gw) => {
      const old = await createKey(gw, { name: "script", requests_per_minute: 4 });
      for (let i = 0; i < 2; i++) assert.equal(await statusOf(await decideAs(gw, old.key)), 200, `old key, request ${i + 1}`);
      const rotated = await admin(gw, "POST", `/keys/${old.id}/rotate`, { grace_seconds: 600 });
      assert.equal(rotated.status, 201, JSON.stringify(rotated.json));
      const fresh = rotated.json.key as string;
      assert.equal(await statusOf(await decideAs(gw, fresh)), 200, "new key, the 3rd request of the minute");
      assert.equal(await statusOf(await decideAs(gw, old.key)), 200, "old key, the 4th");
      for (const key of [fresh, old.key]) {
        const res = await decideAs(gw, key);
        const { detail } = await errorBody(res, 429);
        assert.match(detail, /requests_per_minute = 4/);
        await assertNotRecorded(gw, res);
      }
      assert.equal(await rejections(gw, "key_rate_limited"), 2);
      assert.equal(await statusOf(await gw.decide(sampleRequest())), 200, "another key of the organization is unaffected");
      // A minute later, the lineage has its 4 again.
      clock.advance(60_000);
      for (let i = 0; i < 4; i++) assert.equal(await statusOf(await decideAs(gw, i % 2 ? old.key : fresh)), 200, `request ${i + 1}`);
      await errorBody(await decideAs(gw, fresh), 429);
    });
  });

  test("last_used_at: none before the instance writes it, then the last request's time, with no write per request", async () => {
    const clock = new FixedClock(T0);
    await withGateway({ clock }, async (gw) => {
      const used = await createKey(gw, { name: "used" });
      const idle = await createKey(gw, { name: "idle" });
      assert.equal(await statusOf(await decideAs(gw, used.key)), 200);
      clock.advance(5_000);
      assert.equal(await statusOf(await decideAs(gw, used.key)), 200);
      const lastUse = (list: Record<string, any>[], id: string) => list.find((k) => k.id === id)?.last_used_at;
      assert.equal(lastUse(await keyList(gw), used.id), null, "not written per request");

      await gw.app.flushKeyUse();
      let listed = await keyList(gw);
      assert.equal(lastUse(listed, used.id), new Date(T0 + 5_000).toISOString());
      assert.equal(lastUse(listed, idle.id), null);

      clock.advance(60_000);
      const refused = await decideAs(gw, used.key, sampleRequest({ model: "no-such-model" }));
      await errorBody(refused, 422);
      await gw.app.flushKeyUse();
      listed = await keyList(gw);
      assert.equal(lastUse(listed, used.id), new Date(T0 + 65_000).toISOString(), "a refused request is a use too");
    });
  });
});
