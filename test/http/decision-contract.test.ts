import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { assertShape, errorBody, fields, json } from "../support/contract-check.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";

function choiceWith(n: number) {
  return { type: "choice", criteria: Object.fromEntries(Array.from({ length: n }, (_, i) => [`opt${i}`, `option ${i}`])) };
}
function questionsWith(n: number) {
  return Object.fromEntries(Array.from({ length: n }, (_, i) => [`q${i}`, { type: "noul", instructions: `question ${i}` }]));
}

describe("POST /v1/systemone contract", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway();
  });
  after(async () => gw.close());

  const usageCount = async () => (await gw.store.listUsage(gw.orgId, { limit: 200 })).records.length;

  test("answers all three question types with exactly the contract's fields", async () => {
    const res = await gw.decide(sampleRequest());
    assert.equal(res.status, 200);
    const body = await json(res);
    assertShape("decision", body);
    assert.deepEqual(Object.keys(body.answers).sort(), ["refund", "topic", "urgency"]);
    assert.equal(body.request_id, res.headers.get("x-service-request-id"));
    assert.equal(body.request_id, res.headers.get("x-typesafe-request-id"));
    assert.equal(body.service_mode, "preview");
    assert.equal(body.model, "fake-small");
    assert.deepEqual(Object.keys(body.answers.topic.probabilities), ["billing", "bug", "other"]);
    assert.deepEqual(body.answers.urgency.legend, { 0: "not urgent", 1: "soon", 2: "today", 3: "now" });
    assert.ok(body.answers.urgency.score >= 0 && body.answers.urgency.score <= 3);
    assert.deepEqual(Object.keys(body.answers.refund).sort(), ["noul", "type"]);
    assert.equal(body.usage.cost_microusd, 0);
    assert.equal(body.usage.cost_usd, "0");
    assert.equal(body.usage.price_per_million_input_usd, null);
    assert.ok(body.usage.input_tokens >= 1);
    assert.equal(body.usage.output_tokens, 3);
    assert.ok(body.gateway_latency_ms >= 0 && body.latency_ms >= 0);
    const record = await gw.store.getUsage(gw.orgId, body.request_id);
    assert.equal(record?.outcome, "succeeded");
    assert.equal(record?.inputTokens, body.usage.input_tokens);
  });

  test("state may be any JSON value, including a number, null or an array", async () => {
    for (const state of [42, null, [1, "two"], "plain text", true]) {
      const res = await gw.decide({ state, questions: { q: { type: "noul" } } });
      assert.equal(res.status, 200, `state ${JSON.stringify(state)}`);
    }
  });

  test("model: null and omitted use the configured model; jev-latest is an alias of it", async () => {
    for (const model of [null, undefined, "jev-latest", "fake-large"]) {
      const res = await gw.decide({ ...sampleRequest(), ...(model === undefined ? {} : { model }) });
      const body = await json(res);
      assert.equal(res.status, 200);
      assert.equal(body.model, model === "fake-large" ? "fake-large" : "fake-small");
    }
    assert.equal(gw.fake!.received.at(-1)!.model, "fake-large");
  });

  test("32 questions pass, 33 are rejected", async () => {
    assert.equal((await gw.decide({ state: 1, questions: questionsWith(32) })).status, 200);
    const body = await errorBody(await gw.decide({ state: 1, questions: questionsWith(33) }), 422);
    assert.deepEqual(fields(body), ["questions"]);
    assert.match(body.errors![0]!.message, /at most 32 questions/);
  });

  test("question ids of 100 characters pass, 101 and empty are rejected", async () => {
    const ok = "x".repeat(100);
    assert.equal((await gw.decide({ state: 1, questions: { [ok]: { type: "noul" } } })).status, 200);
    const long = "y".repeat(101);
    const body = await errorBody(await gw.decide({ state: 1, questions: { [long]: { type: "noul" }, "": { type: "noul" } } }), 422);
    assert.deepEqual(fields(body).sort(), ["questions.", `questions.${long}`].sort());
  });

  test("choice criteria: 1 and 255 options pass, 0 and 256 are rejected", async () => {
    assert.equal((await gw.decide({ state: 1, questions: { c: choiceWith(1) } })).status, 200);
    assert.equal((await gw.decide({ state: 1, questions: { c: choiceWith(255) } })).status, 200);
    for (const n of [0, 256]) {
      const body = await errorBody(await gw.decide({ state: 1, questions: { c: choiceWith(n) } }), 422);
      assert.deepEqual(fields(body), ["questions.c.criteria"]);
      assert.match(body.errors![0]!.message, n === 0 ? /at least 1 options/ : /at most 255 options/);
    }
    const arr = await errorBody(await gw.decide({ state: 1, questions: { c: { type: "choice", criteria: ["a", "b"] } } }), 422);
    assert.deepEqual(fields(arr), ["questions.c.criteria"]);
  });

  test("score criteria: 1 and 255 levels pass, 0 and 256 are rejected", async () => {
    const levels = (n: number) => ({ type: "score", criteria: Array.from({ length: n }, (_, i) => `level ${i}`) });
    assert.equal((await gw.decide({ state: 1, questions: { s: levels(1) } })).status, 200);
    const res = await gw.decide({ state: 1, questions: { s: levels(255) } });
    assert.equal(res.status, 200);
    const body = await json(res);
    assert.equal(Object.keys(body.answers.s.probabilities).length, 255);
    for (const n of [0, 256]) {
      const err = await errorBody(await gw.decide({ state: 1, questions: { s: levels(n) } }), 422);
      assert.deepEqual(fields(err), ["questions.s.criteria"]);
    }
  });

  test("noul criteria: absent, null, {true}, {true,false} pass; an extra key is rejected", async () => {
    for (const criteria of [undefined, null, { true: "yes" }, { true: "yes", false: { why: "no" } }, {}]) {
      const q = criteria === undefined ? { type: "noul" } : { type: "noul", criteria };
      assert.equal((await gw.decide({ state: 1, questions: { n: q } })).status, 200, JSON.stringify(criteria));
    }
    const body = await errorBody(await gw.decide({ state: 1, questions: { n: { type: "noul", criteria: { true: 1, maybe: 2 } } } }), 422);
    assert.deepEqual(fields(body), ["questions.n.criteria.maybe"]);
    const wrong = await errorBody(await gw.decide({ state: 1, questions: { n: { type: "noul", criteria: "yes" } } }), 422);
    assert.deepEqual(fields(wrong), ["questions.n.criteria"]);
    assert.match(wrong.errors![0]!.message, /null or an object/);
  });

  test("model names: 100 characters are checked against the list, 101 are rejected, unknown is 422", async () => {
    const long = await errorBody(await gw.decide({ ...sampleRequest(), model: "m".repeat(101) }), 422);
    assert.deepEqual(fields(long), ["model"]);
    assert.match(long.errors![0]!.message, /at most 100 characters/);
    const unknown = await errorBody(await gw.decide({ ...sampleRequest(), model: "m".repeat(100) }), 422);
    assert.deepEqual(fields(unknown), ["model"]);
    assert.match(unknown.detail, /[Uu]nknown model/);
    const typed = await errorBody(await gw.decide({ ...sampleRequest(), model: 7 }), 422);
    assert.deepEqual(typed.errors, [{ field: "model", message: "must be a string or null" }]);
  });

  test("unknown top-level fields are rejected, each listed: temperature, messages, stream, tools", async () => {
    const body = await errorBody(await gw.decide({ ...sampleRequest(), temperature: 0, messages: [], stream: true, tools: [] }), 422);
    assert.deepEqual(fields(body).sort(), ["messages", "stream", "temperature", "tools"]);
  });

  test("unknown fields inside a question, a wrong type tag and missing fields are all listed at once", async () => {
    const body = await errorBody(
      await gw.decide({
        questions: {
          a: { type: "choice", criteria: { x: 1 }, weight: 2 },
          b: { type: "rank", criteria: [] },
          c: { criteria: [] },
          d: { type: "score" },
        },
      }),
      422,
    );
    assert.deepEqual(
      fields(body).sort(),
      ["questions.a.weight", "questions.b.type", "questions.c.type", "questions.d.criteria", "state"].sort(),
    );
    assert.match(body.detail, /Invalid request body/);
  });

  test("wrong types are rejected, never coerced", async () => {
    const body = await errorBody(await gw.decide({ state: 1, questions: [{ type: "noul" }] }), 422);
    assert.deepEqual(body.errors, [{ field: "questions", message: "must be an object" }]);
    const nested = await errorBody(await gw.decide({ state: 1, questions: { q: { type: "score", criteria: "1,2,3" } } }), 422);
    assert.deepEqual(fields(nested), ["questions.q.criteria"]);
    const root = await errorBody(await gw.decide([1, 2]), 422);
    assert.deepEqual(root.errors, [{ field: "(body)", message: "must be an object" }]);
  });

  test("ids such as __proto__, constructor, a.b and unicode are ordinary ids everywhere", async () => {
    const ids = ["__proto__", "constructor", "a.b", "prototype", "hasOwnProperty", "質問 ✓", "toString"];
    // Written as text: in a JS object literal, __proto__ would set the prototype instead of a key.
    const criteria = '{"__proto__":"p","constructor":"c","x.y":"d"}';
    const questions = ids.map((id) => `${JSON.stringify(id)}:{"type":"choice","criteria":${criteria}}`).join(",");
    const res = await gw.decide(`{"state":{"__proto__":1},"questions":{${questions}}}`);
    const body = JSON.parse(await res.text());
    assert.equal(res.status, 200, JSON.stringify(body));
    assertShape("decision", body);
    assert.deepEqual(Object.keys(body.answers).sort(), [...ids].sort());
    assert.ok(Object.hasOwn(body.answers, "__proto__"));
    assert.deepEqual(Object.keys(body.answers.constructor.probabilities), ["__proto__", "constructor", "x.y"]);

    const bad = await errorBody(await gw.decide('{"state":1,"questions":{"__proto__":{"type":"noul","extra":1}}}'), 422);
    assert.deepEqual(fields(bad), ["questions.__proto__.extra"]);
    const slash = await errorBody(await gw.decide({ state: 1, questions: { "a/b~c": { type: "noul", x: 1 } } }), 422);
    assert.deepEqual(fields(slash), ["questions.a/b~c.x"]);
  });

  test("malformed JSON, an empty body, invalid UTF-8 and non-JSON content types are 422", async () => {
    const malformed = await errorBody(await gw.decide('{"state": 1, "questions": {'), 422);
    assert.match(malformed.detail, /not valid JSON/);
    await errorBody(await gw.decide(""), 422);
    const invalid = await fetch(`${gw.url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${gw.key}`, "content-type": "application/json" },
      body: Buffer.concat([Buffer.from('{"state":"'), Buffer.from([0xff, 0xfe]), Buffer.from('","questions":{"q":{"type":"noul"}}}')]),
    });
    assert.match((await errorBody(invalid, 422)).detail, /UTF-8/);
    for (const type of ["text/plain", "application/x-www-form-urlencoded", "application/jsonx"]) {
      const res = await gw.decide(JSON.stringify(sampleRequest()), { "content-type": type });
      assert.match((await errorBody(res, 422)).detail, /Content-Type must be application\/json/, type);
    }
    const charset = await gw.decide(JSON.stringify(sampleRequest()), { "content-type": "application/json; charset=utf-8" });
    assert.equal(charset.status, 200);
  });

  test("errors[] is bounded to 50 and the detail says how many were found", async () => {
    const extra = Object.fromEntries(Array.from({ length: 80 }, (_, i) => [`f${i}`, i]));
    const body = await errorBody(await gw.decide({ ...sampleRequest(), ...extra }), 422);
    assert.equal(body.errors!.length, 50);
    assert.match(body.detail, /first 50 of 80/);
  });

  test("every response, error or not, carries the request id headers", async () => {
    const res = await gw.decide("{");
    await res.text();
    const id = res.headers.get("x-service-request-id");
    assert.match(id ?? "", /^req_[a-z0-9]{24}$/);
    assert.equal(res.headers.get("x-typesafe-request-id"), id);
  });

  test("nothing is recorded for requests rejected before acceptance", async () => {
    const before = await usageCount();
    await (await gw.decide({ state: 1 })).text();
    await (await gw.decide({ ...sampleRequest(), model: "nope" })).text();
    await (await gw.decide("[")).text();
    await (await gw.decide(sampleRequest(), { authorization: "Bearer nope" })).text();
    assert.equal(await usageCount(), before);
  });
});

