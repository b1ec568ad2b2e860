import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { errorBody } from "../support/contract-check.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { GENEROUS_MODEL_TIMEOUT_MS, HELD_ANSWERS, startShortDeadlineGateway } from "../support/model-deadlines.ts";

const FAILURES: Array<[behavior: string, status: number, detail: RegExp]> = [
  ["delay:60000", 502, /did not answer in time/],
  ["hang", 502, /did not answer in time/],
  ["reset", 502, /is unavailable/],
  ["reset-mid-body", 502, /is unavailable|cannot be read/],
  ["status:500", 502, /answered HTTP 5xx/],
  ["status:503", 502, /answered HTTP 5xx/],
  ["status:429", 502, /is overloaded \(HTTP 4xx\); retry in 7 s/],
  ["status:529", 502, /is overloaded \(HTTP 5xx\); retry in 7 s/],
  ["status:401", 502, /answered HTTP 4xx/],
  ["status:400", 502, /refused the request \(HTTP 4xx\)/],
  ["status:422", 502, /refused the request \(HTTP 4xx\)/],
  ["garbage", 502, /sent an answer that cannot be read \(HTTP 2xx\)/],
  ["truncated-json", 502, /cannot be read/],
  ["html", 502, /cannot be read/],
  ["no-usage", 502, /cannot be read/],
  ["zero-input-tokens", 502, /cannot be read/],
  ["missing-answer", 502, /do not match/],
  ["extra-answer", 502, /do not match/],
  ["wrong-type", 502, /do not match/],
  ["bad-probabilities", 502, /do not match/],
  ["negative-probability", 502, /do not match/],
  ["wrong-options", 502, /do not match/],
  ["choice-not-an-option", 502, /do not match/],
  ["score-out-of-range", 502, /do not match/],
  [
    "context-rejected",
    422,
    /^The request is longer than the context of the model \(deployment "[^"]+"\); shorten the state or the questions;/,
  ],
  ["status:413", 422, /longer than the context of the model/],
];

describe("model service failures map to documented statuses", () => {
  /** Every call but those the fake holds past the short deadline (on `shortDeadline`). */
  let gw: Gateway;
  let shortDeadline: Gateway;
  before(async () => {
    gw = await startGateway({ env: { TDS_MODEL_TIMEOUT_MS: GENEROUS_MODEL_TIMEOUT_MS } });
    shortDeadline = await startShortDeadlineGateway();
  });
  after(async () => Promise.all([gw.close(), shortDeadline.close()]));

  for (const [behavior, status, detail] of FAILURES) {
    test(`${behavior} → ${status}, recorded, never a 200`, async () => {
      const g = HELD_ANSWERS.has(behavior) ? shortDeadline : gw;
      const deployment = g.config.modelServices[0]!.name;
      const res = await g.decide(sampleRequest({ state: { fake_behavior: behavior, text: "hello" } }));
      const body = await errorBody(res, status);
      assert.match(body.detail, detail);
      assert.doesNotMatch(body.detail, /fake|context length exceeded/, "the model service's own words stay in the log");
      const requestId = res.headers.get("x-service-request-id")!;
      assert.ok(body.detail.includes(`(deployment ${JSON.stringify(deployment)})`), body.detail);
      assert.ok(body.detail.endsWith(`; no credits were charged (request ${requestId}).`), body.detail);
      const record = await g.store.getUsage(g.orgId, requestId);
      assert.ok(record, "an accepted request has a usage record");
      assert.equal(record.outcome, status === 422 ? "context_rejected" : "model_error");
      assert.equal(record.httpStatus, status);
      assert.equal(record.costMicrousd, 0);
      assert.equal(record.errorDetail, body.detail, "the record says what the client was told");
    });
  }

  test("an overloaded model service's Retry-After is passed on", async () => {
    const res = await gw.decide(sampleRequest({ state: { fake_behavior: "status:429" } }));
    await errorBody(res, 502);
    assert.equal(res.headers.get("retry-after"), "7");
  });

  test("the gateway recovers: a normal request after the failures succeeds", async () => {
    assert.equal((await gw.decide(sampleRequest())).status, 200);
  });
});

describe("model service unreachable or not configured", () => {
  test("nothing listening at the URL → 502 on both endpoints", async () => {
    const gw = await startGateway({ fake: false, env: { TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9" } });
    try {
      const models = await errorBody(await gw.get("/v1/models"), 502);
      assert.equal(models.detail, "The model service is unavailable.");
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
