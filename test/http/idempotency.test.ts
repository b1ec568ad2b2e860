import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { choice, noul, score, TypeSafeClient } from "@typesafe-ai/sdk";
import type { SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { errorBody } from "../support/contract-check.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { startLossyProxy } from "../support/lossy-proxy.ts";

const PAID = {
  TDS_SERVICE_MODE: "paid",
  TDS_PRICE_PER_MILLION_INPUT_USD: "1",
  TDS_REQUESTS_PER_MINUTE: "1000",
};

describe("Idempotency-Key", () => {
  test("the same key and body replays the stored response; charged and counted once", async () => {
    const gw = await startGateway({ env: PAID });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 100_000, nowMs: Date.now() });
      const headers = { "idempotency-key": "order-42-classify" };
      const first = await gw.decide(sampleRequest(), headers);
      const firstText = await first.text();
      assert.equal(first.status, 200);
      assert.equal(first.headers.get("idempotent-replayed"), null);
      const balanceAfterFirst = await gw.store.getBalance(gw.orgId);

      const second = await gw.decide(sampleRequest(), headers);
      assert.equal(second.status, 200);
      assert.equal(await second.text(), firstText, "byte-for-byte the stored body");
      assert.equal(second.headers.get("idempotent-replayed"), "true");
      const requestId = JSON.parse(firstText).request_id;
      assert.equal(second.headers.get("x-service-request-id"), requestId);
      assert.equal(second.headers.get("x-typesafe-request-id"), requestId);

      assert.deepEqual(await gw.store.getBalance(gw.orgId), balanceAfterFirst);
      assert.equal(gw.fake!.calls.decide, 1);
      assert.equal((await gw.store.listUsage(gw.orgId, { limit: 10 })).records.length, 1);

      const other = await gw.decide(sampleRequest({ state: "a different body" }), headers);
      assert.match((await errorBody(other, 422)).detail, /different request body/);

      const otherOrg = await gw.newOrg("other");
      await gw.store.grantCredits({ orgId: otherOrg.orgId, amountMicrousd: 100_000, nowMs: Date.now() });
      const scoped = await gw.decide(sampleRequest(), { ...headers, authorization: `Bearer ${otherOrg.key}` });
      assert.equal(scoped.status, 200);
      assert.equal(scoped.headers.get("idempotent-replayed"), null, "keys are per organization");
    } finally {
      await gw.close();
    }
  });

  test("the same key while the first is still running → 409 that says so; a failed first attempt can be retried", async () => {
    const gw = await startGateway({ env: { ...PAID, TDS_MODEL_TIMEOUT_MS: "2000" } });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 100_000, nowMs: Date.now() });
      const slow = sampleRequest({ state: { fake_behavior: "delay:800" } });
      const firstPromise = gw.decide(slow, { "idempotency-key": "k1" });
      await new Promise((r) => setTimeout(r, 200));
      const concurrent = await gw.decide(slow, { "idempotency-key": "k1" });
      const body = await errorBody(concurrent, 409);
      assert.match(body.detail, /still being processed/);
      assert.doesNotMatch(body.detail, /reservation expired/);
      assert.equal((await firstPromise).status, 200);

      const failing = sampleRequest({ state: { fake_behavior: "status:503" } });
      assert.equal((await gw.decide(failing, { "idempotency-key": "k2" })).status, 502);
      const retried = await gw.decide(failing, { "idempotency-key": "k2" });
      assert.equal(retried.status, 502, "the failed attempt released its key: the retry ran again instead of 409 or a replay");
      assert.equal(gw.fake!.calls.decide, 3);
    } finally {
      await gw.close();
    }
  });

  test("a response too large to keep (over 64 KiB) is not replayed: the retry gets 409 naming the request, and is not run again", async () => {
    // 32 questions of 255 options: a token bound of ~200,000 tokens, which reserve_tokens must cover to be run at all.
    const gw = await startGateway({ env: { ...PAID, TDS_RESERVE_TOKENS: "250000" }, fake: { maxInputTokens: 1_000_000 } });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000_000, nowMs: Date.now() });
      const options = Object.fromEntries(Array.from({ length: 255 }, (_, i) => [`option_number_${i}`, null]));
      const questions = Object.fromEntries(Array.from({ length: 32 }, (_, i) => [`q${i}`, { type: "choice", criteria: options }]));
      const big = { state: "large answers", questions };
      const key = { "idempotency-key": "big-1" };
      const first = await gw.decide(big, key);
      const text = await first.text();
      assert.equal(first.status, 200, text.slice(0, 300));
      assert.ok(Buffer.byteLength(text) > 65_536, `the response is ${Buffer.byteLength(text)} bytes`);
      const firstId = first.headers.get("x-service-request-id")!;
      const retry = await gw.decide(big, key);
      const body = await errorBody(retry, 409);
      assert.match(body.detail, new RegExp(`already succeeded \\(request_id ${firstId}\\).*too large to keep`));
      assert.equal(gw.fake!.calls.decide, 1, "not run again");
      const balance = await gw.store.getBalance(gw.orgId);
      assert.equal(balance.spent, JSON.parse(text).usage.cost_microusd, "charged once");
      // A small response under the same rules is kept and replayed.
      const small = await gw.decide(sampleRequest(), { "idempotency-key": "small-1" });
      const again = await gw.decide(sampleRequest(), { "idempotency-key": "small-1" });
      assert.equal(again.headers.get("idempotent-replayed"), "true");
      assert.equal(await again.text(), await small.text());
    } finally {
      await gw.close();
    }
  });

  test("the purge deletes expired idempotency entries and preview counters older than three days, nothing else", async () => {
    const clock = new FixedClock(Date.parse("2026-11-20T12:00:00Z"));
    const gw = await startGateway({ clock });
    try {
      const db = (gw.store as SqliteStore).db;
      const count = (table: string) => (db.prepare(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n;
      assert.equal((await gw.decide(sampleRequest(), { "idempotency-key": "old" })).status, 200);
      clock.set(Date.parse("2026-11-21T13:00:00Z"));
      assert.equal((await gw.decide(sampleRequest(), { "idempotency-key": "newer" })).status, 200);
      clock.set(Date.parse("2026-11-24T12:30:00Z"));
      assert.equal((await gw.decide(sampleRequest(), { "idempotency-key": "fresh" })).status, 200);
      assert.equal(count("idempotency_keys"), 3);
      assert.deepEqual(db.prepare("SELECT DISTINCT day FROM preview_counters ORDER BY day").pluck().all(), [
        "2026-11-20",
        "2026-11-21",
        "2026-11-24",
      ]);
      // 2026-11-24: "old" and "newer" are past their 24 hours; counters of days before 2026-11-21 go.
      assert.deepEqual(await gw.app.purgeBooks(), { idempotencyKeys: 2, previewCounters: 2 });
      assert.deepEqual(db.prepare("SELECT key FROM idempotency_keys").pluck().all(), ["fresh"]);
      assert.deepEqual(db.prepare("SELECT DISTINCT day FROM preview_counters ORDER BY day").pluck().all(), ["2026-11-21", "2026-11-24"]);
      assert.deepEqual(await gw.app.purgeBooks(), { idempotencyKeys: 0, previewCounters: 0 });
      assert.equal((await gw.store.listUsage(gw.orgId, { limit: 10 })).records.length, 3, "usage history is kept");
    } finally {
      await gw.close();
    }
  });

  test("an invalid Idempotency-Key header is 422", async () => {
    const gw = await startGateway();
    try {
      const res = await gw.decide(sampleRequest(), { "idempotency-key": "x".repeat(256) });
      await errorBody(res, 422);
    } finally {
      await gw.close();
    }
  });

  test("the official SDK with its default retries, first response lost, sending an Idempotency-Key: charged once", async () => {
    const gw = await startGateway({ env: PAID });
    const proxy = await startLossyProxy(new URL(gw.url));
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 100_000, nowMs: Date.now() });
      const client = new TypeSafeClient({ apiKey: gw.key, baseURL: proxy.url, logLevel: "off" });
      const { data, requestId, response } = await client
        .systemOne(
          {
            state: "I was charged twice.",
            questions: {
              topic: choice("Topic?", { billing: null, other: null }),
              mood: score("Mood?", ["calm", "angry"]),
              refund: noul("Refund?"),
            },
          },
          { headers: { "Idempotency-Key": "sdk-retry-1" } },
        )
        .withResponse();
      assert.equal(proxy.dropped(), 1, "the first response was lost");
      assert.equal(response.headers.get("idempotent-replayed"), "true", "the retry got the stored response");
      assert.equal(requestId, (data as unknown as { request_id: string }).request_id);
      assert.equal(gw.fake!.calls.decide, 1, "the model ran once");
      const records = (await gw.store.listUsage(gw.orgId, { limit: 10 })).records;
      assert.equal(records.length, 1);
      const balance = await gw.store.getBalance(gw.orgId);
      assert.equal(balance.spent, records[0]!.costMicrousd, "charged once");
      assert.equal(balance.available, 100_000 - records[0]!.costMicrousd);

      // Without the key, the same loss would run (and charge) the request twice: the spec's rule 5.
      const noKey = await startLossyProxy(new URL(gw.url));
      const unsafe = new TypeSafeClient({ apiKey: gw.key, baseURL: noKey.url, logLevel: "off" });
      await unsafe.systemOne({ state: "again", questions: { refund: noul("Refund?") } });
      assert.equal(gw.fake!.calls.decide, 3);
      await noKey.close();
    } finally {
      await proxy.close();
      await gw.close();
    }
  });
});
