import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { errorBody } from "../support/contract-check.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";

const FAILURES: Array<[behavior: string, status: number, detail: RegExp]> = [
  ["delay:2000", 502, /did not answer in time/],
  ["hang", 502, /did not answer in time/],
  ["reset", 502, /unavailable/],
  ["reset-mid-body", 502, /unavailable|invalid/],
  ["status:500", 502, /unavailable/],
  ["status:503", 502, /unavailable/],
  ["status:429", 502, /unavailable/],
  ["status:529", 502, /unavailable/],
  ["status:401", 502, /unavailable/],
  ["garbage", 502, /invalid response/],
  ["truncated-json", 502, /invalid response/],
  ["html", 502, /invalid response/],
  ["no-usage", 502, /invalid response/],
  ["zero-input-tokens", 502, /invalid response/],
  ["missing-answer", 502, /do not match/],
  ["extra-answer", 502, /do not match/],
  ["wrong-type", 502, /do not match/],
  ["bad-probabilities", 502, /do not match/],
  ["negative-probability", 502, /do not match/],
  ["wrong-options", 502, /do not match/],
  ["choice-not-an-option", 502, /do not match/],
  ["score-out-of-range", 502, /do not match/],
  ["context-rejected", 422, /rejected the request's context/],
  ["status:400", 422, /rejected the request's context/],
  ["status:413", 422, /rejected the request's context/],
];

describe("model service failures map to documented statuses", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({ env: { TDS_MODEL_TIMEOUT_MS: "400" } });
  });
  after(async () => gw.close());

  for (const [behavior, status, detail] of FAILURES) {
    test(`${behavior} → ${status}, recorded, never a 200`, async () => {
      const res = await gw.decide(sampleRequest({ state: { fake_behavior: behavior, text: "hello" } }));
      const body = await errorBody(res, status);
      assert.match(body.detail, detail);
      const requestId = res.headers.get("x-service-request-id")!;
      const record = await gw.store.getUsage(gw.orgId, requestId);
      assert.ok(record, "an accepted request has a usage record");
      assert.equal(record.outcome, status === 422 ? "context_rejected" : "model_error");
      assert.equal(record.httpStatus, status);
      assert.equal(record.costMicrousd, 0);
    });
  }

  test("the gateway recovers: a normal request after the failures succeeds", async () => {
    assert.equal((await gw.decide(sampleRequest())).status, 200);
  });
});

describe("model service unreachable or not configured", () => {
  test("nothing listening at the URL → 502 on both endpoints", async () => {
    const gw = await startGateway({ fake: false, env: { TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9" } });
    try {
      const models = await errorBody(await gw.get("/v1/models"), 502);
      assert.match(models.detail, /unavailable/);
      await errorBody(await gw.decide(sampleRequest()), 502);
    } finally {
      await gw.close();
    }
  });

  test("no model service configured → 503 on both endpoints", async () => {
    const gw = await startGateway({ fake: false });
    try {
      assert.match((await errorBody(await gw.get("/v1/models"), 503)).detail, /No model service/);
      await errorBody(await gw.decide(sampleRequest()), 503);
      assert.equal((await gw.store.listUsage(gw.orgId, { limit: 10 })).records.length, 0);
    } finally {
      await gw.close();
    }
  });
});
