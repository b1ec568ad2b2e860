/**
 * The completion of a request whose outcome could not be stored: the client gets 503 and a second completion
 * (gateway_error, nothing charged) is tried in the background. Unavailable storage (a lost connection, a database
 * restarting) fails a step at once, so the background completion tries again after a pause until it is stored;
 * any other failure is left to the expiry sweep. The books' `complete` is wrapped to fail as a store would.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { DecisionRequest } from "../../src/contract/decision.ts";
import type { CompleteCommand, CompleteResult } from "../../src/domain/bookkeeping.ts";
import { ServiceError } from "../../src/domain/errors.ts";
import type { StoreFailureKind } from "../../src/store/store-errors.ts";
import { assertLedgerMatches } from "../support/books.ts";
import { MIXED_QUESTIONS } from "../support/fake-model-service.ts";
import { type PipelineRig, rigsClosedAfterEach } from "../support/pipeline-harness.ts";

const BODY: DecisionRequest = { state: { ticket: "charged twice" }, questions: MIXED_QUESTIONS };
const PAID = {
  env: { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1", TDS_RESERVE_TOKENS: "1000" },
  model: { tokenBound: () => ({ input: 400, output: 10 }) },
};

const rig = rigsClosedAfterEach();

/** A rig whose first `failures` completions fail with an error the store reads as `kind`; counts every completion. */
async function failingRig(failures: number, kind: StoreFailureKind): Promise<{ r: PipelineRig; calls: CompleteCommand[] }> {
  const r = await rig(PAID);
  await r.store.grantCredits({ orgId: r.org.id, amountMicrousd: 10_000, nowMs: r.clock.nowMs() });
  const failure = new Error(`storage failed (${kind}, test)`);
  const calls: CompleteCommand[] = [];
  const complete = r.books.complete.bind(r.books);
  const classify = r.books.classifyFailure.bind(r.books);
  Object.assign(r.books, {
    complete: (command: CompleteCommand, waitMs?: number): Promise<CompleteResult> => {
      calls.push(command);
      return calls.length <= failures ? Promise.reject(failure) : complete(command, waitMs);
    },
    classifyFailure: (err: unknown): StoreFailureKind => (err === failure ? kind : classify(err)),
  });
  return { r, calls };
}

async function answered503(r: PipelineRig, requestId: string): Promise<void> {
  await assert.rejects(r.decide(BODY, { requestId }), (err) => err instanceof ServiceError && err.code === "storage_unavailable");
}

test("unavailable storage: the background completion tries again until it is stored; nothing charged", async () => {
  const { r, calls } = await failingRig(3, "unavailable");
  await answered503(r, "req_bg_1");
  await Promise.all(r.background);
  assert.equal(calls.length, 4, "the first completion, two failed background tries, the one stored");
  assert.deepEqual(
    calls.slice(1).map((c) => c.outcome),
    ["gateway_error", "gateway_error", "gateway_error"],
  );
  const record = await r.store.getUsage(r.org.id, "req_bg_1");
  assert.equal(record?.outcome, "gateway_error");
  assert.equal(record?.httpStatus, 503);
  assert.equal(record?.costMicrousd, 0);
  assert.deepEqual(await r.store.getBalance(r.org.id), { available: 10_000, reserved: 0, spent: 0, granted: 10_000 });
  await assertLedgerMatches(r.store, r.org.id);
});

test("a failure that is not unavailable storage: one background try, the rest left to the expiry sweep", async () => {
  const { r, calls } = await failingRig(2, "other");
  await assert.rejects(r.decide(BODY, { requestId: "req_bg_2" }), /storage failed \(other, test\)/);
  await Promise.all(r.background);
  assert.equal(calls.length, 2, "the first completion and one background try");
  assert.equal((await r.store.getUsage(r.org.id, "req_bg_2"))?.outcome, "in_flight", "left in flight for the sweep");
});
