import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { PROMPT_OVERHEAD_TOKENS, QUESTION_OVERHEAD_TOKENS } from "../../src/gateway/token-bound.ts";
import { assertLedgerMatches, eventually } from "../support/books.ts";
import { json } from "../support/contract-check.ts";
import { startGateway } from "../support/gateway-harness.ts";

/** 1000 USD per million input tokens: 1000 microUSD per token. Output is not billed. */
const DEAR = { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1000" };

/** The token bound of a body: its state's and questions' UTF-8 bytes plus the template overhead. */
function inputBound(body: { state: unknown; questions: Record<string, unknown> }): number {
  const bytes = Buffer.byteLength(JSON.stringify(body.state)) + Buffer.byteLength(JSON.stringify(body.questions));
  return bytes + PROMPT_OVERHEAD_TOKENS + QUESTION_OVERHEAD_TOKENS * Object.keys(body.questions).length;
}

describe("paid reservations sized to the request", () => {
  test("a small request reserves what it can cost at most, and runs on a balance far below reserve_tokens' worth", async () => {
    const gw = await startGateway({ env: DEAR });
    try {
      // 5 USD: reserve_tokens (32768) worth would be 32.77 USD.
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 5_000_000, nowMs: Date.now() });
      const body = { state: { fake_behavior: "delay:600", ticket: "Refund please" }, questions: { refund: { type: "noul" } } };
      const pending = gw.decide(body);
      const expected = inputBound(body) * 1000;
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
      assert.ok(answer.usage.input_tokens < inputBound(body), "an honest model service reports less than the bound");
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

  test("a large request's reservation is capped at reserve_tokens' worth, and it is never refused for its size", async () => {
    const gw = await startGateway({
      env: { ...DEAR, TDS_RESERVE_TOKENS: "2000", TDS_PRICE_PER_MILLION_OUTPUT_USD: "1000" },
      fake: { maxInputTokens: 1_000_000 },
    });
    try {
      // Enough for the cap (2000 input + 3 output tokens), far from enough for the request's bound (~60,000 tokens).
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 2_003_000, nowMs: Date.now() });
      const body = {
        state: { fake_behavior: "delay:600", log: "x".repeat(60_000) },
        questions: { a: { type: "noul" }, b: { type: "noul" }, c: { type: "noul" } },
      };
      assert.ok(inputBound(body) > 2000);
      const pending = gw.decide(body);
      await eventually("reserved while the model works", async () => (await gw.store.getBalance(gw.orgId)).reserved > 0);
      assert.deepEqual(await gw.store.getBalance(gw.orgId), { available: 0, reserved: 2_003_000, spent: 0, granted: 2_003_000 });
      const res = await pending;
      const answer = await json(res);
      assert.equal(res.status, 200, JSON.stringify(answer));
      // The fake reports ~15,000 input tokens: more than reserved, so the reservation is charged and flagged.
      assert.equal(answer.usage.cost_microusd, 2_003_000);
      assert.equal((await gw.store.getUsage(gw.orgId, answer.request_id))?.overReservation, true);
    } finally {
      await gw.close();
    }
  });
});