describe("max_questions below the contract's 32", () => {
  test("TDS_MAX_QUESTIONS=3 rejects 4 questions with a field error", async () => {
    const gw = await startGateway({ env: { TDS_MAX_QUESTIONS: "3" } });
    try {
      assert.equal((await gw.decide({ state: 1, questions: questionsWith(3) })).status, 200);
      const body = await errorBody(await gw.decide({ state: 1, questions: questionsWith(4) }), 422);
      assert.deepEqual(fields(body), ["questions"]);
      assert.match(body.errors![0]!.message, /max_questions/);
      assert.equal(gw.fake!.calls.decide, 1);
    } finally {
      await gw.close();
    }
  });
});

describe("shapes that slip past naive validators", () => {
  test("a question that is an array, even under __proto__, is rejected before the model", async () => {
    const gw = await startGateway();
    try {
      for (const text of [
        '{"state":{},"questions":{" ":[]}}',
        '{"state":{},"questions":{"__proto__":[]}}',
        '{"state":{},"questions":{"q":null}}',
      ]) {
        const body = await errorBody(await gw.decide(text), 422);
        assert.match(body.errors![0]!.message, /must be an object/, text);
      }
      assert.equal(gw.fake!.calls.decide, 0);
    } finally {
      await gw.close();
    }
  });

  test("JSON nested deeper than 256 levels is 422, not a 5xx; 256 levels pass", async () => {
    const gw = await startGateway();
    try {
      const nest = (n: number) => `${"[".repeat(n)}${"]".repeat(n)}`;
      assert.equal((await gw.decide(`{"state":${nest(255)},"questions":{"q":{"type":"noul"}}}`)).status, 200);
      for (const n of [256, 5000, 300_000]) {
        const body = await errorBody(await gw.decide(`{"state":${nest(n)},"questions":{"q":{"type":"noul","instructions":1}}}`), 422);
        assert.match(body.detail, /deeper than 256 levels/, String(n));
      }
      assert.equal(gw.fake!.calls.decide, 1);
    } finally {
      await gw.close();
    }
  });
});
