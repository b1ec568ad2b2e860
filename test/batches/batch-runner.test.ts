/**
 * BatchRunner (src/batches/batch-runner.ts): its claim loop, concurrency, renewals and stopping. Most tests use an
 * in-memory BatchStore and mocked setTimeout/setInterval, so the loop moves only when woken (a run ending, nudge(),
 * stopClaiming()) and never by its idle poll or a renewal timer; runs are held until the test ends them. The last
 * test gives claims back on the real SQLite store.
 */
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it, mock } from "node:test";
import { DEFER_MS, type RunOutcome } from "../../src/batches/batch-request-run.ts";
import { BatchRunner, type BatchRunnerOptions } from "../../src/batches/batch-runner.ts";
import { newOrganizationId } from "../../src/domain/api-keys.ts";
import type { BatchStore, ClaimedRequest, ClaimInput, ClaimRef } from "../../src/store/batches.ts";
import { openStore } from "../../src/store/open-store.ts";
import { SERVING_SQLITE } from "../../src/store/sqlite/sqlite-store.ts";
import { FixedClock } from "../support/fixed-clock.ts";

const T0 = Date.UTC(2026, 2, 1, 12, 0, 0);
/** Long enough that no renewal timer is due during a test that does not mock timers. */
const LEASE_MS = 3_600_000;

/** Waits (on immediates, which are not mocked) until `probe` holds; the deadline only bounds a hang. */
async function until(what: string, probe: () => boolean, limitMs = 60_000): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!probe()) {
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await new Promise<void>((r) => setImmediate(r));
  }
}

/** Lets the loop take every turn it has been woken for. */
async function settle(): Promise<void> {
  for (let i = 0; i < 20; i++) await new Promise<void>((r) => setImmediate(r));
}

/** The calls of the runner on the store, in order, and the requests left to claim. */
class FakeBatchStore implements BatchStore {
  readonly pending: ClaimedRequest[] = [];
  readonly claims: ClaimInput[] = [];
  readonly ops: string[] = [];
  #nextPosition = 0;

  add(count: number, batchId = "batch_1"): void {
    for (let i = 0; i < count; i++) {
      const position = this.#nextPosition++;
      this.pending.push({
        batchId,
        position,
        orgId: "org_1",
        keyId: "key_1",
        model: null,
        customId: `c${position}`,
        body: "{}",
        requestId: `req_${batchId}_${position}`,
        leaseUntilMs: 0,
        takenOver: false,
      });
    }
  }

  async claimRequests(input: ClaimInput): Promise<ClaimedRequest[]> {
    this.claims.push(input);
    return this.pending.splice(0, input.limit).map((c) => ({ ...c, leaseUntilMs: input.leaseUntilMs }));
  }
  async renewClaims(instanceId: string, leaseUntilMs: number): Promise<number> {
    this.ops.push(`renew ${instanceId} ${leaseUntilMs}`);
    return 0;
  }
  async releaseClaims(instanceId: string): Promise<number> {
    this.ops.push(`release ${instanceId}`);
    return 0;
  }
  async deferClaim(input: ClaimRef & { untilMs: number }): Promise<boolean> {
    this.ops.push(`defer ${input.batchId}:${input.position} ${input.requestId} ${input.untilMs}`);
    return true;
  }
  async expireBatches(): Promise<number> {
    return 0;
  }
  async purgeBatches(): Promise<number> {
    return 0;
  }
  beginBatch = unused;
  findIdempotentBatch = unused;
  addLines = unused;
  openBatch = unused;
  dropBatch = unused;
  getBatch = unused;
  listBatches = unused;
  releaseClaimsOfOthers = unused;
  reissueClaim = unused;
  finishRequest = unused;
  finishRequests = unused;
  cancelBatch = unused;
  results = unused;
}

function unused(): never {
  throw new Error("not used by the runner");
}

/** Runs that wait until the test ends them. */
class HeldRuns {
  readonly started: ClaimedRequest[] = [];
  readonly #ends = new Map<number, (outcome: RunOutcome) => void>();
  active = 0;
  maxActive = 0;
  ended = 0;

  readonly run = (claim: ClaimedRequest): Promise<RunOutcome> => {
    this.started.push(claim);
    this.active++;
    this.maxActive = Math.max(this.maxActive, this.active);
    return new Promise<RunOutcome>((resolve) => {
      this.#ends.set(claim.position, (outcome) => {
        this.active--;
        this.ended++;
        resolve(outcome);
      });
    });
  };

  end(claim: ClaimedRequest, outcome: RunOutcome = { kind: "finished", status: 200, costMicrousd: 0, written: true }): void {
    const end = this.#ends.get(claim.position) ?? assert.fail(`run ${claim.position} is not running`);
    this.#ends.delete(claim.position);
    end(outcome);
  }

  /** The runs started and not yet ended. */
  get running(): ClaimedRequest[] {
    return this.started.filter((c) => this.#ends.has(c.position));
  }
}

