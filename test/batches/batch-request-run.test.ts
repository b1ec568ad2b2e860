/**
 * BatchRequestRun (src/batches/batch-request-run.ts) on the pipeline rig: a real SQLite store, the real
 * DecisionPipeline, a FixedClock and the in-process fake model service. Batches are written through the store and
 * claimed with it, by instance "i1", and taken over by "i2" once the lease has passed on the FixedClock.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, it } from "node:test";
import { BatchRequestRun, type BatchRequestRunDeps, batchIdempotencyKey, DEFER_MS } from "../../src/batches/batch-request-run.ts";
import type { DecisionRequest, DecisionResponse } from "../../src/contract/decision.ts";
import { errorResponse } from "../../src/contract/errors.ts";
import type { BatchResult, BatchStore, ClaimedRequest } from "../../src/store/batches.ts";
import { type PipelineRig, type PipelineRigOptions, rigsClosedAfterEach } from "../support/pipeline-harness.ts";
import { batchLine } from "./batch-support.ts";

const LEASE_MS = 15_000;
const DAY_MS = 86_400_000;

/** Paid at 1 µUSD per input token and 2 per output token. */
const PAID: PipelineRigOptions = {
  env: {
    TDS_SERVICE_MODE: "paid",
    TDS_PRICE_PER_MILLION_INPUT_USD: "1",
    TDS_PRICE_PER_MILLION_OUTPUT_USD: "2",
    TDS_RESERVE_TOKENS: "1000",
  },
  model: { tokenBound: () => ({ input: 400, output: 10 }) },
};

const rig = rigsClosedAfterEach();

/** A batch of `lines` (each with its custom_id), opened now on the rig's clock. */
async function submit(r: PipelineRig, id: string, lines: Record<string, unknown>[], model: string | null = null): Promise<void> {
  const now = r.clock.nowMs();
  await r.store.batches.beginBatch({ id, orgId: r.org.id, keyId: r.keyId, model, nowMs: now, expiresAtMs: now + DAY_MS });
  await r.store.batches.addLines(
    id,
    lines.map((line, position) => ({ position, customId: String(line.custom_id), body: JSON.stringify(line) })),
    now,
  );
  const opened = await r.store.batches.openBatch({ batchId: id, total: lines.length, inputBytes: 100, nowMs: now, idempotency: null });
  assert.equal(opened.kind, "opened");
}

async function claim(r: PipelineRig, instanceId: string): Promise<ClaimedRequest[]> {
  const now = r.clock.nowMs();
  return r.store.batches.claimRequests({ instanceId, nowMs: now, leaseUntilMs: now + LEASE_MS, limit: 10 });
}

async function claimOne(r: PipelineRig, instanceId: string): Promise<ClaimedRequest> {
  const claims = await claim(r, instanceId);
  assert.equal(claims.length, 1, `one claim for ${instanceId}`);
  return claims[0] as ClaimedRequest;
}

/** The lease of i1 passes; i2 takes the request over. */
async function takeOver(r: PipelineRig): Promise<ClaimedRequest> {
  r.clock.advance(LEASE_MS + 1);
  const taken = await claimOne(r, "i2");
  assert.equal(taken.takenOver, true);
  return taken;
}

function runner(r: PipelineRig, over: Partial<BatchRequestRunDeps> = {}): BatchRequestRun {
  return new BatchRequestRun({
    store: r.store,
    pipeline: r.pipeline,
    clock: r.clock,
    keyOf: (keyId) => r.store.findApiKey(keyId),
    onUnexpected: (err) => assert.fail(`unexpected: ${String(err)}`),
    ...over,
  });
}

/** The rig's store as a process that dies after its decision, before it writes the result. */
function dyingBeforeFinish(r: PipelineRig): BatchRequestRunDeps["store"] {
  const batches = r.store.batches;
  const dying = new Proxy(batches, {
    get(target, name) {
      if (name === "finishRequest") return async () => Promise.reject(new Error("the process died"));
      const value = Reflect.get(target, name);
      return typeof value === "function" ? value.bind(target) : value;
    },
  }) as BatchStore;
  return {
    batches: dying,
    getUsage: (orgId, requestId) => r.store.getUsage(orgId, requestId),
    classifyFailure: (err) => r.store.classifyFailure(err),
  };
}

async function resultsOf(r: PipelineRig, batchId: string): Promise<BatchResult[]> {
  return (await r.store.batches.results(r.org.id, batchId, { afterPosition: -1, limit: 100 })) ?? assert.fail("no such batch");
}

