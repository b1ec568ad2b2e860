/**
 * The behaviour every ModelService adapter must have, asserted through the port only (src/models/model-service.ts).
 * Run on each adapter by model-service-contract.test.ts. Where adapters legitimately differ, a capability says how.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Question } from "../../src/contract/decision.ts";
import {
  type CallOptions,
  type ModelAnswerSet,
  type ModelCall,
  type ModelErrorKind,
  type ModelService,
  ModelServiceError,
} from "../../src/models/model-service.ts";
import { MODEL_ERROR_KINDS } from "../support/fake-model-service.ts";
import { mulberry32 } from "../support/seeded-random.ts";
import { settlesBefore } from "../support/timer-race.ts";

export interface OpenedModelService {
  service: ModelService;
  /** The model name the service knows (what `call.model` carries). */
  model: string;
  /** Closes the service and whatever it runs on (a server, a model file). Must tolerate a service already closed. */
  close(): Promise<void>;
}

export interface ModelServiceCapabilities {
  /**
   * A call this adapter takes long to answer (a second or more) or never answers, used to stop one midway by its
   * deadline or its signal. Without it, only calls stopped before they start are checked.
   */
  slowCall?: (model: string) => ModelCall;
  /** listModels gives the model a context (max_state, max_branch); without this a model listed by name only is accepted. */
  publishesContext?: boolean;
  /**
   * listModels observes its CallOptions (an aborted signal fails it "aborted"). An adapter whose list is in memory
   * (the in-process engine) may answer regardless.
   */
  listModelsObservesCallOptions?: boolean;
  /**
   * What a call already in flight when close() is called ends with: "answered" (close lets it finish: the HTTP
   * adapter's connection pool, the in-process fake) or "unavailable" (the engine stops before its next question).
   * Either way close() resolves only once the call has settled. Default: either is accepted.
   */
  inFlightAtClose?: "answered" | "unavailable";
  /**
   * close() resolves only after the calls in flight have settled (default true). The model router does not track the
   * calls it has accepted: one accepted just before close() reaches its (closed) deployment afterwards.
   */
  closeAwaitsInFlight?: boolean;
  /** The same call gives the same answers every time. */
  deterministic?: boolean;
  /**
   * A timer started with a call's deadline or abort that its failure must beat (default 1000 ms): an order of timers,
   * which no load changes, as long as the adapter needs no other timer or I/O to fail a stopped call.
   */
  promptMs?: number;
  /** Deadline of the calls that must succeed (default 30 s). */
  timeoutMs?: number;
}

const TOLERANCE = 1e-6;

/** Option names and ids that are prototype keys or look like paths: answers must be keyed by them as own keys. */
function mixedQuestions(): Record<string, Question> {
  // Parsed from text: an object literal would make "__proto__" the prototype instead of an own key.
  return JSON.parse(`{
    "topic": {
      "type": "choice",
      "instructions": "What is the ticket about?",
      "criteria": { "billing": "Payments and invoices", "__proto__": "a prototype key", "constructor": null, "a.b": "a dotted name" }
    },
    "urgency": { "type": "score", "instructions": "How urgent is it?", "criteria": ["not urgent", "soon", "today", "now"] },
    "refund": { "type": "noul", "instructions": "Does the customer ask for a refund?", "criteria": { "true": "a refund is asked for", "false": "no refund" } }
  }`) as Record<string, Question>;
}

const STATE = { ticket: "I was charged twice for my subscription this month.", customer_tier: "gold" };

/** Pseudo-random words: text that no tokenizer packs into fewer tokens than about a quarter of its bytes. */
function words(bytes: number, seed = 7): string {
  const next = mulberry32(seed);
  const letters = "abcdefghijklmnopqrstuvwxyz";
  let out = "";
  while (out.length < bytes) {
    const n = 2 + Math.floor(next() * 7);
    for (let i = 0; i < n; i++) out += letters[Math.floor(next() * 26)];
    out += " ";
  }
  return out.slice(0, bytes);
}

