import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Question } from "../../src/contract/decision.ts";
import { checkAnswers } from "../../src/gateway/answer-check.ts";
import type { LlamaService } from "../../src/models/llama/llama-service.ts";
import type { ModelCall } from "../../src/models/model-service.ts";
import { expectKind, type ModelDir, makeModelDir, manyOptions, tinyService } from "../fixtures/gguf/tiny-model.ts";

const small: Record<string, Question> = { ok: { type: "noul", instructions: "Is it fine?" } };
/** Enough work to keep the single context busy for a while (hundreds of ms on the tiny model). */
const slow: Record<string, Question> = Object.fromEntries(
  Array.from({ length: 6 }, (_, i) => [`q${i}`, { type: "choice", instructions: `question ${i}`, criteria: manyOptions(100) } as Question]),
);

function call(questions: Record<string, Question>): ModelCall {
  return { model: "tiny", state: { facts: ["the sky is blue"] }, questions };
}

let models: ModelDir;
let service: LlamaService;

before(async () => {
  models = makeModelDir();
  service = tinyService(models.model("tiny"), { poolSize: 1, queueLimit: 1 });
  await service.ready();
});

after(async () => {
  await service?.close();
  models?.cleanup();
});

/** The service still answers correctly (its context was given back). */
async function stillWorks(): Promise<void> {
  const r = await service.decide(call(small), { timeoutMs: 30_000 });
  assert.ok(checkAnswers(small, r.answers).ok);
}

describe("embedded engine: pool, queue, deadlines", () => {
  test("a full queue is overloaded at once; queued requests run in FIFO order", async () => {
    const order: string[] = [];
    const running = service.decide(call(slow), { timeoutMs: 60_000 }).then((r) => {
      order.push("slow");
      return r;
    });
    // Let the slow request take the only context.
    await new Promise((r) => setImmediate(r));
    const queued = service.decide(call(small), { timeoutMs: 60_000 }).then((r) => {
      order.push("queued");
      return r;
    });
    await expectKind(
      service.decide(call(small), { timeoutMs: 60_000 }),
      "overloaded",
      /busy: 1 request\(s\) running and 1 waiting \(queue limit 1\)/,
    );
    order.push("overloaded");
    const [a, b] = await Promise.all([running, queued]);
    assert.ok(checkAnswers(slow, a.answers).ok);
    assert.ok(checkAnswers(small, b.answers).ok);
    assert.deepEqual(order, ["overloaded", "slow", "queued"], "overloaded at once, while the others still ran or waited");
  });

  test("a deadline that passes while waiting in the queue is a timeout, and leaves the queue", async () => {
    let runningDone = false;
    const running = service.decide(call(slow), { timeoutMs: 60_000 }).finally(() => {
      runningDone = true;
    });
    await new Promise((r) => setImmediate(r));
    const started = performance.now();
    await expectKind(service.decide(call(small), { timeoutMs: 50 }), "timeout", /did not answer within 50 ms/);
    const waited = performance.now() - started;
    // A lower bound only (a timer never fires early); that it did not wait for the running call is an order.
    assert.ok(waited >= 45, `timed out after ${waited} ms`);
    assert.equal(runningDone, false, "timed out while the running call still held the context");
    // The queue has room again at once.
    const next = service.decide(call(small), { timeoutMs: 60_000 });
    assert.ok(checkAnswers(slow, (await running).answers).ok);
    assert.ok(checkAnswers(small, (await next).answers).ok);
  });

  test("a deadline that passes during evaluation is a timeout without waiting for the evaluation", async () => {
    await expectKind(service.decide(call(slow), { timeoutMs: 80 }), "timeout");
    // The context is given back when the evaluation notices the deadline, after the call was answered.
    assert.equal(service.poolStats().busy, 1, "the evaluation was still running when the call timed out");
    await stillWorks();
  });

  test("an aborted signal is 'aborted', before or during the call", async () => {
    const already = new AbortController();
    already.abort();
    await expectKind(service.decide(call(small), { timeoutMs: 60_000, signal: already.signal }), "aborted");

    const later = new AbortController();
    const pending = service.decide(call(slow), { timeoutMs: 60_000, signal: later.signal });
    setTimeout(() => later.abort(), 30);
    await expectKind(pending, "aborted");
    assert.equal(service.poolStats().busy, 1, "aborted while the evaluation still ran: the call did not wait for it");
    await stillWorks();
  });

  test("close() rejects waiting and later calls and releases the model", async () => {
    const own = tinyService(models.model("tiny"), { poolSize: 1, queueLimit: 4 });
    await own.ready();
    const running = own.decide(call(slow), { timeoutMs: 60_000 });
    await new Promise((r) => setImmediate(r));
    const waiting = own.decide(call(small), { timeoutMs: 60_000 });
    const closing = own.close();
    await expectKind(waiting, "unavailable", /closed/);
    await Promise.allSettled([running]);
    await closing;
    await expectKind(own.decide(call(small), { timeoutMs: 1000 }), "unavailable", /closed/);
  });
});
