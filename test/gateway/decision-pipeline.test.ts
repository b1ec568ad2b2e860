/**
 * The decision pipeline, admission and idempotency, imported directly and composed as src/app.ts composes them
 * (test/support/pipeline-harness.ts), on in-memory adapters: a SQLite :memory: store and its GroupCommit, the
 * in-process fake ModelService, a MemoryRateLimiter, and a FixedClock. No server, no socket, no real waiting.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, test } from "node:test";
import type { DecisionRequest, DecisionResponse } from "../../src/contract/decision.ts";
import { ERROR_CATALOGUE, type ErrorCode, ServiceError } from "../../src/domain/errors.ts";
import { IDEMPOTENCY_WINDOW_MS } from "../../src/domain/idempotency.ts";
import type { UsageOutcome } from "../../src/domain/usage-records.ts";
import { utcDay } from "../../src/domain/utc-day.ts";
import type { ModelErrorKind } from "../../src/models/model-service.ts";
import { allUsage, assertLedgerMatches } from "../support/books.ts";
import { ANSWER_MUTATIONS, MIXED_QUESTIONS } from "../support/fake-model-service.ts";
import { type PipelineRig, type PipelineRigOptions, rigsClosedAfterEach } from "../support/pipeline-harness.ts";

const BODY: DecisionRequest = {
  state: { ticket: "I was charged twice for my subscription this month.", customer_tier: "gold" },
  questions: MIXED_QUESTIONS,
};
const OTHER_BODY: DecisionRequest = { ...BODY, state: "a different state" };

/** Paid at 1 µUSD per input token and 2 per output token; the fake bounds every call at 400 input and 10 output tokens. */
const PAID: PipelineRigOptions = {
  env: {
    TDS_SERVICE_MODE: "paid",
    TDS_PRICE_PER_MILLION_INPUT_USD: "1",
    TDS_PRICE_PER_MILLION_OUTPUT_USD: "2",
    TDS_RESERVE_TOKENS: "1000",
  },
  model: { tokenBound: () => ({ input: 400, output: 10 }) },
};
/** 400 × 1 + 10 × 2 µUSD. */
const RESERVATION = 420;

const rig = rigsClosedAfterEach();

async function expectServiceError(promise: Promise<unknown>, code: ErrorCode): Promise<ServiceError> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof ServiceError, `expected a ServiceError, got ${String(err)}`);
    assert.equal(err.code, code, `code of "${err.message}"`);
    assert.equal(err.status, ERROR_CATALOGUE[code].status, "the catalogue's status");
    return err;
  }
  assert.fail(`expected ${code}`);
}

function responseOf(reply: { body: string }): DecisionResponse {
  return JSON.parse(reply.body) as DecisionResponse;
}

async function grant(r: PipelineRig, amountMicrousd: number, orgId = r.org.id): Promise<void> {
  await r.store.grantCredits({ orgId, amountMicrousd, nowMs: r.clock.nowMs() });
}