/** Asserts the promise fails with a ModelServiceError whose kind is one of `kinds`; returns it. */
export async function expectModelError(
  promise: Promise<unknown>,
  kinds: ModelErrorKind | readonly ModelErrorKind[],
): Promise<ModelServiceError> {
  const allowed = typeof kinds === "string" ? [kinds] : kinds;
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof ModelServiceError, `expected a ModelServiceError, got ${String(err)}`);
    assert.ok(MODEL_ERROR_KINDS.includes(err.kind), `unknown kind ${JSON.stringify(err.kind)}`);
    assert.ok(allowed.includes(err.kind), `expected kind ${allowed.join(" or ")}, got ${err.kind}: ${err.message}`);
    assert.equal(typeof err.message, "string");
    assert.ok(err.message.length > 0, "the error says what happened");
    return err;
  }
  assert.fail(`expected a ${allowed.join(" or ")} error, but the call succeeded`);
}

function isDictionary(value: unknown): value is Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false;
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function sameKeys(actual: Record<string, unknown>, expected: readonly string[], what: string): void {
  assert.deepEqual([...Object.keys(actual)].sort(), [...expected].sort(), `${what}: keyed by exactly ${JSON.stringify(expected)}`);
}

function unit(value: unknown, what: string): number {
  assert.equal(typeof value, "number", `${what} is a number`);
  const v = value as number;
  assert.ok(Number.isFinite(v) && v >= 0 && v <= 1, `${what} = ${v} is in [0, 1]`);
  return v;
}

function distribution(value: unknown, keys: readonly string[], what: string): number[] {
  assert.ok(isDictionary(value), `${what} is an object`);
  sameKeys(value, keys, what);
  const ps = keys.map((k) => unit(value[k], `${what}[${JSON.stringify(k)}]`));
  const sum = ps.reduce((a, b) => a + b, 0);
  assert.ok(Math.abs(sum - 1) <= TOLERANCE, `${what} sums to ${sum}, not 1 within ${TOLERANCE}`);
  return ps;
}

/** The contract's shape of every answer, for exactly the questions asked. */
export function assertAnswers(questions: Record<string, Question>, answers: unknown): void {
  assert.ok(isDictionary(answers), "answers is an object keyed by question id");
  sameKeys(answers, Object.keys(questions), "answers");
  for (const [id, q] of Object.entries(questions)) {
    const a: unknown = answers[id];
    const what = `answer ${JSON.stringify(id)}`;
    assert.ok(isDictionary(a), `${what} is an object`);
    assert.equal(a.type, q.type, `${what} has the question's type`);
    switch (q.type) {
      case "choice": {
        const options = Object.keys(q.criteria);
        distribution(a.probabilities, options, `${what}.probabilities`);
        assert.equal(typeof a.choice, "string");
        assert.ok(Object.hasOwn(q.criteria, a.choice as string), `${what}.choice ${JSON.stringify(a.choice)} is one of the options`);
        unit(a.confidence, `${what}.confidence`);
        break;
      }
      case "score": {
        const levels = q.criteria.map((_, i) => String(i));
        distribution(a.probabilities, levels, `${what}.probabilities`);
        assert.equal(typeof a.score, "number");
        const score = a.score as number;
        assert.ok(score >= -1e-9 && score <= q.criteria.length - 1 + 1e-9, `${what}.score ${score} is in [0, ${q.criteria.length - 1}]`);
        unit(a.confidence, `${what}.confidence`);
        break;
      }
      case "noul":
        unit(a.noul, `${what}.noul`);
        break;
    }
  }
}

function assertUsage(result: ModelAnswerSet): void {
  for (const key of ["input_tokens", "output_tokens"] as const) {
    const n = result.usage[key];
    assert.ok(Number.isSafeInteger(n) && n >= 0, `usage.${key} = ${n} is a non-negative integer`);
  }
  assert.ok(Number.isFinite(result.latencyMs) && result.latencyMs >= 0, `latencyMs = ${result.latencyMs} is a non-negative number`);
}

