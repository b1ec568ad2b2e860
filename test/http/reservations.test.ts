import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { PROMPT_OVERHEAD_TOKENS, QUESTION_OVERHEAD_TOKENS } from "../../src/gateway/token-bound.ts";
import { DEFAULT_FAKE_MODELS } from "../fixtures/fake-model-server.ts";
import { allUsage, assertLedgerMatches, eventually, requestEntries } from "../support/books.ts";
import { errorBody, json } from "../support/contract-check.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";
import { byteBound } from "../support/token-bound.ts";

/** 1000 USD per million input tokens: 1000 microUSD per token. Output is not billed. */
const DEAR = { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1000" };
/** fake-small publishes a context (max_state 4096, max_branch 6144); fake-large publishes none. */
const SMALL_MAX_STATE = DEFAULT_FAKE_MODELS[0]!.context!.max_state!;

/** A paid body for `model` whose state carries `bytes` bytes of text. */
function bigBody(model: string, bytes: number, behavior = "ok") {
  return { model, state: { fake_behavior: behavior, log: "x".repeat(bytes) }, questions: { a: { type: "noul" } } };
}

/** Grants `amount` and returns the balance to expect back untouched. */
async function granted(gw: Gateway, amount: number) {
  await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: amount, nowMs: Date.now() });
  return gw.store.getBalance(gw.orgId);
}