describe("BatchRunner", () => {
  let store: FakeBatchStore;
  let runs: HeldRuns;
  let clock: FixedClock;
  let runners: BatchRunner[];

  beforeEach(() => {
    mock.timers.enable({ apis: ["setTimeout", "setInterval"] });
    store = new FakeBatchStore();
    runs = new HeldRuns();
    clock = new FixedClock(T0);
    runners = [];
  });
  afterEach(async () => {
    for (const c of runs.running) runs.end(c);
    for (const r of runners) await r.close();
    mock.timers.reset();
  });

  function start(over: Partial<BatchRunnerOptions> = {}): BatchRunner {
    const runner = new BatchRunner({
      store,
      clock,
      instanceId: "i1",
      run: runs.run,
      perOrgConcurrency: 7,
      globalConcurrency: 3,
      interactiveInFlight: () => 0,
      retentionDays: 30,
      leaseMs: LEASE_MS,
      onError: (err, job) => assert.fail(`${job}: ${String(err)}`),
      ...over,
    });
    runners.push(runner);
    runner.start();
    return runner;
  }

  it("never runs more than globalConcurrency requests at once, and runs them all", async () => {
    store.add(10);
    const runner = start();
    await until("three runs", () => runs.started.length === 3);
    await settle();
    assert.equal(runs.started.length, 3, "no fourth while three run");
    assert.equal(runner.running, 3);
    for (const c of store.claims) {
      assert.ok(c.limit <= 3, `claim limit ${c.limit}`);
      assert.equal(c.perOrgLimit, 7, "perOrgConcurrency is passed to the store");
      assert.equal(c.instanceId, "i1");
      assert.equal(c.leaseUntilMs, c.nowMs + LEASE_MS);
    }
    while (runs.ended < 10) {
      const [next] = runs.running;
      assert.ok(next, "a run is running");
      runs.end(next);
      await until("the freed slot is filled or the work is done", () => runs.active === Math.min(3, 10 - runs.ended));
    }
    assert.equal(runs.started.length, 10);
    assert.equal(runs.maxActive, 3);
  });

  it("interactive requests take slots, but at least one batch request runs", async () => {
    store.add(4);
    let interactive = 5;
    let looks = 0;
    start({
      interactiveInFlight: () => {
        looks++;
        return interactive;
      },
    });
    await until("one run", () => runs.started.length === 1);
    assert.equal(store.claims[0]?.limit, 1, "one slot: globalConcurrency 3 less 5 interactive, at least 1");
    // The loop looks again (it counts the interactive requests) and claims nothing while the one slot is taken.
    const before = looks;
    runners[0]?.nudge();
    await until("the loop looked again", () => looks > before);
    await settle();
    assert.equal(runs.started.length, 1);
    assert.equal(store.claims.length, 1, "no claim without room");

    interactive = 1;
    runs.end(runs.running[0] as ClaimedRequest);
    await until("two runs: 3 less 1 interactive", () => runs.active === 2);
    await settle();
    assert.equal(runs.active, 2);
    assert.equal(store.claims[1]?.limit, 2);
    assert.equal(runs.maxActive, 2);
  });

  it("a run that failed is given back (deferred) by the next renewal, before the leases are renewed", async () => {
    store.add(2);
    const failures: ClaimRef[] = [];
    const runner = start({ onRunFailed: (_err, claim) => void failures.push(claim) });
    await until("two runs", () => runs.started.length === 2);
    const [failing, finishing] = runs.started as [ClaimedRequest, ClaimedRequest];
    const ref = { batchId: failing.batchId, position: failing.position, requestId: "req_reissued" };
    runs.end(failing, { kind: "failed", claim: ref, error: new Error("database down") });
    runs.end(finishing);
    await until("the failure reported", () => failures.length === 1);
    assert.deepEqual(failures, [ref]);
    assert.deepEqual(store.ops, [], "nothing given back before the renewal");

    clock.advance(1234);
    await runner.renewNow();
    assert.deepEqual(store.ops, [
      `defer batch_1:${failing.position} req_reissued ${T0 + 1234 + DEFER_MS}`,
      `renew i1 ${T0 + 1234 + LEASE_MS}`,
    ]);
    await runner.renewNow();
    assert.deepEqual(store.ops.slice(2), [`renew i1 ${T0 + 1234 + LEASE_MS}`], "given back once");
  });

  it("the renewal timer renews this instance's leases", async () => {
    start();
    await until("the first claim", () => store.claims.length === 1);
    mock.timers.tick(LEASE_MS / 3);
    await until("a renewal", () => store.ops.length === 1);
    assert.deepEqual(store.ops, [`renew i1 ${T0 + LEASE_MS}`]);
  });

  it("stopClaiming(): no new claims, the running requests finish", async () => {
    store.add(5);
    const runner = start({ globalConcurrency: 2 });
    await until("two runs", () => runs.started.length === 2);
    await settle();
    const claimsBefore = store.claims.length;
    runner.stopClaiming();
    for (const c of runs.running) runs.end(c);
    await until("both ended", () => runner.running === 0);
    await settle();
    assert.equal(runs.ended, 2);
    assert.equal(store.claims.length, claimsBefore, "no claim after stopClaiming");
    assert.equal(store.pending.length, 3, "the rest left to claim");
    assert.deepEqual(store.ops, []);
    await runner.close();
    assert.equal(store.claims.length, claimsBefore);
    assert.deepEqual(store.ops, ["release i1"]);
  });

  it("nudge() wakes the idle loop: it claims without waiting for the idle poll", async () => {
    const runner = start();
    await until("the first claim", () => store.claims.length === 1);
    await settle();
    assert.equal(store.claims.length, 1, "idle: the loop waits (its poll timer is mocked and never fires here)");
    store.add(1);
    runner.nudge();
    await until("a claim after the nudge", () => store.claims.length >= 2);
    await until("its run", () => runs.started.length === 1);
    // It got less than it asked for: nothing more is waiting, and the loop waits (no claim per finished request).
    await settle();
    assert.equal(store.claims.length, 2);
    // Without a nudge, only the idle poll looks again.
    store.add(1);
    await settle();
    assert.equal(runs.started.length, 1, "not claimed before the idle poll");
    mock.timers.tick(60_000);
    await until("the idle poll's run", () => runs.started.length === 2);
  });
});

