import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { AdmitCommand, AdmitResult, CompleteCommand, CompleteResult } from "../../src/domain/bookkeeping.ts";
import { GroupCommit } from "../../src/store/group-commit.ts";
import type { BookkeepingStore } from "../../src/store/store.ts";
import type { StoreFailureKind } from "../../src/store/store-errors.ts";
import { settlesBefore } from "../support/timer-race.ts";

type Batch = Parameters<BookkeepingStore["commitBatch"]>[0];

const admit = (requestId: string): AdmitCommand => ({
  requestId,
  orgId: "org_a",
  keyId: "key_a",
  source: "api",
  model: "m",
  mode: "preview",
  nowMs: 1,
  idempotency: null,
  quota: { day: "2026-11-26", orgLimit: 100, globalLimit: 100 },
  reservation: null,
});

const complete = (requestId: string): CompleteCommand => ({
  requestId,
  orgId: "org_a",
  nowMs: 2,
  outcome: "succeeded",
  httpStatus: 200,
  inputTokens: 1,
  outputTokens: 0,
  costMicrousd: 0,
  latencyMs: 1,
  gatewayLatencyMs: 1,
  errorDetail: null,
  overReservation: false,
  deployment: "svc-a",
  attempts: 1,
  reserved: false,
  idempotency: null,
});

class Busy extends Error {
  readonly code = "SQLITE_BUSY";
}
class Down extends Error {
  readonly code = "ECONNREFUSED";
}

/** As a store reads its failures: Busy can run again, Down is the storage unavailable, anything else is other. */
const classifyFailure = (e: unknown): StoreFailureKind => (e instanceof Busy ? "retryable" : e instanceof Down ? "unavailable" : "other");

/**
 * A store whose commitBatch records each transaction and answers every admission with `admitted` and every
 * completion with `completed`, unless `fail` throws for the batch.
 */
function fakeStore(fail: (batch: Batch, attempt: number) => void = () => {}, delayMs = 0) {
  const transactions: string[][] = [];
  let attempt = 0;
  const store = {
    classifyFailure,
    async commitBatch(batch: Batch) {
      attempt++;
      if (delayMs) await new Promise((r) => setTimeout(r, delayMs));
      fail(batch, attempt);
      transactions.push([...batch.completions.map((c) => `c:${c.requestId}`), ...batch.admissions.map((a) => `a:${a.requestId}`)]);
      return {
        admissions: batch.admissions.map(
          (a): AdmitResult => (a.requestId.startsWith("full") ? { kind: "quota_exhausted", scope: "org" } : { kind: "admitted" }),
        ),
        completions: batch.completions.map((): CompleteResult => ({ kind: "completed" })),
      };
    },
  };
  return { store, transactions };
}

