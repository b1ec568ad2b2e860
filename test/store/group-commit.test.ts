import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { AdmitCommand, AdmitResult, CompleteCommand, CompleteResult } from "../../src/domain/bookkeeping.ts";
import { GroupCommit, laneOf, lanesFor } from "../../src/store/group-commit.ts";
import type { BookkeepingStore } from "../../src/store/store.ts";
import type { StoreFailureKind } from "../../src/store/store-errors.ts";
import { settlesBefore } from "../support/timer-race.ts";

type Batch = Parameters<BookkeepingStore["commitBatch"]>[0];

const admit = (requestId: string, orgId = "org_a"): AdmitCommand => ({
  requestId,
  orgId,
  keyId: "key_a",
  source: "api",
  model: "m",
  mode: "preview",
  nowMs: 1,
  idempotency: null,
  quota: { day: "2026-11-26", orgLimit: 100, globalLimit: 100 },
  reservation: null,
});

const complete = (requestId: string, orgId = "org_a"): CompleteCommand => ({
  requestId,
  orgId,
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

/** Organizations whose steps go to `lanes` different lanes of `of` (the first found, in order). */
function orgsInLanes(count: number, of: number): string[] {
  const byLane = new Map<number, string>();
  for (let i = 0; byLane.size < count; i++) if (!byLane.has(laneOf(`org_${i}`, of))) byLane.set(laneOf(`org_${i}`, of), `org_${i}`);
  return [...byLane.values()];
}

/**
 * A store that records, for every transaction, the organizations of the transactions running when it started, and
 * holds each transaction until a timer of `holdMs` (or `gate`, when given) lets it commit.
 */
function overlapStore(options: { holdMs?: number; fail?: (batch: Batch) => void; gate?: Promise<void> } = {}) {
  const running = new Set<Set<string>>();
  const transactions: { orgs: string[]; alongside: string[][]; ids: string[] }[] = [];
  let mostAtOnce = 0;
  const store = {
    classifyFailure,
    async commitBatch(batch: Batch) {
      const orgs = new Set([...batch.admissions.map((a) => a.orgId), ...batch.completions.map((c) => c.orgId)]);
      const ids = [...batch.completions.map((c) => `c:${c.requestId}`), ...batch.admissions.map((a) => `a:${a.requestId}`)];
      transactions.push({ orgs: [...orgs], alongside: [...running].map((o) => [...o]), ids });
      running.add(orgs);
      mostAtOnce = Math.max(mostAtOnce, running.size);
      try {
        await (options.gate ?? new Promise((r) => setTimeout(r, options.holdMs ?? 1)));
        options.fail?.(batch);
        return {
          admissions: batch.admissions.map((): AdmitResult => ({ kind: "admitted" })),
          completions: batch.completions.map((): CompleteResult => ({ kind: "completed" })),
        };
      } finally {
        running.delete(orgs);
      }
    },
  };
  return { store, transactions, mostAtOnce: () => mostAtOnce };
}

describe("GroupCommit: lanes, by organization", () => {
  test("two organizations of different lanes: their steps run in concurrent transactions", async () => {
    const [orgA, orgB] = orgsInLanes(2, 2) as [string, string];
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    const { store, transactions, mostAtOnce } = overlapStore({ gate });
    const books = new GroupCommit(store, { lanes: 2 });
    const steps = Promise.all([books.admit(admit("a1", orgA)), books.admit(admit("b1", orgB)), books.complete(complete("a0", orgA))]);
    while (transactions.length < 2) await new Promise((r) => setImmediate(r));
    assert.equal(mostAtOnce(), 2, "both transactions are open at once");
    open();
    await steps;
    assert.deepEqual(transactions.map((t) => t.ids).sort(), [["a:b1"], ["c:a0", "a:a1"]]);
    assert.deepEqual(transactions[1]!.alongside, [transactions[0]!.orgs], "the second started while the first ran");
  });

  test("one organization's steps are never in two concurrent transactions; other organizations' run alongside", async () => {
    const { store, transactions, mostAtOnce } = overlapStore({ holdMs: 2 });
    const books = new GroupCommit(store, { lanes: 4, maxBatch: 5 });
    const orgs = Array.from({ length: 12 }, (_, i) => `org_${i}`);
    const work: Promise<unknown>[] = [];
    for (let turn = 0; turn < 20; turn++) {
      for (let i = 0; i < 6; i++) {
        const orgId = orgs[(turn * 7 + i * 5) % orgs.length]!;
        work.push(i % 2 === 0 ? books.admit(admit(`r${turn}_${i}`, orgId)) : books.complete(complete(`r${turn}_${i}`, orgId)));
      }
      await new Promise((r) => setTimeout(r, 1));
    }
    await Promise.all(work);
    assert.equal(transactions.flatMap((t) => t.ids).length, 120, "every step committed once");
    for (const t of transactions) {
      const shared = t.alongside.flat().filter((o) => t.orgs.includes(o));
      assert.deepEqual(shared, [], `a transaction of ${t.orgs.join(", ")} started while another held ${shared.join(", ")}`);
      assert.ok(new Set(t.orgs.map((o) => laneOf(o, 4))).size === 1, "a transaction holds one lane's organizations only");
    }
    assert.ok(mostAtOnce() >= 2, `transactions of several lanes ran at once (at most ${mostAtOnce()})`);
    assert.ok(mostAtOnce() <= 4, "never more transactions than lanes");
  });

  test("every step of one organization goes to one lane, whatever the number of lanes; ids spread over the lanes", () => {
    for (const lanes of [1, 2, 4, 16]) {
      const counts = Array<number>(lanes).fill(0);
      for (let i = 0; i < 1600; i++) {
        const lane = laneOf(`org_${i}`, lanes);
        assert.equal(laneOf(`org_${i}`, lanes), lane);
        counts[lane]!++;
      }
      assert.ok(
        counts.every((n) => n >= 1600 / lanes / 2),
        `lanes ${lanes}: ${counts.join(", ")}`,
      );
    }
  });

  test("a step that fails its lane's transaction is committed alone in that lane; the other lane's transaction is untouched", async () => {
    const [orgA, orgB] = orgsInLanes(2, 2) as [string, string];
    const { store, transactions } = overlapStore({
      fail: (batch) => {
        if (batch.admissions.some((a) => a.requestId === "bad")) throw new Error("CHECK constraint failed");
      },
    });
    const books = new GroupCommit(store, { lanes: 2 });
    const results = await Promise.allSettled([
      books.admit(admit("a1", orgA)),
      books.admit(admit("bad", orgA)),
      books.admit(admit("b1", orgB)),
      books.admit(admit("b2", orgB)),
    ]);
    assert.deepEqual(
      results.map((r) => r.status),
      ["fulfilled", "rejected", "fulfilled", "fulfilled"],
    );
    assert.deepEqual(
      transactions.map((t) => t.ids),
      [["a:a1", "a:bad"], ["a:b1", "a:b2"], ["a:a1"], ["a:bad"]],
    );
  });

  test("busy storage in one lane: its steps wait and retry while the other lane keeps committing", async () => {
    const [orgA, orgB] = orgsInLanes(2, 2) as [string, string];
    let busy = true;
    const { store, transactions } = overlapStore({
      fail: (batch) => {
        if (busy && batch.admissions.some((a) => a.orgId === orgA)) throw new Busy("database is locked");
      },
    });
    const books = new GroupCommit(store, { lanes: 2, waitMs: 10_000 });
    const waiting = books.admit(admit("a1", orgA));
    for (let i = 0; i < 10; i++) assert.deepEqual(await books.admit(admit(`b${i}`, orgB)), { kind: "admitted" });
    assert.ok(transactions.filter((t) => t.orgs.includes(orgA)).length >= 2, "the busy lane tried again meanwhile");
    busy = false;
    assert.deepEqual(await waiting, { kind: "admitted" });
    assert.equal(books.waiting, 0);
  });

  test("storage unavailable fails the batch of the lane that met it, at once", async () => {
    const [orgA, orgB] = orgsInLanes(2, 2) as [string, string];
    const { store, transactions } = overlapStore({
      fail: (batch) => {
        if (batch.admissions.some((a) => a.orgId === orgA)) throw new Down("connect ECONNREFUSED");
      },
    });
    const books = new GroupCommit(store, { lanes: 2 });
    const results = await Promise.allSettled([
      books.admit(admit("a1", orgA)),
      books.admit(admit("a2", orgA)),
      books.admit(admit("b1", orgB)),
    ]);
    assert.deepEqual(
      results.map((r) => r.status),
      ["rejected", "rejected", "fulfilled"],
    );
    assert.equal(transactions.length, 2, "nothing tried alone");
  });

  test("lanes: 1 to 16, whole", () => {
    const { store } = fakeStore();
    for (const lanes of [0, 17, 1.5, Number.NaN]) assert.throws(() => new GroupCommit(store, { lanes }), RangeError, String(lanes));
    assert.equal(new GroupCommit(store).lanes, 1);
    assert.equal(new GroupCommit(store, { lanes: 16 }).lanes, 16);
  });

  test("lanesFor: SQLite runs one; PostgreSQL the setting, but never more than pool_size − 2 (at least one), with a warning", () => {
    assert.deepEqual(lanesFor({ dialect: "sqlite" }, 8), { lanes: 1, reduced: null });
    assert.deepEqual(lanesFor({ dialect: "postgres", settings: { poolSize: 10 } }, 4), { lanes: 4, reduced: null });
    assert.deepEqual(lanesFor({ dialect: "postgres", settings: { poolSize: 6 } }, 4), { lanes: 4, reduced: null });
    const five = lanesFor({ dialect: "postgres", settings: { poolSize: 5 } }, 4);
    assert.equal(five.lanes, 3);
    assert.match(five.reduced ?? "", /TDS_BOOKKEEPING_LANES is 4 but the PostgreSQL pool_size 5 .* 3 run; raise pool_size to 6/);
    assert.equal(lanesFor({ dialect: "postgres", settings: { poolSize: 1 } }, 4).lanes, 1);
    assert.deepEqual(lanesFor({ dialect: "postgres" }, 4), { lanes: 4, reduced: null }, "a pool size not known: the setting");
  });
});