describe("BatchRunner on the SQLite store", () => {
  it("close() gives this instance's claims back: another instance claims them at once", async () => {
    const store = await openStore("sqlite::memory:", { sqlite: SERVING_SQLITE });
    const runs = new HeldRuns();
    let runner: BatchRunner | null = null;
    try {
      const clock = new FixedClock(T0);
      const org = await store.createOrganization({ id: newOrganizationId(), name: "o", nowMs: T0 });
      await store.batches.beginBatch({
        id: "batch_1",
        orgId: org.id,
        keyId: "key_1",
        model: null,
        nowMs: T0,
        expiresAtMs: T0 + 86_400_000,
      });
      await store.batches.addLines(
        "batch_1",
        [0, 1, 2].map((position) => ({ position, customId: `c${position}`, body: "{}" })),
        T0,
      );
      await store.batches.openBatch({ batchId: "batch_1", total: 3, inputBytes: 6, nowMs: T0, idempotency: null });
      runner = new BatchRunner({
        store: store.batches,
        clock,
        instanceId: "i1",
        run: runs.run,
        perOrgConcurrency: 2,
        globalConcurrency: 4,
        interactiveInFlight: () => 0,
        retentionDays: 30,
        leaseMs: LEASE_MS,
      });
      runner.start();
      await until("two runs (perOrgConcurrency 2)", () => runs.started.length === 2);
      const other = () =>
        store.batches.claimRequests({
          instanceId: "i2",
          nowMs: clock.nowMs(),
          leaseUntilMs: clock.nowMs() + LEASE_MS,
          limit: 10,
          perOrgLimit: 2,
        });
      assert.deepEqual(await other(), [], "i1's claims are live: the organization is at its limit");

      runner.stopClaiming();
      await runner.close();
      const taken = await other();
      assert.deepEqual(
        taken.map((c) => [c.position, c.takenOver]),
        runs.started.map((c) => [c.position, true]),
        "released: taken over at once, with their request ids",
      );
      assert.deepEqual(
        taken.map((c) => c.requestId),
        runs.started.map((c) => c.requestId),
      );
    } finally {
      // Also when an assertion failed: the runner stopped and its held runs ended before the store closes.
      for (const c of runs.running) runs.end(c, { kind: "left", reason: "shutdown" });
      await runner?.close();
      await store.close();
    }
  });
});
