/**
 * A paid request's token bound (its bytes, limited by the model's context; or the service's own count) and the
 * refusal of a bound over reserve_tokens, on the gateway's pure pieces. Through a real server: test/http/reservations.test.ts.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { loadConfig } from "../../src/config.ts";
import type { ModelContext } from "../../src/contract/models.ts";
import { systemClock } from "../../src/domain/clock.ts";
import { ServiceError } from "../../src/domain/errors.ts";
import { AdmissionPolicy } from "../../src/gateway/admission.ts";
import type { Books } from "../../src/gateway/books.ts";
import type { ResolvedModel } from "../../src/gateway/model-registry.ts";
import { PROMPT_OVERHEAD_TOKENS, QUESTION_OVERHEAD_TOKENS, tokenBoundOf } from "../../src/gateway/token-bound.ts";
import type { ModelCall, ModelService, TokenBound, UpstreamModel } from "../../src/models/model-service.ts";

const STATE = JSON.stringify({ log: "x".repeat(5000) });
const QUESTIONS = JSON.stringify({ a: { type: "noul" }, b: { type: "noul" } });
const CALL: ModelCall = {
  model: "m",
  state: JSON.parse(STATE),
  questions: JSON.parse(QUESTIONS),
  text: { state: STATE, questions: QUESTIONS },
};
const BYTES = PROMPT_OVERHEAD_TOKENS + STATE.length + QUESTIONS.length + 2 * QUESTION_OVERHEAD_TOKENS;

/** A model whose service lists `listed` (or fails to) and counts tokens when `counted` is given. */
function model(options: { listed?: UpstreamModel[] | Error; counted?: TokenBound; context?: ModelContext }) {
  const calls = { listModels: 0 };
  const service: ModelService = {
    listModels: async () => {
      calls.listModels++;
      if (options.listed instanceof Error) throw options.listed;
      return options.listed ?? [{ name: "m" }];
    },
    decide: async () => assert.fail("no call"),
    close: async () => {},
    ...(options.counted ? { tokenBound: async () => options.counted! } : {}),
  };
  return { calls, model: { service, ...(options.context ? { context: options.context } : {}) } };
}

describe("tokenBoundOf", () => {
  test("no context: one token per byte of state and questions plus the template, one output token per question", async () => {
    const { model: m } = model({});
    assert.deepEqual(await tokenBoundOf(m, CALL), { input: BYTES, output: 2, basis: "bytes" });
    const unreachable = model({ listed: new Error("down") });
    assert.deepEqual(
      await tokenBoundOf(unreachable.model, CALL),
      { input: BYTES, output: 2, basis: "bytes" },
      "a failed lookup limits nothing",
    );
  });

  test("the published max_state limits the state's part; the questions keep their bytes", async () => {
    const { model: m, calls } = model({
      listed: [
        { name: "other", context: { max_state: 10 } },
        { name: "m", context: { max_state: 1000 } },
      ],
    });
    const bound = await tokenBoundOf(m, CALL);
    assert.deepEqual(bound, {
      input: PROMPT_OVERHEAD_TOKENS + 1000 + QUESTIONS.length + 2 * QUESTION_OVERHEAD_TOKENS,
      output: 2,
      basis: "context",
    });
    assert.equal(calls.listModels, 1);
  });

  test("a configured context is used as is (no lookup); max_branch limits the state and each question", async () => {
    const { model: m, calls } = model({ context: { max_branch: 50 } });
    assert.deepEqual(await tokenBoundOf(m, CALL), { input: PROMPT_OVERHEAD_TOKENS + 50 + 2 * 50, output: 2, basis: "context" });
    assert.equal(calls.listModels, 0);
  });

  test("a context larger than the request limits nothing", async () => {
    const { model: m } = model({ listed: [{ name: "m", context: { max_state: 100_000, max_branch: 200_000, strict: true } }] });
    assert.deepEqual(await tokenBoundOf(m, CALL), { input: BYTES, output: 2, basis: "bytes" });
  });

  test("a service that counts gives the bound; its context is not asked", async () => {
    const { model: m, calls } = model({ counted: { input: 77, output: 3 }, listed: [{ name: "m", context: { max_state: 10 } }] });
    assert.deepEqual(await tokenBoundOf(m, CALL), { input: 77, output: 3, basis: "counted" });
    assert.equal(calls.listModels, 0);
  });
});

describe("reservationAmount", () => {
  const config = loadConfig({
    TDS_DATABASE_URL: "sqlite::memory:",
    TDS_SERVICE_MODE: "paid",
    TDS_PRICE_PER_MILLION_INPUT_USD: "1",
    TDS_PRICE_PER_MILLION_OUTPUT_USD: "2",
    TDS_RESERVE_TOKENS: "1000",
  });
  const admission = new AdmissionPolicy({ books: {} as Books, clock: systemClock, config });
  const priced = { price: { inputPerMillion: 1_000_000n, outputPerMillion: 2_000_000n } } as ResolvedModel;

  test("the whole bound at the model's prices, up to reserve_tokens inclusive", () => {
    assert.deepEqual(admission.reservationAmount(priced, { input: 1000, output: 10 }), {
      amount: 1020,
      tokens: { input: 1000, output: 10 },
    });
  });

  test("a bound over reserve_tokens is refused (413) with a detail naming reserve_tokens and the bound", () => {
    for (const [bound, basis] of [
      [{ input: 1001, output: 1, basis: "bytes" }, /no context of the model lowers it/],
      [{ input: 1001, output: 1, basis: "context" }, /limited by the model's context/],
      [{ input: 5, output: 1001, basis: "counted" }, /counted by the model service/],
    ] as const) {
      assert.throws(
        () => admission.reservationAmount(priced, bound),
        (err: unknown) =>
          err instanceof ServiceError &&
          err.code === "token_bound_over_reserve" &&
          err.status === 413 &&
          (err.detail ?? "").includes(`up to ${bound.input} input and ${bound.output} output tokens`) &&
          /more than reserve_tokens \(1000\)/.test(err.detail ?? "") &&
          basis.test(err.detail ?? ""),
      );
    }
  });
});
