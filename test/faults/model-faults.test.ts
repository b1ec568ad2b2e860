/**
 * Every failure of the model service, in paid mode and in preview mode, mapped to its documented status,
 * with the money and quota invariants checked after EACH one: the balance exactly as before (available,
 * reserved, spent, granted), the ledger summing to it, no reservation left pending, exactly one usage
 * record for the accepted request with the right outcome, and (preview) the day counters up by one.
 * (test/http/model-failures.test.ts checks statuses and records in preview; test/http/paid-mode.test.ts
 * the balance after ten of these. This adds the rest of the failures, the ledger, the counters,
 * failures under concurrency, and retries with an Idempotency-Key after a failure.)
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { utcDay } from "../../src/domain/utc-day.ts";
import { allUsage, assertLedgerMatches, recordsOf, snapshot } from "../support/books.ts";
import { assertShape, errorBody, json } from "../support/contract-check.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { GENEROUS_MODEL_TIMEOUT_MS, HELD_ANSWERS, startShortDeadlineGateway } from "../support/model-deadlines.ts";
import { byteBound } from "../support/token-bound.ts";

/** 1 USD per million input tokens: every reservation is the request's token bound in microUSD. */
const PAID = { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1", TDS_MODEL_TIMEOUT_MS: GENEROUS_MODEL_TIMEOUT_MS };
/**
 * Where a test mixes answers that must arrive with answers held until the deadline on one gateway: long enough for
 * any answer on a busy machine, and what each held answer costs the test in waiting.
 */
const MIXED_DEADLINE = { TDS_MODEL_TIMEOUT_MS: "10000" };
const GRANT = 100_000;

type Outcome = "model_error" | "context_rejected";
const FAILURES: Array<{ behavior: string; status: 502 | 422; outcome: Outcome; detail: RegExp }> = [
  { behavior: "delay:60000", status: 502, outcome: "model_error", detail: /did not answer in time/ },
  { behavior: "hang", status: 502, outcome: "model_error", detail: /did not answer in time/ },
  { behavior: "hang-mid-body", status: 502, outcome: "model_error", detail: /did not answer in time/ },
  { behavior: "reset", status: 502, outcome: "model_error", detail: /is unavailable/ },
  { behavior: "reset-mid-body", status: 502, outcome: "model_error", detail: /is unavailable|cannot be read/ },
  { behavior: "status:500", status: 502, outcome: "model_error", detail: /answered HTTP 5xx/ },
  { behavior: "status:502", status: 502, outcome: "model_error", detail: /answered HTTP 5xx/ },
  { behavior: "status:503", status: 502, outcome: "model_error", detail: /answered HTTP 5xx/ },
  { behavior: "status:504", status: 502, outcome: "model_error", detail: /answered HTTP 5xx/ },
  { behavior: "status:401", status: 502, outcome: "model_error", detail: /answered HTTP 4xx/ },
  { behavior: "status:403", status: 502, outcome: "model_error", detail: /answered HTTP 4xx/ },
  // The fake sends Retry-After: 7 with 429 and 529; the gateway passes it on.
  { behavior: "status:429", status: 502, outcome: "model_error", detail: /is overloaded \(HTTP 4xx\); retry in 7 s/ },
  { behavior: "status:529", status: 502, outcome: "model_error", detail: /is overloaded \(HTTP 5xx\); retry in 7 s/ },
  { behavior: "garbage", status: 502, outcome: "model_error", detail: /cannot be read/ },
  { behavior: "truncated-json", status: 502, outcome: "model_error", detail: /cannot be read/ },
  { behavior: "html", status: 502, outcome: "model_error", detail: /cannot be read/ },
  { behavior: "no-usage", status: 502, outcome: "model_error", detail: /cannot be read/ },
  { behavior: "zero-input-tokens", status: 502, outcome: "model_error", detail: /cannot be read/ },
  { behavior: "missing-answer", status: 502, outcome: "model_error", detail: /do not match/ },
  { behavior: "extra-answer", status: 502, outcome: "model_error", detail: /do not match/ },
  { behavior: "wrong-type", status: 502, outcome: "model_error", detail: /do not match/ },
  { behavior: "bad-probabilities", status: 502, outcome: "model_error", detail: /do not match/ },
  { behavior: "negative-probability", status: 502, outcome: "model_error", detail: /do not match/ },
  { behavior: "wrong-options", status: 502, outcome: "model_error", detail: /do not match/ },
  { behavior: "choice-not-an-option", status: 502, outcome: "model_error", detail: /do not match/ },
  { behavior: "score-out-of-range", status: 502, outcome: "model_error", detail: /do not match/ },
  { behavior: "context-rejected", status: 422, outcome: "context_rejected", detail: /longer than the context of the model/ },
  { behavior: "status:413", status: 422, outcome: "context_rejected", detail: /longer than the context of the model/ },
  // A 400 / 422 that is not about the context: the model service refused a request the gateway accepted.
  { behavior: "status:400", status: 502, outcome: "model_error", detail: /refused the request \(HTTP 4xx\)/ },
  { behavior: "status:422", status: 502, outcome: "model_error", detail: /refused the request \(HTTP 4xx\)/ },
];

const failing = (behavior: string, extra: Record<string, unknown> = {}) =>
  sampleRequest({ state: { fake_behavior: behavior, ticket: "charged twice", ...extra } });

describe("model service failures in paid mode: documented status, balance and ledger untouched, one record each", {
  timeout: 30_000,
}, () => {
  /** Every call but those the fake holds past the short deadline (on `shortDeadline`). */
  let generous: Gateway;
  let shortDeadline: Gateway;
  before(async () => {
    generous = await startGateway({ env: PAID });
    shortDeadline = await startShortDeadlineGateway({ env: PAID });
    for (const g of [generous, shortDeadline]) await g.store.grantCredits({ orgId: g.orgId, amountMicrousd: GRANT, nowMs: Date.now() });
  });
  after(async () => Promise.all([generous.close(), shortDeadline.close()]));

  for (const f of FAILURES) {
    test(`${f.behavior} → ${f.status} (${f.outcome}), nothing charged`, async () => {
      const gw = HELD_ANSWERS.has(f.behavior) ? shortDeadline : generous;
      const before = await snapshot(gw.store, gw.orgId);
      const calls = gw.fake!.calls.decide;
      const res = await gw.decide(failing(f.behavior));
      const body = await errorBody(res, f.status);
      assert.match(body.detail, f.detail);
      const requestId = res.headers.get("x-service-request-id")!;
      assert.match(requestId, /^req_/);
      assert.equal(gw.fake!.calls.decide, calls + 1, "the request was accepted and the model called once");

      // Balance exactly as before; the ledger sums to it.
      const balance = await assertLedgerMatches(gw.store, gw.orgId);
      assert.deepEqual(balance, before.balance, "available, reserved, spent and granted unchanged");
      const ledger = await gw.store.listLedger(gw.orgId);
      assert.equal(ledger.length, before.ledger + 1, "one entry: the release");
      assert.deepEqual(
        ledger.slice(-1).map((e) => [e.kind, e.reservationId, e.availableDelta, e.reservedDelta, e.spentDelta]),
        [["release", requestId, 0, 0, 0]],
      );
      // The reservation resolved exactly once: released, nothing pending.
      const reservation = await gw.store.getReservation(requestId);
      assert.equal(reservation?.status, "released");
      assert.equal(balance.reserved, 0, "no pending reservation");
      // Exactly one usage record, with the right outcome.
      const records = await recordsOf(gw.store, gw.orgId, requestId);
      assert.equal(records.length, 1);
      const [record] = records;
      assert.equal(record!.outcome, f.outcome);
      assert.equal(record!.httpStatus, f.status);
      assert.equal(record!.costMicrousd, 0);
      assert.equal(record!.mode, "paid");
      assert.ok(record!.errorDetail && record!.errorDetail.length > 0, "the record says what went wrong");
      assert.equal((await allUsage(gw.store, gw.orgId)).length, before.usage + 1, "one new record, no other");
    });
  }

  test("after all of them: a normal request succeeds and is charged exactly its cost", async () => {
    const gw = generous;
    const before = await gw.store.getBalance(gw.orgId);
    const res = await gw.decide(sampleRequest());
    const body = await json(res);
    assert.equal(res.status, 200, JSON.stringify(body));
    assertShape("decision", body);
    const cost = body.usage.cost_microusd as number;
    assert.ok(cost > 0 && cost <= byteBound(sampleRequest()), "at most the reservation, its token bound");
    const balance = await assertLedgerMatches(gw.store, gw.orgId);
    assert.deepEqual(balance, { available: before.available - cost, reserved: 0, spent: cost, granted: GRANT });
    const usage = await allUsage(gw.store, gw.orgId);
    assert.equal(usage.length, FAILURES.filter((f) => !HELD_ANSWERS.has(f.behavior)).length + 1);
    assert.equal(usage.filter((r) => r.outcome === "succeeded").length, 1);
  });
});

describe("model service failures in preview mode: the day counters count each accepted request once", { timeout: 30_000 }, () => {
  let generous: Gateway;
  let shortDeadline: Gateway;
  before(async () => {
    generous = await startGateway({ env: { TDS_MODEL_TIMEOUT_MS: GENEROUS_MODEL_TIMEOUT_MS } });
    shortDeadline = await startShortDeadlineGateway();
  });
  after(async () => Promise.all([generous.close(), shortDeadline.close()]));

  test("every failure consumes one unit of the organization's and the service's daily quota and leaves one record", async () => {
    for (const f of FAILURES) {
      const gw = HELD_ANSWERS.has(f.behavior) ? shortDeadline : generous;
      const day = utcDay(Date.now());
      const counters = await gw.store.previewUsage(gw.orgId, day);
      const usage = (await allUsage(gw.store, gw.orgId)).length;
      const res = await gw.decide(failing(f.behavior));
      const body = await errorBody(res, f.status);
      assert.match(body.detail, f.detail, f.behavior);
      // (A failure that straddles 00:00 UTC would count on the new day; the suite does not run then for long.)
      assert.deepEqual(
        await gw.store.previewUsage(gw.orgId, utcDay(Date.now())),
        day === utcDay(Date.now()) ? { org: counters.org + 1, global: counters.global + 1 } : { org: 1, global: 1 },
        f.behavior,
      );
      const records = await recordsOf(gw.store, gw.orgId, res.headers.get("x-service-request-id")!);
      assert.equal(records.length, 1, f.behavior);
      assert.equal(records[0]!.outcome, f.outcome, f.behavior);
      assert.equal(records[0]!.mode, "preview");
      assert.equal(records[0]!.costMicrousd, 0);
      assert.equal((await allUsage(gw.store, gw.orgId)).length, usage + 1, f.behavior);
      assert.deepEqual(
        await gw.store.getBalance(gw.orgId),
        { available: 0, reserved: 0, spent: 0, granted: 0 },
        "preview touches no credits",
      );
    }
  });
});

describe("failures under concurrency and retries after a failure (paid)", { timeout: 60_000 }, () => {
  test("30 concurrent requests mixing successes and every kind of failure: each reservation resolved once, the books balance", async () => {
    const gw = await startGateway({ env: { ...PAID, ...MIXED_DEADLINE } });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: GRANT, nowMs: Date.now() });
      const kinds = [
        "ok",
        "delay:50",
        "hang",
        "hang-mid-body",
        "reset-mid-body",
        "status:503",
        "status:429",
        "garbage",
        "wrong-options",
        "context-rejected",
      ];
      const sent = Array.from({ length: 30 }, (_, i) => kinds[i % kinds.length]!);
      const responses = await Promise.all(sent.map((b, i) => gw.decide(failing(b, { i }))));
      let charged = 0;
      const ids: string[] = [];
      for (const [i, res] of responses.entries()) {
        const behavior = sent[i]!;
        const expected = behavior === "ok" || behavior === "delay:50" ? 200 : FAILURES.find((f) => f.behavior === behavior)?.status;
        const text = await res.text();
        assert.equal(res.status, expected, `${behavior}: ${text}`);
        if (res.status === 200) charged += JSON.parse(text).usage.cost_microusd;
        ids.push(res.headers.get("x-service-request-id")!);
      }
      assert.equal(new Set(ids).size, 30);
      const balance = await assertLedgerMatches(gw.store, gw.orgId);
      assert.deepEqual(balance, { available: GRANT - charged, reserved: 0, spent: charged, granted: GRANT });
      const usage = await allUsage(gw.store, gw.orgId);
      assert.equal(usage.length, 30, "one record per accepted request");
      assert.deepEqual(new Set(usage.map((r) => r.requestId)), new Set(ids));
      assert.equal(
        usage.filter((r) => r.outcome === "succeeded").reduce((s, r) => s + r.costMicrousd, 0),
        charged,
      );
      for (const id of ids) assert.notEqual((await gw.store.getReservation(id))?.status, "pending", id);
      const ledger = await gw.store.listLedger(gw.orgId);
      for (const id of ids) {
        const kinds = ledger.filter((e) => e.reservationId === id).map((e) => e.kind);
        assert.equal(kinds.length, 1, `${id}: exactly one entry, its resolution, got ${kinds.join(",")}`);
      }
    } finally {
      await gw.close();
    }
  });

  test("with an Idempotency-Key: a failed first attempt charges nothing, the retry is charged once, a third call replays", async () => {
    const gw = await startGateway({ env: { ...PAID, ...MIXED_DEADLINE } });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: GRANT, nowMs: Date.now() });
      const body = sampleRequest({ state: { ticket: "same body every time" } });
      const headers = { "idempotency-key": "retry-after-failure-1" };
      // Only the decide calls fail: the model list (GET /v1/models, read before acceptance) stays healthy.
      gw.fake!.setModelsBehavior("ok");
      for (const behavior of ["hang-mid-body", "status:429", "reset-mid-body"]) {
        gw.fake!.setBehavior(behavior);
        const res = await gw.decide(body, headers);
        await errorBody(res, 502);
        assert.deepEqual(await gw.store.getBalance(gw.orgId), { available: GRANT, reserved: 0, spent: 0, granted: GRANT }, behavior);
      }
      gw.fake!.setBehavior(null);
      const ok = await gw.decide(body, headers);
      const first = await ok.text();
      assert.equal(ok.status, 200, first);
      const cost = JSON.parse(first).usage.cost_microusd as number;
      const replay = await gw.decide(body, headers);
      assert.equal(replay.status, 200);
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.equal(await replay.text(), first, "the stored response, byte for byte");
      const balance = await assertLedgerMatches(gw.store, gw.orgId);
      assert.deepEqual(balance, { available: GRANT - cost, reserved: 0, spent: cost, granted: GRANT }, "charged once");
      assert.equal(gw.fake!.calls.decide, 4, "three failures and one success reached the model; the replay did not");
      const usage = await allUsage(gw.store, gw.orgId);
      assert.deepEqual(usage.map((r) => r.outcome).sort(), ["model_error", "model_error", "model_error", "succeeded"]);
    } finally {
      await gw.close();
    }
  });
});