describe("preview admission and day quotas", () => {
  test("a preview decision is admitted, answered by the model and recorded; nothing charged, one count on each day counter", async () => {
    const r = await rig();
    const reply = await r.decide(BODY);
    assert.equal(reply.status, 200);
    assert.equal(reply.replayed, false);
    const body = responseOf(reply);
    assert.equal(body.model, "fake-small", "the default model: the first the service lists");
    assert.equal(body.service_mode, "preview");
    assert.equal(body.request_id, reply.requestId);
    assert.deepEqual(Object.keys(body.answers), Object.keys(MIXED_QUESTIONS));
    assert.deepEqual(
      { cost: body.usage.cost_microusd, usd: body.usage.cost_usd, price: body.usage.price_per_million_input_usd },
      { cost: 0, usd: "0", price: null },
    );
    // The model got the request's own text, under the name its service knows.
    assert.equal(r.model.calls.decide, 1);
    assert.deepEqual(r.model.received[0]?.text, { state: JSON.stringify(BODY.state), questions: JSON.stringify(BODY.questions) });
    assert.equal(r.model.received[0]?.model, "fake-small");

    const record = await r.store.getUsage(r.org.id, reply.requestId);
    assert.ok(record);
    assert.equal(record.outcome, "succeeded");
    assert.equal(record.httpStatus, 200);
    assert.equal(record.mode, "preview");
    assert.equal(record.costMicrousd, 0);
    assert.equal(record.inputTokens, body.usage.input_tokens);
    assert.equal(record.outputTokens, 3);
    assert.equal(record.deployment, r.serviceName);
    assert.equal(record.attempts, 1);
    assert.equal(record.createdAtMs, r.clock.nowMs(), "recorded at the injected clock's time");
    assert.deepEqual(await r.store.previewUsage(r.org.id, utcDay(r.clock.nowMs())), { org: 1, global: 1 });
    assert.equal(r.events.decided, 1);
  });

  test("the org and global day quotas refuse with 429 until 00:00 UTC, and the day turns exactly at midnight", async () => {
    const r = await rig({
      env: { TDS_PREVIEW_REQUEST_LIMIT: "2", TDS_PREVIEW_GLOBAL_REQUEST_LIMIT: "3" },
      startMs: Date.parse("2026-03-01T23:59:58.000Z"),
    });
    const other = await r.newOrg("other-org");
    await r.decide(BODY);
    await r.decide(BODY);
    const org = await expectServiceError(r.decide(BODY), "preview_quota_org");
    assert.equal(org.extra.retryAfterMs, 2000, "until 00:00:00.000 UTC");
    assert.match(org.detail ?? "", /preview_request_limit = 2/);

    await r.decide(BODY, { org: other.org, keyId: other.keyId });
    const global = await expectServiceError(r.decide(BODY, { org: other.org, keyId: other.keyId }), "preview_quota_global");
    assert.match(global.detail ?? "", /preview_global_request_limit = 3/);

    r.clock.set(Date.parse("2026-03-01T23:59:59.999Z"));
    assert.equal((await expectServiceError(r.decide(BODY), "preview_quota_org")).extra.retryAfterMs, 1);
    await expectServiceError(r.decide(BODY, { org: other.org, keyId: other.keyId }), "preview_quota_global");

    r.clock.set(Date.parse("2026-03-02T00:00:00.000Z"));
    assert.equal((await r.decide(BODY)).status, 200, "a new day for the organization");
    assert.equal((await r.decide(BODY, { org: other.org, keyId: other.keyId })).status, 200, "and for the service");

    assert.deepEqual(await r.store.previewUsage(r.org.id, "2026-03-01"), { org: 2, global: 3 });
    assert.deepEqual(await r.store.previewUsage(r.org.id, "2026-03-02"), { org: 1, global: 2 });
    assert.equal(r.model.calls.decide, 5, "refused requests never reach the model");
    assert.equal((await allUsage(r.store, r.org.id)).length, 3, "nor the usage records");
    assert.equal((await allUsage(r.store, other.org.id)).length, 2);
    assert.deepEqual(r.events.rejected, ["preview_quota_org", "preview_quota_global", "preview_quota_org", "preview_quota_global"]);
  });

  test("TDS_PREVIEW_GLOBAL_BLOCK: the service-wide counter takes that many units at once, the organization's counts each request", async () => {
    const sharedRow = (r: Awaited<ReturnType<typeof rig>>) => {
      const db = (r.store as unknown as { db: import("better-sqlite3").Database }).db;
      return (db.prepare("SELECT count FROM preview_counters WHERE scope = '*'").get() as { count: number } | undefined)?.count;
    };
    for (const [block, expected] of [
      ["2", [2, 2, 4]],
      ["1", [1, 2, 3]],
    ] as const) {
      const r = await rig({ env: { TDS_PREVIEW_GLOBAL_BLOCK: block } });
      const rows = [];
      for (let i = 0; i < 3; i++) {
        await r.decide(BODY);
        rows.push(sharedRow(r));
      }
      // 100,000 allowed (the default): the block is not cut down near the limit.
      assert.deepEqual(rows, expected, `block ${block}`);
      assert.deepEqual(await r.store.previewUsage(r.org.id, utcDay(r.clock.nowMs())), { org: 3, global: 3 });
    }
  });

  test("accepted requests whose model call fails still use the day's quota", async () => {
    const r = await rig({ env: { TDS_PREVIEW_REQUEST_LIMIT: "1" } });
    r.model.failNext("unavailable");
    await expectServiceError(r.decide(BODY), "model_unavailable");
    await expectServiceError(r.decide(BODY), "preview_quota_org");
    assert.deepEqual(await r.store.previewUsage(r.org.id, utcDay(r.clock.nowMs())), { org: 1, global: 1 });
  });

  test("the per-minute limit (MemoryRateLimiter on the same clock) refuses before admission, and frees up 60 s later", async () => {
    const r = await rig({ env: { TDS_REQUESTS_PER_MINUTE: "2" } });
    await r.decide(BODY);
    r.clock.advance(10_000);
    await r.decide(BODY);
    const limited = await expectServiceError(r.decide(BODY), "rate_limited");
    assert.equal(limited.extra.retryAfterMs, 50_000, "when the first of the two leaves the window");
    assert.equal(r.model.calls.decide, 2);
    assert.equal((await allUsage(r.store, r.org.id)).length, 2, "nothing recorded for it");
    assert.deepEqual(
      await r.store.previewUsage(r.org.id, utcDay(r.clock.nowMs())),
      { org: 2, global: 2 },
      "nor counted in the day's quota",
    );
    r.clock.advance(50_000);
    assert.equal((await r.decide(BODY)).status, 200);
    assert.deepEqual(r.events.rejected, ["rate_limited"]);
  });

  test("max_questions is checked on the parsed body before anything else", async () => {
    const r = await rig({ env: { TDS_MAX_QUESTIONS: "2" } });
    const err = await expectServiceError(r.decide(BODY), "invalid_body");
    assert.deepEqual(err.extra.errors, [{ field: "questions", message: "must have at most 2 questions (max_questions); got 3" }]);
    assert.equal(r.model.calls.decide, 0);
  });
});