describe("GroupCommit: group commit of durable steps", () => {
  test("steps submitted in one event-loop turn share one transaction; each gets its own result, in order", async () => {
    const { store, transactions } = fakeStore();
    const books = new GroupCommit(store);
    const results = await Promise.all([
      books.admit(admit("r1")),
      books.complete(complete("r0")),
      books.admit(admit("full_r2")),
      books.admit(admit("r3")),
    ]);
    assert.deepEqual(results, [
      { kind: "admitted" },
      { kind: "completed" },
      { kind: "quota_exhausted", scope: "org" },
      { kind: "admitted" },
    ]);
    assert.deepEqual(transactions, [["c:r0", "a:r1", "a:full_r2", "a:r3"]]);
  });

  test("steps submitted while a transaction runs wait for it and go together into the next one", async () => {
    let started!: () => void;
    const running = new Promise<void>((resolve) => (started = resolve));
    let finish!: () => void;
    const held = new Promise<void>((resolve) => (finish = resolve));
    const { store, transactions } = fakeStore();
    const gated = {
      classifyFailure,
      async commitBatch(batch: Batch) {
        if (transactions.length === 0) {
          started();
          await held;
        }
        return store.commitBatch(batch);
      },
    };
    const books = new GroupCommit(gated);
    const first = books.admit(admit("r1"));
    await running;
    const later = [books.admit(admit("r2")), books.complete(complete("r1")), books.admit(admit("r3"))];
    await new Promise((r) => setImmediate(r));
    assert.equal(books.waiting, 3, "they wait while the first transaction runs");
    finish();
    await Promise.all([first, ...later]);
    assert.deepEqual(transactions, [["a:r1"], ["c:r1", "a:r2", "a:r3"]]);
  });

  test("never more than maxBatch steps in one transaction", async () => {
    const { store, transactions } = fakeStore();
    const books = new GroupCommit(store, { maxBatch: 3 });
    await Promise.all(Array.from({ length: 7 }, (_, i) => books.admit(admit(`r${i}`))));
    assert.deepEqual(
      transactions.map((t) => t.length),
      [3, 3, 1],
    );
  });

  test("a transaction that fails for one step's sake is committed again step by step: only that step fails", async () => {
    const { store, transactions } = fakeStore((batch) => {
      if (batch.admissions.some((a) => a.requestId === "bad")) throw new Error("CHECK constraint failed");
    });
    const books = new GroupCommit(store);
    const results = await Promise.allSettled([books.admit(admit("r1")), books.admit(admit("bad")), books.complete(complete("r0"))]);
    assert.deepEqual(
      results.map((r) => r.status),
      ["fulfilled", "rejected", "fulfilled"],
    );
    assert.match(String((results[1] as PromiseRejectedResult).reason), /CHECK constraint failed/);
    assert.deepEqual(transactions, [["a:r1"], ["c:r0"]]);
  });

  test("busy storage: the same steps are tried again after a pause, without blocking, until they commit", async () => {
    const { store, transactions } = fakeStore((_batch, attempt) => {
      if (attempt <= 3) throw new Busy("database is locked");
    });
    const books = new GroupCommit(store);
    let ticks = 0;
    const timer = setInterval(() => ticks++, 1);
    const results = await Promise.all([books.admit(admit("r1")), books.admit(admit("r2"))]);
    clearInterval(timer);
    assert.deepEqual(results, [{ kind: "admitted" }, { kind: "admitted" }]);
    assert.deepEqual(transactions, [["a:r1", "a:r2"]]);
    assert.ok(ticks > 0, "the event loop ran while waiting");
  });

  test("busy storage past a step's wait: that step fails with the busy error, later steps keep waiting", async () => {
    let busy = true;
    const { store } = fakeStore(() => {
      if (busy) throw new Busy("database is locked");
    });
    const books = new GroupCommit(store, { waitMs: 60 });
    const started = performance.now();
    const early = books.admit(admit("r1"));
    // Its wait and the pauses between tries are timers due long before this one: an order no load changes.
    assert.ok(await settlesBefore(early, 1000), "failed after its own wait, not a longer one");
    await assert.rejects(early, Busy);
    const waited = performance.now() - started;
    assert.ok(waited >= 55, `failed after its wait, not before: ${waited} ms`);
    const late = books.admit(admit("r2"), 1000);
    setTimeout(() => (busy = false), 30);
    assert.deepEqual(await late, { kind: "admitted" });
  });

  test("storage unavailable (connection refused): every step of the transaction fails at once, none is tried alone", async () => {
    const { store } = fakeStore(() => {
      throw new Down("connect ECONNREFUSED");
    });
    let calls = 0;
    const counting = {
      classifyFailure,
      commitBatch: (b: Batch) => {
        calls++;
        return store.commitBatch(b);
      },
    };
    const books = new GroupCommit(counting);
    const results = await Promise.allSettled([books.admit(admit("r1")), books.admit(admit("r2")), books.complete(complete("r0"))]);
    assert.deepEqual(
      results.map((r) => r.status),
      ["rejected", "rejected", "rejected"],
    );
    assert.equal(calls, 1);
  });

  test("reports each transaction's size, duration and result", async () => {
    const seen: [number, boolean][] = [];
    const { store } = fakeStore((batch) => {
      if (batch.admissions.some((a) => a.requestId === "bad")) throw new Error("boom");
    });
    const books = new GroupCommit(store, {
      onCommit: (steps, seconds, ok) => {
        assert.ok(seconds >= 0);
        seen.push([steps, ok]);
      },
    });
    await Promise.allSettled([books.admit(admit("r1")), books.admit(admit("bad"))]);
    assert.deepEqual(seen, [
      [2, false],
      [1, true],
      [1, false],
    ]);
  });
});
