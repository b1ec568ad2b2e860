/**
 * The periodic jobs of the books (src/gateway/bookkeeping-jobs.ts) on a recording store and mocked timers: at start the
 * lease is recorded and the work of stopped processes released before the TTL sweep; the sweep runs every
 * sweepIntervalMs whatever the reservation TTL, and the lease is renewed every LEASE_RENEWAL_MS for LEASE_MS; stop()
 * ends the lease; a failing job is reported once a minute, with the failures it did not report counted.
 */
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, mock, test } from "node:test";
import {
  type BookkeepingJob,
  type BookkeepingJobsOptions,
  LEASE_MS,
  LEASE_RENEWAL_MS,
  SWEEP_INTERVAL_MS,
  startBookkeepingJobs,
} from "../../src/gateway/bookkeeping-jobs.ts";
import type { BookkeepingStore } from "../../src/store/store.ts";
import { FixedClock } from "../support/fixed-clock.ts";

const T0 = Date.parse("2026-03-01T12:00:00Z");
const DAY_TTL_MS = 86_400_000;

type Jobs = Pick<BookkeepingStore, "sweep" | "purge" | "releaseOrphans" | "renewLease">;

/** A store that records what the jobs ask, in order; `orphans` are released by the next call. */
function recordingStore() {
  const calls: string[] = [];
  const leases: number[] = [];
  const orphanQueries: (number | null)[] = [];
  let orphans = 0;
  let failing: Error | null = null;
  const store: Jobs = {
    async renewLease(input) {
      calls.push("lease");
      if (failing) throw failing;
      leases.push(input.leaseUntilMs - input.nowMs);
    },
    async releaseOrphans(input) {
      calls.push("orphans");
      if (failing) throw failing;
      orphanQueries.push(input.createdBeforeMs);
      const released = Math.min(orphans, input.limit);
      orphans -= released;
      return { released };
    },
    async sweep() {
      calls.push("sweep");
      if (failing) throw failing;
      return { abandoned: 1 };
    },
    async purge() {
      calls.push("purge");
      return { idempotencyKeys: 0, previewCounters: 0 };
    },
  };
  return {
    store,
    calls,
    leases,
    orphanQueries,
    leave: (n: number) => {
      orphans = n;
    },
    fail: (err: Error | null) => {
      failing = err;
    },
  };
}

/** Lets the promise chains the timers started settle. */
const settle = async () => {
  for (let i = 0; i < 20; i++) await Promise.resolve();
};

describe("bookkeeping jobs", () => {
  beforeEach(() => mock.timers.enable({ apis: ["setInterval", "Date"], now: T0 }));
  afterEach(() => mock.timers.reset());

  const options = (over: Partial<BookkeepingJobsOptions> = {}): BookkeepingJobsOptions => ({
    inFlightTtlMs: DAY_TTL_MS,
    sweepIntervalMs: SWEEP_INTERVAL_MS,
    purgeIntervalMs: 10 * 60_000,
    instance: { id: "gw_test", startedAtMs: T0, alone: true },
    onError: () => {},
    ...over,
  });

  test("at start: the lease, then the work of stopped processes (SQLite: all from before this start), then the TTL sweep", async () => {
    const r = recordingStore();
    r.leave(3);
    const released: number[] = [];
    const jobs = startBookkeepingJobs(r.store, new FixedClock(T0), options({ onReleased: (n) => released.push(n) }));
    assert.deepEqual(await jobs.started, { abandoned: 4 }, "the released requests count as abandoned");
    assert.deepEqual(r.calls, ["lease", "orphans", "sweep"]);
    assert.deepEqual(r.leases, [LEASE_MS]);
    assert.deepEqual(r.orphanQueries, [T0]);
    assert.deepEqual(released, [3]);
    await jobs.stop();
  });

  test("several instances share the database (PostgreSQL): only ended leases count, not the start", async () => {
    const r = recordingStore();
    const jobs = startBookkeepingJobs(r.store, new FixedClock(T0), options({ instance: { id: "gw_test", startedAtMs: T0, alone: false } }));
    await jobs.started;
    assert.deepEqual(r.orphanQueries, [null]);
    await jobs.stop();
  });

  test("the sweep runs every SWEEP_INTERVAL_MS even with a TTL of a day; the lease is renewed every LEASE_RENEWAL_MS; stop() ends it", async () => {
    const r = recordingStore();
    const clock = new FixedClock(T0);
    const jobs = startBookkeepingJobs(r.store, clock, options());
    await jobs.started;
    r.calls.length = 0;
    for (let i = 0; i < 6; i++) {
      mock.timers.tick(SWEEP_INTERVAL_MS);
      await settle();
    }
    const count = (what: string) => r.calls.filter((c) => c === what).length;
    assert.equal(count("sweep"), 6);
    assert.equal(count("orphans"), 6, "each sweep releases the work of stopped processes first");
    assert.equal(count("lease"), (6 * SWEEP_INTERVAL_MS) / LEASE_RENEWAL_MS);
    assert.ok(r.leases.every((ms) => ms === LEASE_MS));
    r.leases.length = 0;
    clock.advance(1234);
    await jobs.stop();
    assert.deepEqual(r.leases, [0], "a clean stop ends the lease at once");
  });

  test("a failing job is reported at most once a minute, with the failures not reported counted", async () => {
    const r = recordingStore();
    const reports: [BookkeepingJob, number, string][] = [];
    const jobs = startBookkeepingJobs(
      r.store,
      new FixedClock(T0),
      options({ onError: (err, job, suppressed) => reports.push([job, suppressed, (err as Error).message]) }),
    );
    await jobs.started;
    r.fail(new Error("database down"));
    for (let i = 0; i < 4; i++) {
      mock.timers.tick(SWEEP_INTERVAL_MS);
      await settle();
    }
    assert.deepEqual(reports, [
      ["lease", 0, "database down"],
      ["sweep", 0, "database down"],
    ]);
    for (let i = 0; i < 60_000 / SWEEP_INTERVAL_MS; i++) {
      mock.timers.tick(SWEEP_INTERVAL_MS);
      await settle();
    }
    const perMinute = 60_000 / SWEEP_INTERVAL_MS;
    assert.deepEqual(
      reports.slice(2),
      [
        ["lease", perMinute - 1, "database down"],
        ["sweep", perMinute - 1, "database down"],
      ],
      "a minute after the first report: the next one, with the failures in between",
    );
    r.fail(null);
    await jobs.stop();
  });
});