describe("paid reservations sized to the request", () => {
  test("a small request reserves what it can cost at most, and runs on a balance far below reserve_tokens' worth", async () => {
    const gw = await startGateway({ env: DEAR });
    try {
      // 5 USD: reserve_tokens (32768) worth would be 32.77 USD.
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 5_000_000, nowMs: Date.now() });
      const body = { state: { fake_behavior: "delay:600", ticket: "Refund please" }, questions: { refund: { type: "noul" } } };
      const pending = gw.decide(body);
      const expected = byteBound(body) * 1000;
      await eventually("reserved while the model works", async () => (await gw.store.getBalance(gw.orgId)).reserved > 0);
      assert.deepEqual(await gw.store.getBalance(gw.orgId), {
        available: 5_000_000 - expected,
        reserved: expected,
        spent: 0,
        granted: 5_000_000,
      });
      const res = await pending;
      const answer = await json(res);
      assert.equal(res.status, 200, JSON.stringify(answer));
      assert.ok(answer.usage.input_tokens < byteBound(body), "an honest model service reports less than the bound");
      assert.equal(answer.usage.cost_microusd, answer.usage.input_tokens * 1000);
      const record = await gw.store.getUsage(gw.orgId, answer.request_id);
      assert.equal(record?.overReservation, false);
      assert.deepEqual(await assertLedgerMatches(gw.store, gw.orgId), {
        available: 5_000_000 - answer.usage.cost_microusd,
        reserved: 0,
        spent: answer.usage.cost_microusd,
        granted: 5_000_000,
      });
    } finally {
      await gw.close();
    }
  });

  test("a request whose bound exceeds reserve_tokens is refused before the model call: 413, nothing recorded or charged", async () => {
    const gw = await startGateway({ env: DEAR, fake: { maxInputTokens: 1_000_000 } });
    try {
      const before = await granted(gw, 500_000_000);
      // ~300 KB of state: the fake would honestly report ~75,000 input tokens, far more than reserve_tokens (32768).
      const body = bigBody("fake-large", 300_000);
      const headers = { "idempotency-key": "big-one" };
      const res = await gw.decide(body, headers);
      const { detail } = await errorBody(res, 413);
      assert.ok(detail.includes(`up to ${byteBound(body)} input and 1 output tokens`), detail);
      assert.match(detail, /more than reserve_tokens \(32768\)/);
      assert.match(detail, /no context of the model lowers it/);
      assert.match(detail, /nothing was charged/);
      assert.equal(gw.fake!.calls.decide, 0, "the model was not called");
      assert.deepEqual(await gw.store.getBalance(gw.orgId), before, "the balance is unchanged");
      assert.deepEqual(await allUsage(gw.store, gw.orgId), [], "no usage record");
      assert.equal(await gw.store.getReservation(res.headers.get("x-service-request-id")!), null, "no reservation");
      assert.deepEqual(await requestEntries(gw.store, gw.orgId), [], "no ledger entry");

      // The Idempotency-Key was not claimed either: the same key with a body that fits is simply accepted.
      const small = await gw.decide(bigBody("fake-large", 100), headers);
      assert.equal(small.status, 200, await small.clone().text());
      assert.equal((await allUsage(gw.store, gw.orgId)).length, 1);
      await assertLedgerMatches(gw.store, gw.orgId);
    } finally {
      await gw.close();
    }
  });

  test("with reserve_tokens above the bound, the honest report is charged in full: cost = reported tokens × price", async () => {
    const gw = await startGateway({ env: { ...DEAR, TDS_RESERVE_TOKENS: "400000" }, fake: { maxInputTokens: 1_000_000 } });
    try {
      await granted(gw, 800_000_000);
      const body = bigBody("fake-large", 300_000);
      const res = await gw.decide(body);
      const answer = await json(res);
      assert.equal(res.status, 200, JSON.stringify(answer));
      assert.ok(answer.usage.input_tokens > 75_000, `the fake reports its count: ${answer.usage.input_tokens}`);
      assert.equal(answer.usage.cost_microusd, answer.usage.input_tokens * 1000);
      assert.equal((await gw.store.getUsage(gw.orgId, answer.request_id))?.overReservation, false);

      // A report of exactly the bound is still within it: charged in full, not flagged. (The bound of a body that
      // names a six-digit count is that of the same body naming 000000.)
      const bound = byteBound(bigBody("fake-large", 300_000, "tokens:000000:1"));
      assert.equal(String(bound).length, 6);
      const full = await json(await gw.decide(bigBody("fake-large", 300_000, `tokens:${bound}:1`)));
      assert.equal(full.usage.input_tokens, bound);
      assert.equal(full.usage.cost_microusd, bound * 1000);
      assert.equal((await gw.store.getUsage(gw.orgId, full.request_id))?.overReservation, false);
      const spent = answer.usage.cost_microusd + full.usage.cost_microusd;
      assert.deepEqual(
        (await requestEntries(gw.store, gw.orgId)).map((e) => [e.kind, e.reservationId, e.availableDelta, e.spentDelta]),
        [
          ["settle", answer.request_id, -answer.usage.cost_microusd, answer.usage.cost_microusd],
          ["settle", full.request_id, -full.usage.cost_microusd, full.usage.cost_microusd],
        ],
        "one ledger entry per paid request, written at its completion",
      );
      assert.deepEqual(await assertLedgerMatches(gw.store, gw.orgId), {
        available: 800_000_000 - spent,
        reserved: 0,
        spent,
        granted: 800_000_000,
      });
    } finally {
      await gw.close();
    }
  });

  test("a model's published context limits the bound: a request over reserve_tokens in bytes but within the context runs", async () => {
    const gw = await startGateway({ env: { ...DEAR, TDS_RESERVE_TOKENS: "8000" } });
    try {
      await granted(gw, 50_000_000);
      // 12 KB of state: over 12,000 tokens by its bytes, over reserve_tokens; fake-small evaluates at most max_state of it.
      const body = bigBody("fake-small", 12_000, "delay:600");
      assert.ok(byteBound(body) > 8000);
      const contextBound =
        PROMPT_OVERHEAD_TOKENS + SMALL_MAX_STATE + Buffer.byteLength(JSON.stringify(body.questions)) + QUESTION_OVERHEAD_TOKENS;
      const pending = gw.decide(body);
      await eventually("reserved while the model works", async () => (await gw.store.getBalance(gw.orgId)).reserved > 0);
      assert.equal((await gw.store.getBalance(gw.orgId)).reserved, contextBound * 1000, "the reservation is the context's bound");
      const res = await pending;
      const answer = await json(res);
      assert.equal(res.status, 200, JSON.stringify(answer));
      assert.ok(answer.usage.input_tokens < contextBound);
      assert.equal(answer.usage.cost_microusd, answer.usage.input_tokens * 1000, "charged in full");
      assert.equal((await gw.store.getUsage(gw.orgId, answer.request_id))?.overReservation, false);

      // A report beyond what the context let it evaluate: charged the reservation, flagged over_reservation.
      const beyond = await json(await gw.decide(bigBody("fake-small", 12_000, `tokens:${contextBound + 1}:1`)));
      assert.equal(beyond.usage.cost_microusd, contextBound * 1000);
      const flagged = await gw.store.getUsage(gw.orgId, beyond.request_id);
      assert.equal(flagged?.overReservation, true);
      assert.match(flagged?.errorDetail ?? "", /more than reserved; charged the reservation/);

      // The same request to a model without a context is bounded by its bytes only: refused.
      const before = await gw.store.getBalance(gw.orgId);
      const refused = await gw.decide(bigBody("fake-large", 12_000));
      const { detail } = await errorBody(refused, 413);
      assert.ok(detail.includes(`up to ${byteBound(bigBody("fake-large", 12_000))} input`), detail);
      assert.match(detail, /reserve_tokens \(8000\)/);
      assert.deepEqual(await gw.store.getBalance(gw.orgId), before);
      assert.equal((await allUsage(gw.store, gw.orgId)).length, 2);
      await assertLedgerMatches(gw.store, gw.orgId);
    } finally {
      await gw.close();
    }
  });
});
