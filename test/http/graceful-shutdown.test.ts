import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";

const PAID = { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1", TDS_RESERVE_TOKENS: "1000", TDS_MODEL_TIMEOUT_MS: "20000" };

describe("graceful shutdown", () => {
  test("in-flight decisions finish within the grace period and are charged normally", async () => {
    const gw = await startGateway({ env: PAID, shutdownGraceMs: 3000 });
    await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000, nowMs: Date.now() });
    const pending = gw.decide(sampleRequest({ state: { fake_behavior: "delay:300" } }));
    await new Promise((r) => setTimeout(r, 100));
    const closing = gw.app.close();
    const res = await pending;
    assert.equal(res.status, 200);
    await closing;
    const balance = await gw.store.getBalance(gw.orgId);
    assert.equal(balance.reserved, 0);
    assert.ok(balance.spent > 0);
    await gw.close().catch(() => undefined);
  });

  test("past the grace period the model call is abandoned: 502, reservation released, nothing charged, recorded", async () => {
    const gw = await startGateway({ env: PAID, shutdownGraceMs: 200 });
    await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000, nowMs: Date.now() });
    const pending = gw.decide(sampleRequest({ state: { fake_behavior: "delay:10000" } }));
    await new Promise((r) => setTimeout(r, 100));
    const started = performance.now();
    const closing = gw.app.close();
    const res = await pending;
    assert.equal(res.status, 502);
    await closing;
    assert.ok(performance.now() - started < 3000, "close() does not wait for the model");
    assert.deepEqual(await gw.store.getBalance(gw.orgId), { available: 10_000, reserved: 0, spent: 0, granted: 10_000 });
    const record = await gw.store.getUsage(gw.orgId, res.headers.get("x-service-request-id")!);
    assert.equal(record?.outcome, "model_error");
    assert.equal((await gw.store.getReservation(record!.requestId))?.status, "released");
    await gw.close().catch(() => undefined);
  });
});
