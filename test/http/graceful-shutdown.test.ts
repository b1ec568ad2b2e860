import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { eventually, settlesBefore } from "../support/timer-race.ts";

const PAID = { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1", TDS_RESERVE_TOKENS: "1000", TDS_MODEL_TIMEOUT_MS: "20000" };

describe("graceful shutdown", () => {
  test("in-flight decisions finish within the grace period and are charged normally", async () => {
    // A grace period no busy machine comes near: the decision needs its 300 ms model call and a commit.
    const gw = await startGateway({ env: PAID, shutdownGraceMs: 60_000 });
    await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000, nowMs: Date.now() });
    const pending = gw.decide(sampleRequest({ state: { fake_behavior: "delay:300" } }));
    await eventually("the model call to start", () => (gw.fake!.calls.decide > 0 ? true : undefined));
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
    // The model would answer after 10 minutes and its deadline is 100 s away; the grace period (200 ms) is the
    // only timer shorter than the guard below, so a close() that waited for the model loses the race against it.
    const gw = await startGateway({ env: { ...PAID, TDS_MODEL_TIMEOUT_MS: "100000" }, shutdownGraceMs: 200 });
    await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000, nowMs: Date.now() });
    const pending = gw.decide(sampleRequest({ state: { fake_behavior: "delay:600000" } }));
    await eventually("the model call to start", () => (gw.fake!.calls.decide > 0 ? true : undefined));
    const closing = gw.app.close();
    assert.ok(await settlesBefore(Promise.all([pending, closing]), 30_000), "close() does not wait for the model");
    const res = await pending;
    assert.equal(res.status, 502);
    await closing;
    assert.deepEqual(await gw.store.getBalance(gw.orgId), { available: 10_000, reserved: 0, spent: 0, granted: 10_000 });
    const record = await gw.store.getUsage(gw.orgId, res.headers.get("x-service-request-id")!);
    assert.equal(record?.outcome, "model_error");
    assert.equal((await gw.store.getReservation(record!.requestId))?.status, "released");
    await gw.close().catch(() => undefined);
  });
});
