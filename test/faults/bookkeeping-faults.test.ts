/**
 * Faults between a request's two durable steps, through a real listening gateway: an exception after admission
 * that is not a storage error, a model service reporting absurd token counts, and a group-committed batch in which
 * one request's completion fails while the others in the same transaction succeed. After each: charged at most
 * once, exactly one final usage record per accepted request, every reservation resolved once, the ledger sums to
 * the balance. (The SQLite lock and full-disk faults are in sqlite-storage.test.ts; a lock held by another
 * process while health checks run is in test/http/storage-failures.test.ts.)
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { AdmitCommand, CompleteCommand } from "../../src/domain/bookkeeping.ts";
import type { ModelAnswerSet, ModelService } from "../../src/models/model-service.ts";
import type { SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { allUsage, assertLedgerMatches, eventually } from "../support/books.ts";
import { errorBody, json } from "../support/contract-check.ts";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { byteBound } from "../support/token-bound.ts";

const PAID = { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1" };
const GRANT = 100_000;

/** Valid answers for sampleRequest()'s three questions. */
function answersFor(): ModelAnswerSet["answers"] {
  return {
    topic: { type: "choice", choice: "billing", probabilities: { billing: 0.7, bug: 0.2, other: 0.1 }, confidence: 0.5 },
    urgency: { type: "score", score: 1.5, probabilities: { "0": 0.1, "1": 0.4, "2": 0.4, "3": 0.1 }, confidence: 0.3 },
    refund: { type: "noul", noul: 0.6 },
  } as unknown as ModelAnswerSet["answers"];
}

/** A model service whose answer for each call is made by `answer` (from the call's state). */
function scriptedModel(answer: (state: unknown) => ModelAnswerSet | Promise<ModelAnswerSet>): ModelService {
  return {
    listModels: async () => [{ name: "scripted" }],
    decide: async (call) => answer(call.state),
    close: async () => {},
  };
}

const ok = (inputTokens = 100): ModelAnswerSet => ({
  answers: answersFor(),
  usage: { input_tokens: inputTokens, output_tokens: 3 },
  latencyMs: 1,
});