describe("paid mode: reservation, settlement, release", () => {
  test("reserves the token bound's worth while the model runs, then settles the actual cost", async () => {
    const r = await rig(PAID);
    await grant(r, 1000);
    const held = r.model.holdNext({ usage: { input_tokens: 120, output_tokens: 3 } });
    const pending = r.decide(BODY, { requestId: "req_paid_1" });
    await held.started;
    assert.deepEqual(await r.store.getBalance(r.org.id), { available: 1000 - RESERVATION, reserved: RESERVATION, spent: 0, granted: 1000 });
    assert.equal((await r.store.getReservation("req_paid_1"))?.status, "pending");
    assert.equal((await r.store.getUsage(r.org.id, "req_paid_1"))?.outcome, "in_flight");
    held.release();

    const body = responseOf(await pending);
    assert.equal(body.service_mode, "paid");
    assert.deepEqual(body.usage, {
      input_tokens: 120,
      output_tokens: 3,
      cost_microusd: 126,
      cost_usd: "0.000126",
      price_per_million_input_usd: "1",
    });
    assert.deepEqual(await r.store.getBalance(r.org.id), { available: 874, reserved: 0, spent: 126, granted: 1000 });
    const reservation = await r.store.getReservation("req_paid_1");
    assert.equal(reservation?.amountMicrousd, RESERVATION);
    assert.equal(reservation?.status, "settled");
    assert.equal(reservation?.costMicrousd, 126);
    const record = await r.store.getUsage(r.org.id, "req_paid_1");
    assert.equal(record?.outcome, "succeeded");
    assert.equal(record?.costMicrousd, 126);
    assert.equal(record?.overReservation, false);
    assert.deepEqual(
      (await r.store.listLedger(r.org.id)).map((e) => e.kind),
      ["grant", "settle"],
    );
    await assertLedgerMatches(r.store, r.org.id);
    assert.deepEqual(r.events.reservation, ["reserved", "settled"]);
    assert.equal(r.model.calls.tokenBound, 1, "the bound is asked of the model service");
  });

  test("a reservation is the whole token bound at the model's price; a count over reserve_tokens is refused with 413", async () => {
    const r = await rig(PAID);
    const model = await r.registry.resolve(null);
    assert.deepEqual(r.admission.reservationAmount(model, { input: 400, output: 10 }), {
      amount: RESERVATION,
      tokens: { input: 400, output: 10 },
    });
    assert.deepEqual(
      r.admission.reservationAmount(model, { input: 1000, output: 1000 }),
      { amount: 1000 + 2000, tokens: { input: 1000, output: 1000 } },
      "exactly reserve_tokens of each is reserved in full",
    );
    for (const bound of [
      { input: 5000, output: 10 },
      { input: 400, output: 1001 },
      { input: 1001, output: 1 },
    ]) {
      const err = await expectServiceError((async () => r.admission.reservationAmount(model, bound))(), "token_bound_over_reserve");
      assert.equal(err.status, 413);
      assert.ok(err.detail?.includes(`up to ${bound.input} input and ${bound.output} output tokens`), err.detail);
      assert.match(err.detail ?? "", /more than reserve_tokens \(1000\)/);
    }
    assert.deepEqual(r.events.rejected, Array(3).fill("token_bound_over_reserve"), "each refusal is counted");
  });

  test("a request whose bound exceeds reserve_tokens: 413 before the model call, nothing reserved, recorded or charged", async () => {
    const r = await rig({ ...PAID, model: { tokenBound: () => ({ input: 5000, output: 10 }) } });
    await grant(r, 1_000_000);
    const err = await expectServiceError(r.decide(BODY, { requestId: "req_over", idempotencyKey: "over-1" }), "token_bound_over_reserve");
    assert.match(err.detail ?? "", /up to 5000 input and 10 output tokens \(its token bound: counted by the model service\)/);
    assert.match(err.detail ?? "", /nothing was charged/);
    assert.equal(r.model.calls.decide, 0, "the model was not called");
    assert.equal(await r.store.getReservation("req_over"), null);
    assert.deepEqual(await allUsage(r.store, r.org.id), []);
    assert.deepEqual(await r.store.getBalance(r.org.id), { available: 1_000_000, reserved: 0, spent: 0, granted: 1_000_000 });
    assert.deepEqual(
      (await r.store.listLedger(r.org.id)).map((e) => e.kind),
      ["grant"],
    );
    assert.deepEqual(r.events.reservation, []);
    assert.deepEqual(r.events.rejected, ["token_bound_over_reserve"]);
  });

  test("usage beyond the reservation is charged the reservation, and flagged", async () => {
    const r = await rig(PAID);
    await grant(r, 1000);
    r.model.script({ usage: { input_tokens: 5000, output_tokens: 0 } });
    const reply = await r.decide(BODY);
    assert.equal(responseOf(reply).usage.cost_microusd, RESERVATION);
    const record = await r.store.getUsage(r.org.id, reply.requestId);
    assert.equal(record?.overReservation, true);
    assert.match(record?.errorDetail ?? "", /more than reserved; charged the reservation/);
    assert.deepEqual(await r.store.getBalance(r.org.id), { available: 1000 - RESERVATION, reserved: 0, spent: RESERVATION, granted: 1000 });
  });

  test("insufficient credits: 402 with the amounts, nothing reserved or recorded, the model not called; exactly enough is admitted", async () => {
    const r = await rig(PAID);
    await grant(r, RESERVATION - 1);
    const err = await expectServiceError(r.decide(BODY), "insufficient_credits");
    assert.match(
      err.detail ?? "",
      /Available credits \(0\.000419 USD\) cannot cover the reservation of this request: 0\.00042 USD for at most 400 input and 10 output tokens/,
    );
    assert.deepEqual(await r.store.getBalance(r.org.id), { available: RESERVATION - 1, reserved: 0, spent: 0, granted: RESERVATION - 1 });
    assert.equal(r.model.calls.decide, 0);
    assert.equal((await allUsage(r.store, r.org.id)).length, 0);
    assert.deepEqual(r.events.reservation, ["insufficient"]);
    assert.deepEqual(r.events.rejected, ["insufficient_credits"]);

    await grant(r, 1);
    assert.equal((await r.decide(BODY)).status, 200);
  });

  test("a model failure releases the reservation: nothing charged, the failure recorded", async () => {
    const r = await rig(PAID);
    await grant(r, 1000);
    r.model.failNext("unavailable", 1, "connection refused (fake)");
    await expectServiceError(r.decide(BODY, { requestId: "req_failed" }), "model_unavailable");
    assert.deepEqual(await r.store.getBalance(r.org.id), { available: 1000, reserved: 0, spent: 0, granted: 1000 });
    assert.equal((await r.store.getReservation("req_failed"))?.status, "released");
    assert.deepEqual(
      (await r.store.listLedger(r.org.id)).map((e) => e.kind),
      ["grant", "release"],
    );
    const record = await r.store.getUsage(r.org.id, "req_failed");
    assert.equal(record?.outcome, "model_error");
    assert.equal(record?.httpStatus, 502);
    assert.equal(record?.costMicrousd, 0);
    assert.equal(
      record?.errorDetail,
      `The model service (deployment ${JSON.stringify(r.serviceName)}) is unavailable; no credits were charged (request req_failed).`,
    );
    assert.match(r.modelFailures[0]?.reason ?? "", /connection refused \(fake\)/, "the adapter's words go to the log");
    await assertLedgerMatches(r.store, r.org.id);
    assert.deepEqual(r.events.reservation, ["reserved", "released"]);
  });

  test("a reservation that expires during the model call: 409 reservation_expired, nothing charged", async () => {
    const r = await rig(PAID);
    await grant(r, 1000);
    const held = r.model.holdNext();
    const pending = r.decide(BODY, { requestId: "req_late" });
    await held.started;
    r.clock.advance(r.config.reservationTtlSeconds * 1000);
    held.release();
    await expectServiceError(pending, "reservation_expired");
    assert.deepEqual(await r.store.getBalance(r.org.id), { available: 1000, reserved: 0, spent: 0, granted: 1000 });
    assert.equal((await r.store.getReservation("req_late"))?.status, "expired");
    const record = await r.store.getUsage(r.org.id, "req_late");
    assert.equal(record?.outcome, "reservation_expired");
    assert.equal(record?.httpStatus, ERROR_CATALOGUE.reservation_expired.status);
    assert.deepEqual(r.events.reservation, ["reserved", "expired"]);
  });
});