function assertPoolStats(service: ModelService, when: string): void {
  const stats = service.poolStats!();
  for (const key of ["busy", "size", "waiting"] as const) {
    assert.ok(Number.isSafeInteger(stats[key]) && stats[key] >= 0, `${when}: poolStats.${key} = ${stats[key]} is a non-negative integer`);
  }
  assert.ok(stats.busy <= stats.size, `${when}: busy ${stats.busy} ≤ size ${stats.size}`);
}

export function describeModelServiceContract(
  name: string,
  open: () => Promise<OpenedModelService>,
  capabilities: ModelServiceCapabilities = {},
): void {
  const promptMs = capabilities.promptMs ?? 1000;
  const OK: CallOptions = { timeoutMs: capabilities.timeoutMs ?? 30_000 };

  describe(`ModelService contract: ${name}`, () => {
    let opened: OpenedModelService;
    let service: ModelService;
    let model: string;
    const call = (questions: Record<string, Question> = mixedQuestions(), state: unknown = STATE): ModelCall => ({
      model,
      state,
      questions,
    });

    before(async () => {
      opened = await open();
      service = opened.service;
      model = opened.model;
    });
    after(async () => {
      await opened?.close();
    });

    test("listModels lists the model, with a valid context when it publishes one", async () => {
      const list = await service.listModels(OK);
      assert.ok(Array.isArray(list), "a list");
      for (const m of list) {
        assert.equal(typeof m.name, "string");
        assert.ok(m.name.length > 0, "every listed model has a name");
      }
      const entry = list.find((m) => m.name === model);
      assert.ok(entry, `${JSON.stringify(model)} is listed (got ${JSON.stringify(list.map((m) => m.name))})`);
      if (capabilities.publishesContext) assert.ok(entry.context, "the model's context is published");
      if (entry.context) {
        const ctx = entry.context;
        for (const key of Object.keys(ctx)) assert.ok(["max_state", "max_branch", "strict"].includes(key), `context has no field ${key}`);
        for (const key of ["max_state", "max_branch"] as const) {
          const v = ctx[key];
          if (v !== undefined) assert.ok(Number.isSafeInteger(v) && v >= 1, `context.${key} = ${v} is a positive integer`);
        }
        if (ctx.max_state !== undefined && ctx.max_branch !== undefined)
          assert.ok(ctx.max_state <= ctx.max_branch, "max_state ≤ max_branch");
        if (ctx.strict !== undefined) assert.equal(typeof ctx.strict, "boolean");
      }
    });

    test("decide answers every question of a mixed call (choice, score, noul) with the contract's shape", async () => {
      const questions = mixedQuestions();
      assert.ok(Object.hasOwn(questions.topic!.criteria as object, "__proto__"), "the test's option __proto__ is an own key");
      const result = await service.decide(call(questions), OK);
      assertAnswers(questions, result.answers);
      assertUsage(result);
    });

    test("decide answers exactly the questions asked, no extra: one question of each type alone, and two", async () => {
      const all = mixedQuestions();
      for (const id of Object.keys(all)) {
        const one = { [id]: all[id]! };
        assertAnswers(one, (await service.decide(call(one), OK)).answers);
      }
      const two = { second: all.refund!, first: all.urgency! };
      assertAnswers(two, (await service.decide(call(two), OK)).answers);
    });

    test("a choice with a single option and a score with a single level are certain", async () => {
      const questions: Record<string, Question> = {
        only: { type: "choice", criteria: { alone: "the only option" } },
        flat: { type: "score", criteria: ["the only level"] },
      };
      const result = await service.decide(call(questions), OK);
      assertAnswers(questions, result.answers);
      const answers = result.answers as Record<string, Record<string, Record<string, number>>>;
      assert.ok(Math.abs((answers.only!.probabilities!.alone as number) - 1) <= TOLERANCE);
      assert.ok(Math.abs((answers.flat!.probabilities!["0"] as number) - 1) <= TOLERANCE);
    });

    test("usage tokens are non-negative integers; more questions never report fewer tokens", async () => {
      const all = mixedQuestions();
      const one = await service.decide(call({ refund: all.refund! }), OK);
      const three = await service.decide(call(all), OK);
      assertUsage(one);
      assertUsage(three);
      assert.ok(
        three.usage.input_tokens + three.usage.output_tokens >= one.usage.input_tokens + one.usage.output_tokens,
        `3 questions: ${JSON.stringify(three.usage)}, 1 question: ${JSON.stringify(one.usage)}`,
      );
    });

    test("a call carrying the request's own JSON text is answered the same way", async () => {
      const questions = mixedQuestions();
      const text = { state: JSON.stringify(STATE, null, 1), questions: JSON.stringify(questions, null, 1) };
      const result = await service.decide({ ...call(questions), text }, OK);
      assertAnswers(questions, result.answers);
      assertUsage(result);
    });

    test("deterministic adapters give the same answers to the same call", {
      skip: !capabilities.deterministic && "not deterministic",
    }, async () => {
      const a = await service.decide(call(), OK);
      const b = await service.decide(call(), OK);
      assert.deepEqual(JSON.parse(JSON.stringify(b.answers)), JSON.parse(JSON.stringify(a.answers)));
    });

    test("a state over the model's max_state fails with context_rejected", async (t) => {
      const context = (await service.listModels(OK)).find((m) => m.name === model)?.context;
      if (context?.max_state === undefined) return t.skip("the model publishes no max_state");
      // 4 bytes per token of max_state, and some: over it for a tokenizer whose tokens of random short words average
      // at most 4 bytes (SentencePiece and BPE vocabularies cut them into tokens of 1–3 letters; the fakes count bytes / 4).
      const state = { notes: words(4 * context.max_state + 400) };
      const err = await expectModelError(service.decide(call(mixedQuestions(), state), OK), "context_rejected");
      assert.ok(err.upstreamStatus === undefined || [400, 413, 422].includes(err.upstreamStatus), `status ${err.upstreamStatus}`);
      // And the service is not harmed by it.
      assertAnswers(mixedQuestions(), (await service.decide(call(), OK)).answers);
    });

    test("a call whose signal has already fired fails with aborted at once", async () => {
      const controller = new AbortController();
      controller.abort();
      const decision = service.decide(call(), { timeoutMs: 30_000, signal: controller.signal });
      assert.ok(await settlesBefore(decision, promptMs), `not failed before a timer of ${promptMs} ms`);
      const err = await expectModelError(decision, "aborted");
      assert.equal(err.kind, "aborted");
    });

    test("listModels with a fired signal fails with aborted, or answers from memory", async () => {
      const controller = new AbortController();
      controller.abort();
      const listing = service.listModels({ timeoutMs: 30_000, signal: controller.signal });
      if (capabilities.listModelsObservesCallOptions) await expectModelError(listing, "aborted");
      else assert.ok((await listing).some((m) => m.name === model));
    });

    test("a signal that fires mid-call fails it promptly with aborted", { skip: !capabilities.slowCall && "no slow call" }, async () => {
      const controller = new AbortController();
      const pending = service.decide(capabilities.slowCall!(model), { timeoutMs: 60_000, signal: controller.signal });
      await new Promise((r) => setTimeout(r, 50));
      controller.abort();
      assert.ok(await settlesBefore(pending, promptMs), `not failed before a timer of ${promptMs} ms started with the abort`);
      await expectModelError(pending, "aborted");
    });

    test("a deadline that passes mid-call fails it promptly with timeout, not before the deadline", {
      skip: !capabilities.slowCall && "no slow call",
    }, async () => {
      const timeoutMs = 150;
      // The deadline's own timer is due before the guard's (both start with the call), however busy the machine.
      const started = performance.now();
      const decision = service.decide(capabilities.slowCall!(model), { timeoutMs });
      assert.ok(await settlesBefore(decision, timeoutMs + promptMs), `not failed before a timer of ${timeoutMs + promptMs} ms`);
      await expectModelError(decision, "timeout");
      const ms = performance.now() - started;
      // A lower bound only: a timer never fires early.
      assert.ok(ms >= timeoutMs - 10, `failed after ${ms} ms, before its deadline of ${timeoutMs} ms`);
    });

    test("the service still answers after calls stopped by their signal and by their deadline", async () => {
      const before = new AbortController();
      before.abort();
      await expectModelError(service.decide(call(), { timeoutMs: 30_000, signal: before.signal }), "aborted");
      if (capabilities.slowCall) {
        const during = new AbortController();
        const aborted = service.decide(capabilities.slowCall(model), { timeoutMs: 60_000, signal: during.signal });
        setTimeout(() => during.abort(), 20);
        await expectModelError(aborted, "aborted");
        await expectModelError(service.decide(capabilities.slowCall(model), { timeoutMs: 40 }), "timeout");
      }
      assertAnswers(mixedQuestions(), (await service.decide(call(), OK)).answers);
    });

    test("tokenBound, when present, bounds the usage decide reports", async (t) => {
      if (!service.tokenBound) return t.skip("no tokenBound (the gateway uses its byte-based bound)");
      for (const questions of [mixedQuestions(), { refund: mixedQuestions().refund! }]) {
        const bound = await service.tokenBound(call(questions));
        if (bound === null) continue;
        for (const key of ["input", "output"] as const)
          assert.ok(Number.isSafeInteger(bound[key]) && bound[key] >= 0, `bound.${key} = ${bound[key]}`);
        const result = await service.decide(call(questions), OK);
        assert.ok(result.usage.input_tokens <= bound.input, `input ${result.usage.input_tokens} ≤ bound ${bound.input}`);
        assert.ok(result.usage.output_tokens <= bound.output, `output ${result.usage.output_tokens} ≤ bound ${bound.output}`);
      }
    });

    test("poolStats, when present, returns non-negative integers with busy ≤ size: idle, during a call, after", async (t) => {
      if (!service.poolStats) return t.skip("no pool");
      assertPoolStats(service, "idle");
      const running = service.decide(call(), OK);
      assertPoolStats(service, "during a call");
      await new Promise((r) => setImmediate(r));
      assertPoolStats(service, "during a call, a turn later");
      assertAnswers(mixedQuestions(), (await running).answers);
      assertPoolStats(service, "after");
    });

    test("decide and listModels after close fail with unavailable; close is idempotent", async () => {
      const own = await open();
      try {
        assertAnswers(
          mixedQuestions(),
          (await own.service.decide({ model: own.model, state: STATE, questions: mixedQuestions() }, OK)).answers,
        );
        await own.service.close();
        await own.service.close();
        await expectModelError(
          own.service.decide({ model: own.model, state: STATE, questions: mixedQuestions() }, { timeoutMs: 2000 }),
          "unavailable",
        );
        await expectModelError(own.service.listModels({ timeoutMs: 2000 }), "unavailable");
      } finally {
        await own.close();
      }
    });

    test("close with a call in flight resolves once that call has settled", async () => {
      const own = await open();
      try {
        const order: string[] = [];
        const inFlight = own.service.decide({ model: own.model, state: STATE, questions: mixedQuestions() }, OK).then(
          (r) => {
            order.push("call settled");
            return { ok: true as const, r };
          },
          (e: unknown) => {
            order.push("call settled");
            return { ok: false as const, e };
          },
        );
        await own.service.close();
        order.push("close resolved");
        const outcome = await inFlight;
        if (capabilities.closeAwaitsInFlight ?? true)
          assert.deepEqual(order, ["call settled", "close resolved"], "close resolved while the call was still running");
        if (outcome.ok) {
          assert.notEqual(capabilities.inFlightAtClose, "unavailable", "the call in flight was answered");
          assertAnswers(mixedQuestions(), outcome.r.answers);
        } else {
          assert.notEqual(capabilities.inFlightAtClose, "answered", `the call in flight failed: ${String(outcome.e)}`);
          await expectModelError(Promise.reject(outcome.e), "unavailable");
        }
      } finally {
        await own.close();
      }
    });
  });
}
