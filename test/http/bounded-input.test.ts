/**
 * Bodies just under max_request_bytes (1 MiB), of the shapes that made validation or parsing expensive: each gets its
 * status and a contract body, and GET /healthz keeps answering while it is in flight. How fast is bench/large-bodies.ts's
 * business; here only what happens is asserted.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { MAX_FIELD_ERRORS } from "../../src/contract/validation.ts";
import { assertShape, errorBody } from "../support/contract-check.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const MAX_REQUEST_BYTES = 1_048_576;
const TARGET_BYTES = MAX_REQUEST_BYTES - 2_048;

type Json = unknown;
const many = (n: number, f: (i: number) => [string, Json]) => Object.fromEntries(Array.from({ length: n }, (_, i) => f(i)));
const questions = (n: number, q: () => Json) => many(n, (i) => [`q${i}`, q()]);
const nest = (depth: number) => `${"[".repeat(depth)}${"]".repeat(depth)}`;

/** The body for the largest n that fits just under 1 MiB (bodies grow with n); n is returned too. */
function fit(make: (n: number) => string): { body: string; n: number } {
  let lo = 1;
  let hi = 2;
  while (Buffer.byteLength(make(hi)) <= TARGET_BYTES) hi *= 2;
  while (lo < hi - 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (Buffer.byteLength(make(mid)) <= TARGET_BYTES) lo = mid;
    else hi = mid;
  }
  const body = make(lo);
  assert.ok(Buffer.byteLength(body) > MAX_REQUEST_BYTES - 64 * 1024, "a body close to the limit");
  return { body, n: lo };
}

interface HealthLog {
  /** Health requests sent while the big request was in flight (each answered, possibly after it). */
  startedMeanwhile: number;
  /** Health answers received while the big request was in flight. */
  answeredMeanwhile: number;
  statuses: number[];
}

/**
 * Sends `body` while polling /healthz one request at a time (1 ms apart), from before it is sent until its response.
 * Returns the response and what the health checks saw.
 */
async function sendWhileHealthPolled(gw: Gateway, body: string): Promise<{ res: Response; text: string; health: HealthLog }> {
  const health: HealthLog = { startedMeanwhile: 0, answeredMeanwhile: 0, statuses: [] };
  let inFlight = false;
  let stop = false;
  let firstPoll!: () => void;
  const polled = new Promise<void>((r) => (firstPoll = r));
  const poller = (async () => {
    while (!stop) {
      const startedMeanwhile = inFlight;
      const res = await fetch(`${gw.url}/healthz`);
      await res.text();
      health.statuses.push(res.status);
      if (startedMeanwhile) health.startedMeanwhile++;
      if (inFlight) health.answeredMeanwhile++;
      firstPoll();
      await new Promise((r) => setTimeout(r, 1));
    }
  })();
  await polled;
  inFlight = true;
  const res = await gw.decide(body);
  const text = await res.text();
  inFlight = false;
  stop = true;
  await poller; // the poll under way, if any, is answered too
  return { res, text, health };
}

function assertHealthAnswered(health: HealthLog, what: string): void {
  assert.ok(
    health.statuses.every((s) => s === 200),
    `${what}: /healthz statuses ${health.statuses.join(",")}`,
  );
  assert.ok(health.startedMeanwhile >= 1, `${what}: a /healthz request was sent while the body was processed, and answered`);
}

