import assert from "node:assert/strict";
import { after, describe, it } from "node:test";
import { scaledPrice, tokenCost } from "../../src/domain/money.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";
import { batchLine, batchResults, getBatch, ndjson, type ResultLine, submitBatch, waitForBatch, waitForEnd } from "./batch-support.ts";

const PAID = { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1", TDS_PRICE_PER_MILLION_OUTPUT_USD: "3" };

const costOf = (line: ResultLine) => (line.body.usage as { cost_microusd: number } | undefined)?.cost_microusd ?? 0;

async function submitted(gw: Pick<Gateway, "url" | "key">, lines: readonly unknown[], model?: string): Promise<string> {
  const res = await submitBatch(gw, ndjson(lines), model ? { model } : {});
  assert.equal(res.status, 202, await res.clone().text());
  return ((await res.json()) as { id: string }).id;
}

describe("batches run to their end through a real server", () => {
  const open: Gateway[] = [];
  after(async () => {
    for (const gw of open) await gw.close();
  });
  const start = async (...args: Parameters<typeof startGateway>) => {
    const gw = await startGateway(...args);
    open.push(gw);
    return gw;
  };

  it("2,000 requests: one result each in input order, each an ordinary usage record, charged exactly the results' costs", async () => {
    const gw = await start({ env: PAID });
    await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 50_000_000, nowMs: Date.now() });
    const id = await submitted(
      gw,
      Array.from({ length: 2000 }, (_, i) => batchLine(i)),
    );
    const ended = await waitForEnd(gw, id);
    assert.equal(ended.status, "completed");
    assert.deepEqual(ended.request_counts, { total: 2000, succeeded: 2000, failed: 0 });
    const results = await batchResults(gw, id);
    assert.deepEqual(
      results.map((r) => r.custom_id),
      Array.from({ length: 2000 }, (_, i) => `r${i}`),
    );
    assert.ok(results.every((r) => r.status === 200 && r.body.request_id === r.request_id));
    assert.equal(new Set(results.map((r) => r.request_id)).size, 2000);
    const sum = results.reduce((total, r) => total + costOf(r), 0);
    assert.ok(sum > 0);
    assert.equal(ended.cost_microusd, sum);
    const balance = await gw.store.getBalance(gw.orgId);
    assert.deepEqual([balance.spent, balance.reserved, balance.available], [sum, 0, 50_000_000 - sum]);
    // Each result is the usage record of its request (source batch), found by request_id.
    for (const r of [results[0]!, results[999]!, results[1999]!]) {
      const res = await gw.get(`/v1/usage/${r.request_id}`);
      assert.equal(res.status, 200);
      const record = (await res.json()) as Record<string, unknown>;
      assert.deepEqual([record.source, record.outcome, record.cost_microusd], ["batch", "succeeded", costOf(r)]);
    }
    assert.equal(gw.fake!.calls.decide, 2000);
  });

  it("a model failure, an unknown model and the preview quota running out end their requests with the API's answer; the batch goes on", async () => {
    // One at a time: the quota runs out at the same request whatever the machine does.
    const gw = await start({ env: { TDS_PREVIEW_REQUEST_LIMIT: "6", TDS_BATCH_GLOBAL_CONCURRENCY: "1" } });
    const lines = [
      batchLine(0),
      batchLine(1, { fake_behavior: "status:500" }),
      { ...batchLine(2), model: "no-such-model" },
      ...Array.from({ length: 9 }, (_, i) => batchLine(i + 3)),
    ];
    const id = await submitted(gw, lines);
    const ended = await waitForEnd(gw, id);
    assert.equal(ended.status, "completed");
    const results = await batchResults(gw, id);
    assert.equal(results.length, 12);
    const byStatus = (status: number) => results.filter((r) => r.status === status);
    assert.equal(results[1]!.status, 502);
    assert.match(String(results[1]!.body.detail), /model service/i);
    assert.equal(results[2]!.status, 422);
    // Six admitted (one of them failed at the model): the quota counts admissions; the other five are refused.
    assert.equal(byStatus(200).length, 5);
    assert.equal(byStatus(429).length, 5);
    for (const r of byStatus(429)) assert.match(String(r.body.detail), /preview/i);
    assert.deepEqual(ended.request_counts, { total: 12, succeeded: 5, failed: 7 });
  });

  it("batch_price_factor: paid batch requests are charged at the model's prices times the factor", async () => {
    const gw = await start({ env: { ...PAID, TDS_BATCH_PRICE_FACTOR: "0.5" } });
    await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000_000, nowMs: Date.now() });
    const interactive = (await (await gw.decide(batchRequestOf(batchLine(0)))).json()) as {
      usage: { input_tokens: number; output_tokens: number; cost_microusd: number; price_per_million_input_usd: string };
    };
    const id = await submitted(gw, [batchLine(0)]);
    await waitForEnd(gw, id);
    const [result] = await batchResults(gw, id);
    const usage = result!.body.usage as typeof interactive.usage;
    const half = scaledPrice({ inputPerMillion: 1_000_000n, outputPerMillion: 3_000_000n }, 500_000n);
    assert.equal(usage.cost_microusd, tokenCost(half, usage.input_tokens, usage.output_tokens));
    assert.equal(usage.price_per_million_input_usd, "0.5");
    assert.equal(interactive.usage.price_per_million_input_usd, "1");
    assert.ok(usage.cost_microusd < interactive.usage.cost_microusd);
  });

  it("batch requests do not count against the per-minute limit of interactive requests", async () => {
    const gw = await start({ env: { TDS_REQUESTS_PER_MINUTE: "3" } });
    const id = await submitted(
      gw,
      Array.from({ length: 20 }, (_, i) => batchLine(i)),
    );
    const ended = await waitForEnd(gw, id);
    assert.deepEqual(ended.request_counts, { total: 20, succeeded: 20, failed: 0 });
    // The submission was one request of the minute: two interactive ones remain.
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await gw.decide(batchRequestOf(batchLine(i)))).status);
    assert.deepEqual(statuses, [200, 200, 429]);
  });

  it("cancel: requests not started are never run nor charged, running ones finish, the batch ends cancelled", async () => {
    const gw = await start({ env: { ...PAID, TDS_BATCH_GLOBAL_CONCURRENCY: "2" } });
    await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000_000, nowMs: Date.now() });
    const id = await submitted(
      gw,
      // The later ones slow: the batch is surely mid-run when it is cancelled.
      Array.from({ length: 40 }, (_, i) => batchLine(i, { fake_behavior: i < 4 ? "delay:150" : "delay:2000" })),
    );
    await waitForBatch(gw, id, (b) => b.request_counts.succeeded >= 2);
    const res = await fetch(`${gw.url}/v1/batches/${id}/cancel`, { method: "POST", headers: { authorization: `Bearer ${gw.key}` } });
    assert.equal(res.status, 200);
    const ended = await waitForEnd(gw, id);
    assert.equal(ended.status, "cancelled");
    const results = await batchResults(gw, id);
    assert.equal(results.length, 40);
    const ran = results.filter((r) => r.status === 200);
    const cancelled = results.filter((r) => r.status === 409);
    assert.equal(ran.length + cancelled.length, 40);
    assert.ok(cancelled.length > 0 && ran.length >= 2);
    for (const r of cancelled)
      assert.deepEqual(
        [r.request_id, r.body.detail],
        [null, "The batch was cancelled before this request started; it was neither run nor charged."],
      );
    assert.equal(gw.fake!.calls.decide, ran.length);
    const spent = (await gw.store.getBalance(gw.orgId)).spent;
    assert.equal(
      spent,
      ran.reduce((t, r) => t + costOf(r), 0),
    );
    assert.equal(ended.cost_microusd, spent);
  });

  it("a key revoked mid-batch: its remaining requests get the API's refusal", async () => {
    const gw = await start({ env: { TDS_BATCH_GLOBAL_CONCURRENCY: "1" } });
    gw.fake!.setBehavior("delay:50");
    const id = await submitted(
      gw,
      Array.from({ length: 30 }, (_, i) => batchLine(i)),
    );
    // Slowed once the first has succeeded, the batch is surely mid-run when the key is revoked.
    await waitForBatch(gw, id, (b) => {
      if (b.request_counts.succeeded < 1) return false;
      gw.fake!.setBehavior("delay:1500");
      return true;
    });
    await gw.store.revokeApiKey(gw.keyId, Date.now());
    // The key is revoked: the batch is read through the store.
    const until = Date.now() + 60_000;
    let batch = (await gw.store.batches.getBatch(gw.orgId, id))!;
    while (!["completed", "cancelled", "expired"].includes(batch.status) && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 100));
      batch = (await gw.store.batches.getBatch(gw.orgId, id))!;
    }
    assert.equal(batch.status, "completed");
    const results = await gw.store.batches.results(gw.orgId, id, { afterPosition: -1, limit: 100 });
    const revoked = results!.filter((r) => r.status === 401);
    assert.ok(revoked.length > 0, "the requests started after the revoke are refused");
    assert.equal(revoked.length + results!.filter((r) => r.status === 200).length, 30);
    // Once refused, every later request is refused too (the key stays revoked).
    const firstRefused = results!.findIndex((r) => r.status === 401);
    assert.ok(results!.slice(firstRefused).every((r) => r.status === 401));
  });

  it("the completion window ends what has not started (expired); results are purged after batch_retention_days", async () => {
    const clock = new FixedClock(Date.UTC(2026, 10, 27, 12));
    const gw = await start({ clock, runBatches: false, env: { TDS_BATCH_COMPLETION_WINDOW_HOURS: "2", TDS_BATCH_RETENTION_DAYS: "1" } });
    const id = await submitted(
      gw,
      Array.from({ length: 3 }, (_, i) => batchLine(i)),
    );
    const batch = await getBatch(gw, id);
    assert.equal(Date.parse(batch.expires_at) - Date.parse(batch.created_at), 2 * 3600_000);
    clock.advance(2 * 3600_000);
    assert.equal(await gw.app.batchRunner.expireNow(), 3);
    const ended = await getBatch(gw, id);
    assert.deepEqual([ended.status, ended.request_counts], ["expired", { total: 3, succeeded: 0, failed: 3 }]);
    const results = await batchResults(gw, id);
    assert.deepEqual(
      results.map((r) => [r.status, r.request_id]),
      [
        [409, null],
        [409, null],
        [409, null],
      ],
    );
    clock.advance(24 * 3600_000 - 1);
    assert.equal(await gw.app.batchRunner.purgeNow(), 0);
    clock.advance(2);
    assert.equal(await gw.app.batchRunner.purgeNow(), 1);
    const gone = await gw.get(`/v1/batches/${id}`);
    assert.equal(gone.status, 404);
  });
});

/** The decision request of a batch line (its custom_id dropped). */
function batchRequestOf(line: Record<string, unknown>): Record<string, unknown> {
  const { custom_id: _, ...request } = line;
  return request;
}
