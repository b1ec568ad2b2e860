/**
 * The in-process fake ModelService (test/support/fake-model-service.ts) itself: its answers are the fake model
 * server's, and its scripting does what tests rely on. (The port's contract is checked in model-service-contract.test.ts.)
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { openSystemOneHttpService } from "../../src/models/systemone-http/systemone-http-service.ts";
import { startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { createFakeModelService, MIXED_QUESTIONS, MODEL_ERROR_KINDS, stepOfBehavior } from "../support/fake-model-service.ts";
import { expectModelError } from "./model-service-contract.ts";

const OK = { timeoutMs: 5000 };
const call = (state: unknown = { ticket: "charged twice" }) => ({ model: "fake-small", state, questions: MIXED_QUESTIONS });

describe("in-process fake ModelService", () => {
  test("answers and counts tokens exactly as the fake model server does over HTTP", async () => {
    const server = await startFakeModelServer();
    const http = openSystemOneHttpService({ baseUrl: server.url });
    const fake = createFakeModelService();
    try {
      const [overHttp, inProcess] = [await http.decide(call(), OK), await fake.decide(call(), OK)];
      assert.deepEqual(JSON.parse(JSON.stringify(inProcess.answers)), overHttp.answers);
      assert.deepEqual(inProcess.usage, overHttp.usage);
      assert.deepEqual(await fake.listModels(OK), await http.listModels(OK));
    } finally {
      await http.close();
      await server.close();
      await fake.close();
    }
  });

  test("scripted steps come first, one per call, then the state's fake_behavior, then the default", async () => {
    const fake = createFakeModelService();
    fake.failNext("overloaded", 2, "busy (scripted)");
    fake.script({ usage: { input_tokens: 7, output_tokens: 1 } });
    fake.setDefault({ fail: "bad_status" });
    assert.match((await expectModelError(fake.decide(call(), OK), "overloaded")).message, /busy \(scripted\)/);
    await expectModelError(fake.decide(call({ fake_behavior: "ok" }), OK), "overloaded");
    assert.deepEqual((await fake.decide(call(), OK)).usage, { input_tokens: 7, output_tokens: 1 });
    await expectModelError(fake.decide(call({ fake_behavior: "status:529" }), OK), "overloaded");
    assert.ok((await fake.decide(call({ fake_behavior: "ok" }), OK)).answers);
    await expectModelError(fake.decide(call(), OK), "bad_status");
    fake.setDefault(null);
    assert.ok((await fake.decide(call(), OK)).answers);
    assert.equal(fake.calls.decide, 7);
    assert.equal(fake.received.length, 7);
  });

  test("every ModelErrorKind can be scripted, by a step or by fake_behavior fail:KIND", async () => {
    const fake = createFakeModelService();
    for (const kind of MODEL_ERROR_KINDS) {
      fake.failNext(kind);
      await expectModelError(fake.decide(call(), OK), kind);
      await expectModelError(fake.decide(call({ fake_behavior: `fail:${kind}` }), OK), kind);
    }
    assert.equal(stepOfBehavior("no-such-behaviour"), null);
    await expectModelError(fake.decide(call({ fake_behavior: "no-such-behaviour" }), OK), "bad_status");
    fake.failListModels("unavailable");
    await expectModelError(fake.listModels(OK), "unavailable");
    fake.failListModels(null);
    assert.equal((await fake.listModels(OK)).length, 2);
  });

  test("holdNext keeps a call in flight until released; releaseHeld lets every held call go", async () => {
    const fake = createFakeModelService();
    const held = fake.holdNext({ usage: { input_tokens: 3, output_tokens: 3 } });
    const pending = fake.decide(call(), OK);
    await held.started;
    assert.equal(fake.inFlight, 1);
    held.release();
    assert.deepEqual((await pending).usage, { input_tokens: 3, output_tokens: 3 });
    assert.equal(fake.inFlight, 0);
    fake.holdNext();
    const second = fake.decide(call(), OK);
    fake.releaseHeld();
    assert.ok((await second).answers);
  });

  test("a pool: calls beyond poolSize wait in FIFO order within their deadline; one more than queueLimit is overloaded at once", async () => {
    const fake = createFakeModelService({ poolSize: 1, queueLimit: 2 });
    const order: string[] = [];
    const held = fake.holdNext();
    const first = fake.decide(call(), OK).then(() => order.push("first"));
    await held.started;
    const second = fake.decide(call(), OK).then(() => order.push("second"));
    await expectModelError(fake.decide(call(), { timeoutMs: 20 }), "timeout");
    const third = fake.decide(call(), OK).then(() => order.push("third"));
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(fake.poolStats!(), { busy: 1, size: 1, waiting: 2 }, "the timed-out call left the queue");
    await expectModelError(fake.decide(call(), OK), "overloaded");
    held.release();
    await Promise.all([first, second, third]);
    assert.deepEqual(order, ["first", "second", "third"]);
    assert.deepEqual(fake.poolStats!(), { busy: 0, size: 1, waiting: 0 });
  });

  test("enforces the published context: max_state, max_branch, and the input limit", async () => {
    const fake = createFakeModelService({
      models: [{ name: "m", context: { max_state: 100, max_branch: 150 } }],
      maxInputTokens: 1000,
    });
    const q = { ok: { type: "noul" as const } };
    assert.match(
      (await expectModelError(fake.decide({ model: "m", state: "x".repeat(401), questions: q }, OK), "context_rejected")).message,
      /max_state is 100/,
    );
    const long = { long: { type: "noul" as const, instructions: "y".repeat(300) } };
    assert.match(
      (await expectModelError(fake.decide({ model: "m", state: "x".repeat(300), questions: long }, OK), "context_rejected")).message,
      /max_branch is 150/,
    );
    assert.match(
      (await expectModelError(fake.decide({ model: "other", state: "x".repeat(5000), questions: q }, OK), "context_rejected")).message,
      /1\d{3} tokens > 1000/,
    );
    assert.ok((await fake.decide({ model: "m", state: "x".repeat(300), questions: q }, OK)).answers);
  });
});