describe("idempotency", () => {
  test("the same key and body replays the stored response byte for byte, without a second charge or model call", async () => {
    const r = await rig(PAID);
    await grant(r, 10_000);
    const first = await r.decide(BODY, { idempotencyKey: "order-42" });
    const balance = await r.store.getBalance(r.org.id);
    const again = await r.decide(BODY, { idempotencyKey: "order-42" });
    assert.equal(again.replayed, true);
    assert.equal(again.body, first.body);
    assert.equal(again.requestId, first.requestId, "the first request's id");
    assert.deepEqual(await r.store.getBalance(r.org.id), balance);
    assert.equal(r.model.calls.decide, 1);
    assert.equal((await allUsage(r.store, r.org.id)).length, 1);
    assert.deepEqual(r.events.reservation, ["reserved", "settled"]);

    const other = await r.newOrg("other-org");
    await grant(r, 10_000, other.org.id);
    const scoped = await r.decide(BODY, { org: other.org, keyId: other.keyId, idempotencyKey: "order-42" });
    assert.equal(scoped.replayed, false, "keys are per organization");
    assert.equal(r.model.calls.decide, 2);
  });

  test("the same key with another body → idempotency_key_reused (422); nothing charged or recorded", async () => {
    const r = await rig(PAID);
    await grant(r, 10_000);
    await r.decide(BODY, { idempotencyKey: "k" });
    const balance = await r.store.getBalance(r.org.id);
    await expectServiceError(r.decide(OTHER_BODY, { idempotencyKey: "k" }), "idempotency_key_reused");
    assert.deepEqual(await r.store.getBalance(r.org.id), balance);
    assert.equal(r.model.calls.decide, 1);
    assert.equal((await allUsage(r.store, r.org.id)).length, 1);
  });

  test("a key whose first request is still running → idempotency_in_progress (409), whatever the body; then the replay", async () => {
    const r = await rig(PAID);
    await grant(r, 10_000);
    const held = r.model.holdNext();
    const first = r.decide(BODY, { idempotencyKey: "k" });
    await held.started;
    await expectServiceError(r.decide(BODY, { idempotencyKey: "k" }), "idempotency_in_progress");
    await expectServiceError(r.decide(OTHER_BODY, { idempotencyKey: "k" }), "idempotency_in_progress");
    assert.equal(r.model.calls.decide, 1);
    held.release();
    const done = await first;
    const replay = await r.decide(BODY, { idempotencyKey: "k" });
    assert.equal(replay.replayed, true);
    assert.equal(replay.body, done.body);
    assert.equal((await allUsage(r.store, r.org.id)).length, 1);
  });

  test("a failed first attempt releases its key: the retry runs again, and its success is what is replayed", async () => {
    const r = await rig(PAID);
    await grant(r, 10_000);
    r.model.failNext("timeout");
    await expectServiceError(r.decide(BODY, { idempotencyKey: "k" }), "model_timeout");
    const retried = await r.decide(BODY, { idempotencyKey: "k" });
    assert.equal(retried.replayed, false);
    const replay = await r.decide(BODY, { idempotencyKey: "k" });
    assert.equal(replay.replayed, true);
    assert.equal(replay.body, retried.body);
    assert.equal(r.model.calls.decide, 2);
  });

  test("a claim left by a request that never completed blocks until its lock passes (the reservation TTL), then is taken over", async () => {
    const r = await rig(PAID);
    await grant(r, 10_000);
    const model = await r.registry.resolve(null);
    const hash = createHash("sha256").update(JSON.stringify(BODY)).digest("hex");
    const crashed = await r.admission.admit(
      { requestId: "req_crashed", org: r.org, keyId: r.keyId, source: "api", startedAt: performance.now() },
      model,
      { key: "k", requestHash: hash },
      { input: 400, output: 10 },
    );
    assert.equal(crashed.kind, "admitted");
    r.clock.advance(r.config.reservationTtlSeconds * 1000 - 1);
    await expectServiceError(r.decide(BODY, { idempotencyKey: "k" }), "idempotency_in_progress");
    r.clock.advance(1);
    const taken = await r.decide(BODY, { idempotencyKey: "k" });
    assert.equal(taken.replayed, false);
    const replay = await r.decide(BODY, { idempotencyKey: "k" });
    assert.equal(replay.requestId, taken.requestId);
    assert.equal((await r.store.getUsage(r.org.id, "req_crashed"))?.outcome, "in_flight", "left to the sweep");
  });

  test("a key is kept for 24 h: a day later the same request runs (and is charged) again", async () => {
    const r = await rig(PAID);
    await grant(r, 10_000);
    await r.decide(BODY, { idempotencyKey: "k" });
    r.clock.advance(IDEMPOTENCY_WINDOW_MS - 1);
    assert.equal((await r.decide(BODY, { idempotencyKey: "k" })).replayed, true);
    r.clock.advance(1);
    assert.equal((await r.decide(BODY, { idempotencyKey: "k" })).replayed, false);
    assert.equal(r.model.calls.decide, 2);
    assert.equal((await r.store.getBalance(r.org.id)).spent, 2 * responseOf(await r.decide(BODY)).usage.cost_microusd);
  });

  test("a replay is served even when the day's preview quota is used up, and counts nothing", async () => {
    const r = await rig({ env: { TDS_PREVIEW_REQUEST_LIMIT: "1" } });
    const first = await r.decide(BODY, { idempotencyKey: "k" });
    const replay = await r.decide(BODY, { idempotencyKey: "k" });
    assert.equal(replay.replayed, true);
    assert.equal(replay.body, first.body);
    await expectServiceError(r.decide(BODY), "preview_quota_org");
    assert.deepEqual(await r.store.previewUsage(r.org.id, utcDay(r.clock.nowMs())), { org: 1, global: 1 });
  });
});

