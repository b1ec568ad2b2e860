import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { Balance } from "../../src/domain/credits.ts";
import { formatUsd } from "../../src/domain/money.ts";
import type { ModelService } from "../../src/models/model-service.ts";
import { openSystemOneHttpService } from "../../src/models/systemone-http/systemone-http-service.ts";
import { startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { assertLedgerMatches } from "../support/books.ts";
import { assertShape, errorBody, json } from "../support/contract-check.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { type Gateway, sampleRequest, startGateway, TICKET_HISTORY } from "../support/gateway-harness.ts";
import { GENEROUS_MODEL_TIMEOUT_MS, HELD_ANSWERS, startShortDeadlineGateway } from "../support/model-deadlines.ts";
import { startModelGate } from "../support/model-gate.ts";
import { byteBound } from "../support/token-bound.ts";

/** 1 USD per million input tokens = 1 microUSD per token: a request reserves its token bound in microUSD. */
const PAID = {
  TDS_SERVICE_MODE: "paid",
  TDS_PRICE_PER_MILLION_INPUT_USD: "1",
  TDS_REQUESTS_PER_MINUTE: "100000",
};

describe("paid mode", () => {
  test("credits for exactly k reservations, 5k parallel requests: exactly k succeed, the rest get 402, the books balance", async () => {
    const k = 12;
    const total = 5 * k;
    const fake = await startFakeModelServer();
    // Every model call waits at the gate until each request is either refused or waiting there: every reservation
    // is attempted before any is settled, however slowly the machine runs.
    const gate = await startModelGate(fake.url);
    const gw = await startGateway({ fake: false, env: { ...PAID, TDS_MODEL_SERVICE_URL: gate.url } });
    try {
      // Every reservation is the request's token bound (its bytes and the template overhead) × 1 USD per million.
      const body = sampleRequest();
      const bound = byteBound(body);
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: k * bound, nowMs: Date.now() });
      let answered = 0;
      let pending: Promise<Response>[] = [];
      await new Promise<void>((allDecided) => {
        const checkDecided = () => {
          if (answered + gate.held() === total) allDecided();
        };
        gate.onHold(checkDecided);
        pending = Array.from({ length: total }, () =>
          gw.decide(body).finally(() => {
            answered++;
            checkDecided();
          }),
        );
      });
      assert.equal(gate.held(), k, "exactly k admitted, each waiting for the model");
      assert.equal(answered, 4 * k, "the rest answered before any model call");
      gate.open();
      const responses = await Promise.all(pending);
      const ok = responses.filter((r) => r.status === 200);
      const refused = responses.filter((r) => r.status === 402);
      assert.equal(ok.length, k);
      assert.equal(refused.length, 4 * k);
      for (const r of refused)
        assert.ok(
          (await errorBody(r, 402)).detail.includes(
            `cannot cover the reservation of this request: ${formatUsd(bound)} USD for at most ${bound} input and 3 output tokens`,
          ),
        );
      let charged = 0;
      for (const r of ok) {
        const b = await json(r);
        assertShape("decision", b);
        assert.equal(b.service_mode, "paid");
        assert.equal(b.usage.cost_microusd, b.usage.input_tokens, "1 microUSD per input token");
        assert.equal(b.usage.price_per_million_input_usd, "1");
        charged += b.usage.cost_microusd;
      }
      const balance = await assertLedgerMatches(gw.store, gw.orgId);
      assert.deepEqual(balance, { available: k * bound - charged, reserved: 0, spent: charged, granted: k * bound });
      assert.equal(fake.calls.decide, k, "no model call for a 402");
      assert.equal((await gw.store.listUsage(gw.orgId, { limit: 200 })).records.length, k, "nothing recorded for a 402");
    } finally {
      gate.open();
      await gw.close();
      await gate.close();
      await fake.close();
    }
  });

  test("cost fields are exact decimal strings of the integer cost", async () => {
    const gw = await startGateway({ env: { ...PAID, TDS_PRICE_PER_MILLION_INPUT_USD: "0.25", TDS_PRICE_PER_MILLION_OUTPUT_USD: "2" } });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 5_000_000, nowMs: Date.now() });
      const overReported = sampleRequest({ state: { fake_behavior: "tokens:1000001:3", history: TICKET_HISTORY } });
      const res = await gw.decide(overReported);
      const tooMany = await json(res);
      assert.equal(res.status, 200);
      // The reservation: the bound's input tokens × 0.25 + 3 output × 2 USD per million, rounded up.
      const reservation = Math.ceil((byteBound(overReported) * 250_000 + 3 * 2_000_000) / 1_000_000);
      assert.equal(tooMany.usage.cost_microusd, reservation, "reported beyond its bound: charged the reservation");
      const record = await gw.store.getUsage(gw.orgId, tooMany.request_id);
      assert.equal(record?.overReservation, true);

      const b = await json(await gw.decide(sampleRequest({ state: { fake_behavior: "tokens:7:3" } })));
      // 7 × 0.25 + 3 × 2 = 7.75 microUSD → 8, rounded up to a whole microUSD.
      assert.equal(b.usage.cost_microusd, 8);
      assert.equal(b.usage.cost_usd, "0.000008");
      assert.equal(b.usage.price_per_million_input_usd, "0.25");
      assert.equal((await gw.store.getBalance(gw.orgId)).available, 5_000_000 - reservation - 8);
      await assertLedgerMatches(gw.store, gw.orgId);
    } finally {
      await gw.close();
    }
  });

  test("every model failure leaves the balance exactly as it was and records the outcome", async () => {
    // Only the answer the fake holds forever meets a short deadline; every other call gets a generous one.
    const generous = await startGateway({ env: { ...PAID, TDS_MODEL_TIMEOUT_MS: GENEROUS_MODEL_TIMEOUT_MS } });
    const shortDeadline = await startShortDeadlineGateway({ env: PAID });
    try {
      const before = new Map<Gateway, Balance>();
      for (const g of [generous, shortDeadline]) {
        await g.store.grantCredits({ orgId: g.orgId, amountMicrousd: 10_000, nowMs: Date.now() });
        before.set(g, await g.store.getBalance(g.orgId));
      }
      for (const [behavior, status, outcome] of [
        ["hang", 502, "model_error"],
        ["reset", 502, "model_error"],
        ["reset-mid-body", 502, "model_error"],
        ["status:500", 502, "model_error"],
        ["status:429", 502, "model_error"],
        ["garbage", 502, "model_error"],
        ["no-usage", 502, "model_error"],
        ["wrong-options", 502, "model_error"],
        ["bad-probabilities", 502, "model_error"],
        ["context-rejected", 422, "context_rejected"],
      ] as const) {
        const gw = HELD_ANSWERS.has(behavior) ? shortDeadline : generous;
        const res = await gw.decide(sampleRequest({ state: { fake_behavior: behavior } }));
        await errorBody(res, status);
        const record = await gw.store.getUsage(gw.orgId, res.headers.get("x-service-request-id")!);
        assert.equal(record?.outcome, outcome, behavior);
        assert.equal(record?.costMicrousd, 0);
        assert.deepEqual(await gw.store.getBalance(gw.orgId), before.get(gw), `balance unchanged after ${behavior}`);
        assert.equal((await gw.store.getReservation(record!.requestId))?.status, "released");
      }
      for (const g of [generous, shortDeadline]) await assertLedgerMatches(g.store, g.orgId);
    } finally {
      await Promise.all([generous.close(), shortDeadline.close()]);
    }
  });

  test("a reservation that expires during the model call gives 409 and charges nothing", async () => {
    const clock = new FixedClock(Date.parse("2026-11-26T10:00:00Z"));
    const fake = await startFakeModelServer();
    const upstream = openSystemOneHttpService({ baseUrl: fake.url });
    // A model call that outlives the reservation: the clock passes its expiry while the model works.
    const slow: ModelService = {
      listModels: (o) => upstream.listModels(o),
      decide: async (call, o) => {
        const answer = await upstream.decide(call, o);
        clock.advance(121_000);
        return answer;
      },
      close: () => upstream.close(),
    };
    const gw = await startGateway({ clock, modelService: slow, env: { ...PAID, TDS_RESERVATION_TTL_SECONDS: "120" } });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 5000, nowMs: clock.nowMs() });
      const res = await gw.decide(sampleRequest());
      const body = await errorBody(res, 409);
      assert.match(body.detail, /reservation expired.*Check Usage/);
      const record = await gw.store.getUsage(gw.orgId, res.headers.get("x-service-request-id")!);
      assert.equal(record?.outcome, "reservation_expired");
      assert.equal(record?.httpStatus, 409);
      assert.equal(record?.costMicrousd, 0);
      assert.equal((await gw.store.getReservation(record!.requestId))?.status, "expired");
      const balance = await assertLedgerMatches(gw.store, gw.orgId);
      assert.deepEqual(balance, { available: 5000, reserved: 0, spent: 0, granted: 5000 });
    } finally {
      await gw.close();
      await fake.close();
    }
  });

  test("the sweep completes a request left in flight (a crash after admission): nothing charged, a final record", async () => {
    const clock = new FixedClock(Date.parse("2026-11-26T10:00:00Z"));
    const gw = await startGateway({ clock, env: PAID });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 3000, nowMs: clock.nowMs() });
      const admitted = await gw.store.commitBatch({
        admissions: [
          {
            requestId: "req_stuck",
            orgId: gw.orgId,
            keyId: gw.keyId,
            source: "api",
            model: "fake-small",
            mode: "paid",
            nowMs: clock.nowMs(),
            idempotency: null,
            quota: null,
            reservation: { amountMicrousd: 1000, expiresAtMs: clock.nowMs() + 120_000 },
          },
        ],
        completions: [],
      });
      assert.deepEqual(admitted.admissions, [{ kind: "admitted" }]);
      assert.equal((await gw.store.getUsage(gw.orgId, "req_stuck"))?.outcome, "in_flight");
      clock.advance(120_000);
      assert.deepEqual(await gw.app.sweepBooks(), { abandoned: 0 }, "in flight for exactly the TTL: not yet");
      clock.advance(1);
      assert.deepEqual(await gw.app.sweepBooks(), { abandoned: 1 });
      assert.deepEqual(await gw.store.getBalance(gw.orgId), { available: 3000, reserved: 0, spent: 0, granted: 3000 });
      assert.equal((await gw.store.getReservation("req_stuck"))?.status, "expired");
      const record = await gw.store.getUsage(gw.orgId, "req_stuck");
      assert.deepEqual(
        [record?.outcome, record?.httpStatus, record?.costMicrousd, record?.completedAtMs],
        ["gateway_error", null, 0, clock.nowMs()],
      );
      assert.deepEqual(await gw.app.sweepBooks(), { abandoned: 0 });
    } finally {
      await gw.close();
    }
  });

  test("/api/config publishes the paid prices and the reservation rule", async () => {
    const gw = await startGateway({ env: { ...PAID, TDS_PRICE_PER_MILLION_OUTPUT_USD: "0.10", TDS_RESERVE_TOKENS: "1000" } });
    try {
      const config = await json(await fetch(`${gw.url}/api/config`));
      assert.equal(config.service_mode, "paid");
      assert.equal(config.pricing.price_per_million_input_usd, "1");
      assert.equal(config.pricing.price_per_million_output_usd, "0.1");
      assert.equal(config.limits.reserve_tokens, 1000);
      assert.equal(config.pricing.reservation.cap_tokens, 1000);
      assert.equal(config.pricing.reservation.over_cap_status, 413);
      assert.match(config.pricing.reservation.rule, /max_state.*exceeds cap_tokens is refused with over_cap_status before the model call/s);
    } finally {
      await gw.close();
    }
  });
});