const responseOf = (body: string) => JSON.parse(body) as DecisionResponse;

describe("BatchRequestRun", () => {
  it("a fresh claim runs as a decision: 200 with the DecisionResponse under the claim's request id, its cost charged once", async () => {
    const r = await rig(PAID);
    await r.store.grantCredits({ orgId: r.org.id, amountMicrousd: 1_000_000, nowMs: r.clock.nowMs() });
    await submit(r, "batch_fresh", [batchLine(0)]);
    const c = await claimOne(r, "i1");
    assert.equal(c.takenOver, false);

    const outcome = await runner(r).run(c);
    assert.equal(outcome.kind, "finished");
    const [result] = await resultsOf(r, "batch_fresh");
    assert.ok(result);
    assert.equal(result.status, 200);
    assert.equal(result.requestId, c.requestId);
    const body = responseOf(result.body);
    assert.equal(body.request_id, c.requestId);
    assert.equal(body.service_mode, "paid");
    assert.deepEqual(Object.keys(body.answers), ["topic"]);
    assert.ok(body.usage.cost_microusd > 0, "paid mode charges");
    assert.deepEqual(outcome, { kind: "finished", status: 200, costMicrousd: body.usage.cost_microusd, written: true });
    assert.equal(result.costMicrousd, body.usage.cost_microusd);

    assert.equal(r.model.calls.decide, 1);
    const balance = await r.store.getBalance(r.org.id);
    assert.deepEqual(balance, {
      available: 1_000_000 - body.usage.cost_microusd,
      reserved: 0,
      spent: body.usage.cost_microusd,
      granted: 1_000_000,
    });
    const record = await r.store.getUsage(r.org.id, c.requestId);
    assert.equal(record?.outcome, "succeeded");
    assert.equal(record?.source, "batch");
    assert.equal(record?.costMicrousd, body.usage.cost_microusd);
    const batch = await r.store.batches.getBatch(r.org.id, "batch_fresh");
    assert.equal(batch?.status, "completed");
    assert.equal(batch?.costMicrousd, body.usage.cost_microusd);
  });

  it("a line's own model wins over the batch's; the batch's model applies to a line that names none", async () => {
    const r = await rig();
    await submit(r, "batch_models", [{ ...batchLine(0), model: "fake-small" }, batchLine(1)], "fake-large");
    const claims = await claim(r, "i1");
    assert.equal(claims.length, 2);
    const run = runner(r);
    for (const c of claims) assert.equal((await run.run(c)).kind, "finished");
    const results = await resultsOf(r, "batch_models");
    assert.deepEqual(
      results.map((x) => [x.customId, x.status, responseOf(x.body).model]),
      [
        ["r0", 200, "fake-small"],
        ["r1", 200, "fake-large"],
      ],
    );
    assert.deepEqual(
      r.model.received.map((call) => call.model),
      ["fake-small", "fake-large"],
    );
  });

  it("succeeded, then its process died before the result: the takeover replays the decision under the same id, charged once", async () => {
    const r = await rig(PAID);
    await r.store.grantCredits({ orgId: r.org.id, amountMicrousd: 1_000_000, nowMs: r.clock.nowMs() });
    await submit(r, "batch_replay", [batchLine(0)]);
    const first = await claimOne(r, "i1");
    const died = await runner(r, { store: dyingBeforeFinish(r) }).run(first);
    assert.equal(died.kind, "failed");
    assert.equal((await r.store.getUsage(r.org.id, first.requestId))?.outcome, "succeeded");
    assert.deepEqual(await resultsOf(r, "batch_replay"), [], "no result written");
    const charged = (await r.store.getBalance(r.org.id)).spent;
    assert.ok(charged > 0);

    const taken = await takeOver(r);
    assert.equal(taken.requestId, first.requestId, "a takeover keeps the request id");
    const outcome = await runner(r, { newRequestId: () => assert.fail("no new request id for a succeeded run") }).run(taken);
    assert.deepEqual(outcome, { kind: "finished", status: 200, costMicrousd: charged, written: true });
    const [result] = await resultsOf(r, "batch_replay");
    assert.equal(result?.requestId, first.requestId);
    assert.equal(responseOf(result?.body ?? "").request_id, first.requestId);
    assert.equal(result?.costMicrousd, charged);
    assert.equal(r.model.calls.decide, 1, "the model was called once in all");
    assert.equal((await r.store.getBalance(r.org.id)).spent, charged, "charged once");
    assert.equal((await r.store.batches.getBatch(r.org.id, "batch_replay"))?.costMicrousd, charged);
  });

  it("the same decision made directly (as the first holder did) is replayed by the takeover", async () => {
    const r = await rig(PAID);
    await r.store.grantCredits({ orgId: r.org.id, amountMicrousd: 1_000_000, nowMs: r.clock.nowMs() });
    const line = batchLine(0);
    await submit(r, "batch_direct", [line]);
    const first = await claimOne(r, "i1");
    const reply = await r.pipeline.decide(
      { requestId: first.requestId, org: r.org, keyId: r.keyId, source: "batch", startedAt: performance.now() },
      { state: line.state, questions: line.questions } as DecisionRequest,
      { key: batchIdempotencyKey("batch_direct", 0), requestHash: createHash("sha256").update(first.body).digest("hex") },
    );
    assert.equal(reply.status, 200);

    const taken = await takeOver(r);
    const outcome = await runner(r).run(taken);
    assert.equal(outcome.kind, "finished");
    const [result] = await resultsOf(r, "batch_direct");
    assert.equal(result?.body, reply.body, "the stored answer, replayed");
    assert.equal(r.model.calls.decide, 1);
    assert.equal((await r.store.getBalance(r.org.id)).spent, responseOf(reply.body).usage.cost_microusd);
  });

  it("failed, then its process died: the takeover runs it again under a new request id; the old id's finish changes nothing", async () => {
    const r = await rig(PAID);
    await r.store.grantCredits({ orgId: r.org.id, amountMicrousd: 1_000_000, nowMs: r.clock.nowMs() });
    await submit(r, "batch_failed", [batchLine(0)]);
    const first = await claimOne(r, "i1");
    r.model.setDefault({ fail: "bad_status", upstreamStatus: 500 });
    const died = await runner(r, { store: dyingBeforeFinish(r) }).run(first);
    assert.equal(died.kind, "failed");
    const failedRecord = await r.store.getUsage(r.org.id, first.requestId);
    assert.ok(failedRecord && failedRecord.outcome !== "succeeded" && failedRecord.outcome !== "in_flight", failedRecord?.outcome);
    const callsOfFirst = r.model.calls.decide;
    assert.ok(callsOfFirst >= 1);
    assert.equal((await r.store.getBalance(r.org.id)).spent, 0);
    r.model.setDefault(null);

    const taken = await takeOver(r);
    assert.equal(taken.requestId, first.requestId);
    const outcome = await runner(r, { newRequestId: () => "req_rerun_1" }).run(taken);
    assert.equal(outcome.kind, "finished");
    assert.equal(r.model.calls.decide, callsOfFirst + 1, "the model is called again");
    const [result] = await resultsOf(r, "batch_failed");
    assert.equal(result?.status, 200);
    assert.equal(result?.requestId, "req_rerun_1");
    const body = responseOf(result?.body ?? "");
    assert.equal(body.request_id, "req_rerun_1");
    assert.equal((await r.store.getUsage(r.org.id, "req_rerun_1"))?.outcome, "succeeded");
    assert.equal((await r.store.getBalance(r.org.id)).spent, body.usage.cost_microusd);

    const late = await r.store.batches.finishRequest({
      batchId: "batch_failed",
      position: 0,
      requestId: first.requestId,
      status: 502,
      body: "{}",
      costMicrousd: 0,
      nowMs: r.clock.nowMs(),
    });
    assert.equal(late, false);
    assert.deepEqual(await resultsOf(r, "batch_failed"), [result]);
  });

  it("its decision still in flight elsewhere: the takeover defers the claim for DEFER_MS and leaves the result to the first run", async () => {
    const r = await rig();
    await submit(r, "batch_held", [batchLine(0)]);
    const first = await claimOne(r, "i1");
    const held = r.model.holdNext();
    const firstRun = runner(r).run(first);
    await held.started;

    const taken = await takeOver(r);
    const outcome = await runner(r).run(taken);
    assert.deepEqual(outcome, { kind: "deferred", reason: "held_elsewhere" });
    assert.equal(r.model.calls.decide, 1, "no second model call");
    const deferredAt = r.clock.nowMs();
    assert.deepEqual(await claim(r, "i3"), [], "not claimable at once");
    r.clock.set(deferredAt + DEFER_MS);
    assert.deepEqual(await claim(r, "i3"), [], "nor when DEFER_MS has just passed");
    r.clock.set(deferredAt + DEFER_MS + 1);

    held.release();
    assert.deepEqual(await firstRun, { kind: "finished", status: 200, costMicrousd: 0, written: true });
    const [result] = await resultsOf(r, "batch_held");
    assert.equal(result?.requestId, first.requestId);
    assert.deepEqual(await claim(r, "i3"), [], "finished: nothing to claim");
  });

  it("storage fails as the claim is deferred: the outcome is `failed`, for the runner to give the claim back", async () => {
    const r = await rig();
    await submit(r, "batch_defer_fails", [batchLine(0)]);
    const first = await claimOne(r, "i1");
    const held = r.model.holdNext();
    const firstRun = runner(r).run(first);
    await held.started;
    const taken = await takeOver(r);
    const down = new Error("database down");
    const batches = new Proxy(r.store.batches, {
      get(target, name) {
        if (name === "deferClaim") return async () => Promise.reject(down);
        const value = Reflect.get(target, name);
        return typeof value === "function" ? value.bind(target) : value;
      },
    }) as BatchStore;
    const store: BatchRequestRunDeps["store"] = {
      batches,
      getUsage: (orgId, requestId) => r.store.getUsage(orgId, requestId),
      classifyFailure: (err) => r.store.classifyFailure(err),
    };
    const outcome = await runner(r, { store })
      .run(taken)
      .catch((err: unknown) => ({ rejected: err }));
    assert.deepEqual(outcome, {
      kind: "failed",
      claim: { batchId: "batch_defer_fails", position: 0, requestId: first.requestId },
      error: down,
    });
    held.release();
    await firstRun;
  });

  it("a deferred claim is claimed again after DEFER_MS, with its request id", async () => {
    const r = await rig();
    await submit(r, "batch_again", [batchLine(0)]);
    const first = await claimOne(r, "i1");
    const held = r.model.holdNext();
    const firstRun = runner(r).run(first);
    await held.started;
    const taken = await takeOver(r);
    assert.equal((await runner(r).run(taken)).kind, "deferred");
    r.clock.advance(DEFER_MS + 1);
    const again = await claimOne(r, "i3");
    assert.equal(again.requestId, first.requestId);
    assert.equal(again.takenOver, true);
    held.release();
    assert.equal((await firstRun).kind, "finished");
  });

  for (const [what, breakIt, code] of [
    ["its key revoked", (r: PipelineRig) => r.store.revokeApiKey(r.keyId, r.clock.nowMs()), "revoked_api_key"],
    ["its organization paused", (r: PipelineRig) => r.store.setOrganizationPaused(r.org.id, true), "org_paused"],
  ] as const) {
    it(`${what}: the result is the API's error answer, nothing called or charged`, async () => {
      const r = await rig(PAID);
      await r.store.grantCredits({ orgId: r.org.id, amountMicrousd: 1_000_000, nowMs: r.clock.nowMs() });
      await submit(r, "batch_refused", [batchLine(0)]);
      const c = await claimOne(r, "i1");
      await breakIt(r);
      const outcome = await runner(r).run(c);
      const status = code === "org_paused" ? 403 : 401;
      assert.deepEqual(outcome, { kind: "finished", status, costMicrousd: 0, written: true });
      const [result] = await resultsOf(r, "batch_refused");
      assert.equal(result?.status, status);
      assert.deepEqual(JSON.parse(result?.body ?? ""), errorResponse(code));
      assert.equal(r.model.calls.decide, 0);
      assert.equal((await r.store.getBalance(r.org.id)).spent, 0);
    });
  }

  it("its key gone: 401 invalid_api_key", async () => {
    const r = await rig();
    await submit(r, "batch_nokey", [batchLine(0)]);
    const c = await claimOne(r, "i1");
    const outcome = await runner(r, { keyOf: async () => null }).run(c);
    assert.deepEqual(outcome, { kind: "finished", status: 401, costMicrousd: 0, written: true });
    const [result] = await resultsOf(r, "batch_nokey");
    assert.deepEqual(JSON.parse(result?.body ?? ""), errorResponse("invalid_api_key"));
  });

  it("the shutdown signal fires mid-call: left to run again, no result written", async () => {
    const r = await rig();
    await submit(r, "batch_shutdown", [batchLine(0)]);
    const c = await claimOne(r, "i1");
    const shutdown = new AbortController();
    const held = r.model.holdNext();
    const running = runner(r, { signal: shutdown.signal }).run(c);
    await held.started;
    shutdown.abort();
    assert.deepEqual(await running, { kind: "left", reason: "shutdown" });
    assert.deepEqual(await resultsOf(r, "batch_shutdown"), []);
    assert.equal((await r.store.batches.getBatch(r.org.id, "batch_shutdown"))?.status, "running");
    held.release();
  });
});