describe("model failures are recorded with the catalogue's status", () => {
  const CASES: Array<{ kind: ModelErrorKind; code: ErrorCode; outcome: UsageOutcome }> = [
    { kind: "unavailable", code: "model_unavailable", outcome: "model_error" },
    { kind: "timeout", code: "model_timeout", outcome: "model_error" },
    { kind: "bad_status", code: "model_unavailable", outcome: "model_error" },
    { kind: "overloaded", code: "model_unavailable", outcome: "model_error" },
    { kind: "aborted", code: "model_unavailable", outcome: "model_error" },
    { kind: "invalid_response", code: "model_invalid_response", outcome: "model_error" },
    { kind: "not_ready", code: "model_not_ready", outcome: "model_error" },
    { kind: "context_rejected", code: "context_rejected", outcome: "context_rejected" },
    { kind: "refused", code: "model_invalid_response", outcome: "model_error" },
  ];

  test("every ModelErrorKind: the error's code and status, the usage record's outcome and status, nothing charged", async () => {
    const r = await rig(PAID);
    await grant(r, 10_000);
    for (const { kind, code, outcome } of CASES) {
      r.model.failNext(kind, 1, `scripted ${kind}`);
      const requestId = `req_${kind}`;
      const err = await expectServiceError(r.decide(BODY, { requestId }), code);
      const detail = err.detail ?? "";
      assert.doesNotMatch(detail, /scripted/, `${kind}: the model service's message stays in the log`);
      assert.ok(detail.includes(`(deployment ${JSON.stringify(r.serviceName)})`), `${kind}: names the deployment: ${detail}`);
      assert.ok(detail.endsWith(`; no credits were charged (request ${requestId}).`), `${kind}: names the request: ${detail}`);
      const report = r.modelFailures.at(-1);
      assert.deepEqual(
        { ...report, reason: undefined },
        { request_id: requestId, model: "fake-small", deployment: r.serviceName, attempts: 1, failure: kind, reason: undefined },
      );
      assert.match(report?.reason ?? "", new RegExp(`scripted ${kind}`), `${kind}: the log has the model service's message`);
      const record = await r.store.getUsage(r.org.id, requestId);
      assert.equal(record?.errorDetail, detail, `${kind}: the record says what the client was told`);
      assert.equal(record?.outcome, outcome, kind);
      assert.equal(record?.httpStatus, ERROR_CATALOGUE[code].status, `${kind}: recorded with the status answered`);
      assert.equal(record?.costMicrousd, 0);
      assert.equal(record?.deployment, r.serviceName);
      assert.equal(record?.attempts, 1);
      assert.equal((await r.store.getReservation(requestId))?.status, "released", kind);
    }
    assert.deepEqual(await r.store.getBalance(r.org.id), { available: 10_000, reserved: 0, spent: 0, granted: 10_000 });
    assert.deepEqual(
      r.events.modelFailed,
      CASES.map((c) => c.kind),
    );
    await assertLedgerMatches(r.store, r.org.id);
  });

  test("answers that do not match the questions: 502 model_invalid_response, the reported tokens recorded, nothing charged", async () => {
    const r = await rig(PAID);
    await grant(r, 10_000);
    r.model.script({ answers: ANSWER_MUTATIONS["missing-answer"]! });
    const err = await expectServiceError(r.decide(BODY, { requestId: "req_mismatch" }), "model_invalid_response");
    assert.equal(
      err.detail,
      `The model service (deployment ${JSON.stringify(r.serviceName)}) sent answers that do not match the questions; no credits were charged (request req_mismatch).`,
    );
    assert.equal(r.modelFailures[0]?.failure, "answers_mismatch");
    assert.match(r.modelFailures[0]?.reason ?? "", /^answer for question "topic" is missing$/);
    const record = await r.store.getUsage(r.org.id, "req_mismatch");
    assert.equal(record?.outcome, "model_error");
    assert.equal(record?.httpStatus, 502);
    assert.ok((record?.inputTokens ?? 0) > 0, "the model's token report is kept");
    assert.equal(record?.costMicrousd, 0);
    assert.equal((await r.store.getBalance(r.org.id)).available, 10_000);
    assert.deepEqual(r.events.modelFailed, ["answers_mismatch"]);
  });

  test("an exception from the model service (not a ModelServiceError): 502, recorded as model_error", async () => {
    const r = await rig(PAID);
    await grant(r, 10_000);
    r.model.script({ throws: new TypeError("a bug in the adapter") });
    const err = await expectServiceError(r.decide(BODY, { requestId: "req_bug" }), "model_invalid_response");
    assert.equal(err.detail, "The model service failed unexpectedly; no credits were charged (request req_bug).");
    assert.equal(r.modelFailures[0]?.failure, "unexpected");
    assert.equal(r.modelFailures[0]?.reason, "TypeError: a bug in the adapter");
    assert.equal((await r.store.getUsage(r.org.id, "req_bug"))?.outcome, "model_error");
    assert.equal((await r.store.getBalance(r.org.id)).reserved, 0);
    assert.deepEqual(r.events.modelFailed, ["unexpected"]);
  });

  test("the call's deadline (TDS_MODEL_TIMEOUT_MS) and the shutdown signal end a call that hangs", async () => {
    const r = await rig({ ...PAID, env: { ...PAID.env, TDS_MODEL_TIMEOUT_MS: "30" } });
    await grant(r, 10_000);
    r.model.script({ hang: true });
    await expectServiceError(r.decide(BODY, { requestId: "req_deadline" }), "model_timeout");
    assert.equal((await r.store.getUsage(r.org.id, "req_deadline"))?.httpStatus, 502);

    const shutdown = new AbortController();
    const held = r.model.holdNext();
    const pending = r.decide(BODY, { requestId: "req_shutdown", signal: shutdown.signal });
    await held.started;
    shutdown.abort();
    await expectServiceError(pending, "model_unavailable");
    const record = await r.store.getUsage(r.org.id, "req_shutdown");
    assert.equal(record?.outcome, "model_error");
    assert.equal((await r.store.getReservation("req_shutdown"))?.status, "released");
    assert.equal((await r.store.getBalance(r.org.id)).available, 10_000);
    held.release();
  });
});