// A hang guard only (the file takes ~10 s); the former quadratic grouping took 83 s for one such body.
describe("bodies of ~1 MiB: every one answered, /healthz answered meanwhile", { timeout: 180_000 }, () => {
  let gw: Gateway;
  before(async () => {
    // A model context big enough for 1 MiB, so that valid bodies reach a 200.
    gw = await startGateway({ fake: { maxInputTokens: 100_000_000 } });
  });
  after(async () => gw.close());

  const usageCount = async () => (await gw.store.listUsage(gw.orgId, { limit: 200 })).records.length;

  /** A rejected body: its status, the contract's error body, no model call, nothing recorded. */
  async function rejected(body: string, status: number, what: string) {
    const calls = gw.fake!.calls.decide;
    const records = await usageCount();
    const { res, text, health } = await sendWhileHealthPolled(gw, body);
    assertHealthAnswered(health, what);
    const parsed = await errorBody(new Response(text, { status: res.status }), status);
    assert.equal(gw.fake!.calls.decide, calls, `${what}: the model is not called`);
    assert.equal(await usageCount(), records, `${what}: nothing is recorded`);
    return parsed;
  }

  /** An accepted body: 200 and a DecisionResponse with an answer for every question. */
  async function accepted(body: string, what: string) {
    const { res, text, health } = await sendWhileHealthPolled(gw, body);
    assertHealthAnswered(health, what);
    assert.equal(res.status, 200, `${what}: ${text.slice(0, 300)}`);
    const parsed = JSON.parse(text);
    assertShape("decision", parsed);
    assert.deepEqual(Object.keys(parsed.answers), Object.keys((JSON.parse(body) as { questions: object }).questions));
    return parsed;
  }

  const maxQuestionsError = (body: { errors?: { field: string; message: string }[] }, count: number) => {
    assert.equal(body.errors?.length, 1);
    assert.equal(body.errors![0]!.field, "questions");
    assert.equal(body.errors![0]!.message, `must have at most 32 questions (max_questions); got ${count}`);
  };

  test("tens of thousands of invalid questions: one max_questions error, no per-question validation", async () => {
    const { body, n } = fit((k) => JSON.stringify({ state: 1, questions: questions(k, () => ({ type: "noul", criteria: 1 })) }));
    assert.ok(n > 20_000);
    const err = await rejected(body, 422, "invalid questions");
    maxQuestionsError(err, n);
    assert.equal(err.detail, `Invalid request body: questions: must have at most 32 questions (max_questions); got ${n}`);
  });

  test("tens of thousands of valid questions: the same single error", async () => {
    const { body, n } = fit((k) => JSON.stringify({ state: 1, questions: questions(k, () => ({ type: "noul" })) }));
    maxQuestionsError(await rejected(body, 422, "valid questions"), n);
  });

  test("more than max_questions wins over every other problem of the body", async () => {
    const { body, n } = fit((k) => JSON.stringify({ state: 1, questions: questions(k, () => ({ type: 5 })), model: 1, extra: true }));
    maxQuestionsError(await rejected(body, 422, "questions and other problems"), n);
  });

  for (const shape of [
    {
      name: "32 questions, each with thousands of unknown fields",
      make: (k: number) =>
        JSON.stringify({ state: 1, questions: questions(32, () => ({ type: "noul", ...many(k, (i) => [`k${i}`, 1]) })) }),
      total: (k: number) => 32 * k,
      first: { field: "questions.q0.k0", message: "is not a field of the contract (unknown fields are rejected)" },
    },
    {
      name: "tens of thousands of unknown top-level fields",
      make: (k: number) => JSON.stringify({ state: 1, questions: { q: { type: "noul" } }, ...many(k, (i) => [`k${i}`, 1]) }),
      total: (k: number) => k,
      first: { field: "k0", message: "is not a field of the contract (unknown fields are rejected)" },
    },
    {
      name: "noul criteria with thousands of unknown keys",
      make: (k: number) =>
        JSON.stringify({
          state: 1,
          questions: questions(32, () => ({ type: "noul", criteria: { true: 1, ...many(k, (i) => [`k${i}`, 1]) } })),
        }),
      total: (k: number) => 32 * k,
      first: { field: "questions.q0.criteria.k0", message: "is not a field of the contract (unknown fields are rejected)" },
    },
  ]) {
    test(`${shape.name}: exactly ${MAX_FIELD_ERRORS} listed, the exact total in the detail`, async () => {
      const { body, n } = fit(shape.make);
      const total = shape.total(n);
      assert.ok(total > 10_000);
      const err = await rejected(body, 422, shape.name);
      assert.equal(err.errors?.length, MAX_FIELD_ERRORS);
      assert.deepEqual(err.errors![0], shape.first);
      assert.equal(new Set(err.errors!.map((e) => e.field)).size, MAX_FIELD_ERRORS, "50 different problems");
      assert.equal(
        err.detail,
        `Invalid request body: ${shape.first.field}: ${shape.first.message} (and ${total - 1} more) (showing the first ${MAX_FIELD_ERRORS} of ${total} problems)`,
      );
    });
  }

  test("a few problems are all listed, without the 'showing' note", async () => {
    const err = await rejected(JSON.stringify({ state: 1, questions: { q: { type: "noul", x: 1, y: 2 } }, z: 3 }), 422, "three problems");
    assert.equal(err.errors?.length, 3);
    assert.equal(err.detail, "Invalid request body: z: is not a field of the contract (unknown fields are rejected) (and 2 more)");
  });

  test("32 choice questions of 255 options with long names: 200", async () => {
    const { body } = fit((k) =>
      JSON.stringify({
        state: 1,
        questions: questions(32, () => ({ type: "choice", criteria: many(255, (i) => [`${"option ".repeat(k)}${i}`, null]) })),
      }),
    );
    const answer = await accepted(body, "255 options × 32");
    assert.equal(Object.keys(answer.answers.q31.probabilities).length, 255);
  });

  test("32 questions with huge state, instructions and criteria values: 200", async () => {
    const { body } = fit((k) =>
      JSON.stringify({
        state: { ticket: "s".repeat(8 * k), history: Array.from({ length: 50 }, (_, i) => ({ i, text: "h".repeat(k) })) },
        questions: questions(32, () => ({
          type: "choice",
          instructions: { text: "i".repeat(k) },
          criteria: { a: "a".repeat(k), b: ["b".repeat(k)], c: null },
        })),
      }),
    );
    await accepted(body, "huge values");
  });

  test("32 score questions of 255 levels: 200", async () => {
    const { body } = fit((k) =>
      JSON.stringify({
        state: 1,
        questions: questions(32, () => ({ type: "score", criteria: Array.from({ length: 255 }, (_, i) => `${"level ".repeat(k)}${i}`) })),
      }),
    );
    const answer = await accepted(body, "255 levels × 32");
    assert.equal(Object.keys(answer.answers.q0.legend).length, 255);
  });

  test("many arrays nested to the 256-level limit in state and in criteria values: 200", async () => {
    // The body object and the state array are 2 levels; 254 more reach 256.
    const { body } = fit((k) => `{"state":[${Array.from({ length: k }, () => nest(254)).join(",")}],"questions":{"q":{"type":"noul"}}}`);
    await accepted(body, "state at the depth limit");
    // body, questions, q, criteria: 4 levels; 252 more reach 256.
    const { body: inCriteria } = fit(
      (k) =>
        `{"state":1,"questions":{${Array.from({ length: 32 }, (_, q) => `"q${q}":{"type":"choice","instructions":${nest(253)},"criteria":{${Array.from({ length: k }, (_, i) => `"o${i}":${nest(252)}`).join(",")}}}`).join(",")}}}`,
    );
    await accepted(inCriteria, "criteria values at the depth limit");
  });

  test("one array 257 levels deep among many at the limit, and ~500,000 levels: 422", async () => {
    const { body } = fit(
      (k) =>
        `{"state":[${Array.from({ length: k }, (_, i) => nest(i === k - 1 ? 255 : 254)).join(",")}],"questions":{"q":{"type":"noul"}}}`,
    );
    assert.match((await rejected(body, 422, "257 levels")).detail, /deeper than 256 levels/);
    const { body: deep } = fit((k) => `{"state":${nest(k)},"questions":{"q":{"type":"noul"}}}`);
    assert.match((await rejected(deep, 422, "~500,000 levels")).detail, /deeper than 256 levels/);
  });

  test("a state object with ~80,000 keys, many numbers, many empty arrays: 200", async () => {
    await accepted(
      fit((k) => JSON.stringify({ state: many(k, (i) => [`k${i}`, i]), questions: { q: { type: "noul" } } })).body,
      "many keys",
    );
    await accepted(
      fit((k) => JSON.stringify({ state: Array.from({ length: k }, (_, i) => i * 1.25 - 7), questions: { q: { type: "noul" } } })).body,
      "many numbers",
    );
    await accepted(
      fit((k) => `{"state":[${Array.from({ length: k }, (_, i) => (i % 2 ? "[]" : "{}")).join(",")}],"questions":{"q":{"type":"noul"}}}`)
        .body,
      "empty arrays",
    );
  });

  test("very long strings: in state and an option name 200; a model name, a question id, a type tag 422", async () => {
    await accepted(fit((k) => JSON.stringify({ state: "x".repeat(k), questions: { q: { type: "noul" } } })).body, "long state");
    await accepted(fit((k) => `{"state":"${'\\u00e9\\n\\"'.repeat(k)}","questions":{"q":{"type":"noul"}}}`).body, "escapes");
    await accepted(
      fit((k) => JSON.stringify({ state: 1, questions: { q: { type: "choice", criteria: { ["o".repeat(k)]: null, b: null } } } })).body,
      "long option",
    );

    const model = await rejected(
      fit((k) => JSON.stringify({ state: 1, model: "m".repeat(k), questions: { q: { type: "noul" } } })).body,
      422,
      "long model",
    );
    assert.deepEqual(model.errors, [{ field: "model", message: "must be at most 100 characters long" }]);
    const { body: idBody, n } = fit((k) => JSON.stringify({ state: 1, questions: { ["x".repeat(k)]: { type: "noul" } } }));
    const id = await rejected(idBody, 422, "long question id");
    assert.deepEqual(id.errors, [{ field: `questions.${"x".repeat(n)}`, message: `id must be 1 to 100 characters long (it has ${n})` }]);
    const tag = await rejected(
      fit((k) => JSON.stringify({ state: 1, questions: { q: { type: "t".repeat(k) } } })).body,
      422,
      "long type tag",
    );
    assert.equal(tag.errors?.length, 1);
    assert.equal(tag.errors![0]!.field, "questions.q.type");
    assert.ok(tag.errors![0]!.message.length < 200, "the tag is not echoed whole");
  });
});