describe("faults after admission", { timeout: 30_000 }, () => {
  test("an exception after admission that is not a storage error → 500, released at once, one gateway_error record; a retry runs anew", async () => {
    let explode = true;
    const model = scriptedModel(() => {
      if (!explode) return ok();
      // An answer set whose answers throw when read: a bug in a model adapter, not a storage error.
      const bug = () => {
        throw new TypeError("adapter bug");
      };
      const answers = new Proxy({}, { get: bug, has: bug, ownKeys: bug, getOwnPropertyDescriptor: bug });
      return { answers: answers as ModelAnswerSet["answers"], usage: { input_tokens: 100, output_tokens: 3 }, latencyMs: 1 };
    });
    const gw = await startGateway({ modelService: model, env: PAID });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: GRANT, nowMs: Date.now() });
      const key = { "idempotency-key": "exploding-1" };
      const res = await gw.decide(sampleRequest(), key);
      const body = await errorBody(res, 500);
      assert.equal(body.detail, "Internal error.");
      const requestId = res.headers.get("x-service-request-id")!;
      const record = await gw.store.getUsage(gw.orgId, requestId);
      assert.deepEqual([record?.outcome, record?.httpStatus, record?.costMicrousd], ["gateway_error", 500, 0]);
      assert.equal((await gw.store.getReservation(requestId))?.status, "released", "released in the completion, not left to the sweep");
      assert.deepEqual(await assertLedgerMatches(gw.store, gw.orgId), { available: GRANT, reserved: 0, spent: 0, granted: GRANT });

      explode = false;
      const retry = await gw.decide(sampleRequest(), key);
      const retried = await json(retry);
      assert.equal(retry.status, 200, JSON.stringify(retried));
      assert.notEqual(retried.request_id, requestId);
      const cost = retried.usage.cost_microusd as number;
      assert.deepEqual(await assertLedgerMatches(gw.store, gw.orgId), {
        available: GRANT - cost,
        reserved: 0,
        spent: cost,
        granted: GRANT,
      });
      assert.deepEqual((await allUsage(gw.store, gw.orgId)).map((r) => r.outcome).sort(), ["gateway_error", "succeeded"]);
    } finally {
      await gw.close();
    }
  });

  test("a client that disconnects while the model works: the request is still completed once, and charged once", async () => {
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let bothCalled!: () => void;
    const inModel = new Promise<void>((resolve) => (bothCalled = resolve));
    let calls = 0;
    const model = scriptedModel(async () => {
      if (++calls === 2) bothCalled();
      await held;
      return ok();
    });
    const gw = await startGateway({ modelService: model, env: PAID });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: GRANT, nowMs: Date.now() });
      const controller = new AbortController();
      const pending = gw.decide(sampleRequest());
      const aborted = fetch(`${gw.url}/v1/systemone`, {
        method: "POST",
        signal: controller.signal,
        headers: { authorization: `Bearer ${gw.key}`, "content-type": "application/json" },
        body: JSON.stringify(sampleRequest({ state: "abandoned by its client" })),
      }).catch((err: Error) => err);
      await inModel; // both admitted, both in the model call
      controller.abort();
      assert.ok((await aborted) instanceof Error, "the client went away");
      release();
      assert.equal((await pending).status, 200);
      await eventually("both requests completed", async () => (await allUsage(gw.store, gw.orgId)).every((r) => r.outcome !== "in_flight"));
      const records = await allUsage(gw.store, gw.orgId);
      assert.deepEqual(
        records.map((r) => r.outcome),
        ["succeeded", "succeeded"],
        "the abandoned request is recorded as answered",
      );
      const spent = records.reduce((sum, r) => sum + r.costMicrousd, 0);
      assert.deepEqual(await assertLedgerMatches(gw.store, gw.orgId), { available: GRANT - spent, reserved: 0, spent, granted: GRANT });
      for (const r of records) assert.equal((await gw.store.getReservation(r.requestId))?.status, "settled");
    } finally {
      release();
      await gw.close();
    }
  });

  test("absurd token counts from the model service are charged the reservation, never more, never a 500", async () => {
    const model = scriptedModel(() => ({
      answers: answersFor(),
      usage: { input_tokens: Number.MAX_SAFE_INTEGER, output_tokens: Number.MAX_SAFE_INTEGER },
      latencyMs: 1,
    }));
    const gw = await startGateway({
      modelService: model,
      env: { ...PAID, TDS_PRICE_PER_MILLION_INPUT_USD: "1000", TDS_PRICE_PER_MILLION_OUTPUT_USD: "1000" },
    });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 5_000_000, nowMs: Date.now() });
      const res = await gw.decide(sampleRequest());
      const body = await json(res);
      assert.equal(res.status, 200, JSON.stringify(body));
      // The reservation: the request's token bound (its bytes and the template overhead; the scripted model publishes
      // no context) and 3 output tokens (one per question) × 1000 USD per million.
      const reservation = (byteBound(sampleRequest()) + 3) * 1000;
      assert.equal(body.usage.cost_microusd, reservation);
      const record = await gw.store.getUsage(gw.orgId, body.request_id);
      assert.deepEqual([record?.outcome, record?.overReservation, record?.costMicrousd], ["succeeded", true, reservation]);
      assert.deepEqual(await assertLedgerMatches(gw.store, gw.orgId), {
        available: 5_000_000 - reservation,
        reserved: 0,
        spent: reservation,
        granted: 5_000_000,
      });
    } finally {
      await gw.close();
    }
  });

  test("a batch in which one request's completion fails: that one gets 500 with nothing charged, the others of the same transaction succeed", async () => {
    const N = 6;
    let arrived = 0;
    let release!: () => void;
    const barrier = new Promise<void>((resolve) => (release = resolve));
    // Every call waits until all N arrived, so that their completions are committed together.
    const model = scriptedModel(async (state) => {
      if (++arrived === N) release();
      await barrier;
      return ok((state as { poison?: boolean }).poison ? 4242 : 100);
    });
    const gw = await startGateway({ modelService: model, env: PAID });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: GRANT, nowMs: Date.now() });
      // The poisoned request's settlement fails inside the database (as a constraint or trigger of an operator would).
      (gw.store as SqliteStore).db.exec(
        "CREATE TRIGGER fail_one BEFORE UPDATE ON usage_records WHEN NEW.input_tokens = 4242 AND NEW.outcome = 'succeeded' " +
          "BEGIN SELECT RAISE(ABORT, 'injected settlement failure'); END",
      );
      const batches: { admissions: readonly AdmitCommand[]; completions: readonly CompleteCommand[] }[] = [];
      const commit = gw.store.commitBatch;
      gw.store.commitBatch = (batch) => {
        batches.push(batch);
        return commit(batch);
      };
      const responses = await Promise.all(Array.from({ length: N }, (_, i) => gw.decide(sampleRequest({ state: { i, poison: i === 2 } }))));
      const statuses = responses.map((r) => r.status);
      assert.deepEqual(statuses, [200, 200, 500, 200, 200, 200]);
      const together = batches.find((b) => b.completions.length > 1 && b.completions.some((c) => c.inputTokens === 4242));
      assert.ok(
        together,
        `the poisoned completion was committed together with others: ${JSON.stringify(batches.map((b) => [b.admissions.length, b.completions.length]))}`,
      );

      const bodies = await Promise.all(responses.map((r) => r.json() as Promise<Record<string, unknown>>));
      const poisonedId = responses[2]!.headers.get("x-service-request-id")!;
      // Its completion failed; the second one (nothing charged) runs after the answer.
      await eventually(
        "the poisoned request is completed",
        async () => (await gw.store.getUsage(gw.orgId, poisonedId))?.outcome !== "in_flight",
      );
      const poisoned = await gw.store.getUsage(gw.orgId, poisonedId);
      assert.deepEqual([poisoned?.outcome, poisoned?.costMicrousd], ["gateway_error", 0]);
      assert.equal((await gw.store.getReservation(poisonedId))?.status, "released");
      let charged = 0;
      for (const [i, body] of bodies.entries()) {
        if (i === 2) continue;
        const record = await gw.store.getUsage(gw.orgId, body.request_id as string);
        assert.equal(record?.outcome, "succeeded");
        assert.equal((await gw.store.getReservation(body.request_id as string))?.status, "settled");
        charged += (body.usage as { cost_microusd: number }).cost_microusd;
      }
      assert.ok(charged > 0);
      assert.deepEqual(await assertLedgerMatches(gw.store, gw.orgId), {
        available: GRANT - charged,
        reserved: 0,
        spent: charged,
        granted: GRANT,
      });
      assert.equal((await allUsage(gw.store, gw.orgId)).length, N, "one final record per accepted request");
    } finally {
      await gw.close();
    }
  });
});
