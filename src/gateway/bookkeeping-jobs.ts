import { randomBytes } from "node:crypto";
import type { PurgeResult, SweepResult } from "../domain/bookkeeping.ts";
import type { Clock } from "../domain/clock.ts";
import { DAY_MS, utcDay } from "../domain/utc-day.ts";
import type { BookkeepingStore } from "../store/store.ts";

const SWEEP_BATCH = 500;
const PURGE_BATCH = 1000;
/** Preview counters of this many past UTC days are kept besides today's. */
export const PREVIEW_COUNTER_DAYS_KEPT = 3;
/** The sweep runs this often, whatever the reservation TTL: a process restarted over and over still sweeps. */
export const SWEEP_INTERVAL_MS = 5000;
/** A process's lease lasts this long from its last renewal; then its work in flight is released by the others. */
export const LEASE_MS = 15_000;
/** A process renews its lease this often (three renewals per lease: two may fail or be late). */
export const LEASE_RENEWAL_MS = 5000;
/** A failing job is reported at most this often. */
const REPORT_EVERY_MS = 60_000;

export type BookkeepingJob = "sweep" | "purge" | "lease";

/** A new id for a gateway instance (one serving process). */
export function newInstanceId(): string {
  return `gw_${randomBytes(8).toString("hex")}`;
}

export interface BookkeepingJobsOptions {
  /** Requests in flight longer than this are completed by the sweep (the reservation TTL). */
  inFlightTtlMs: number;
  sweepIntervalMs: number;
  purgeIntervalMs: number;
  /**
   * This process: the id its admissions record and its lease is kept under, when it started, and whether it alone
   * serves the database (SQLite): then every request in flight from before its start belongs to a process that is gone.
   */
  instance: { id: string; startedAtMs: number; alone: boolean };
  leaseMs?: number;
  leaseRenewalMs?: number;
  /** A job failed; at most once a minute per job (the others are counted in `suppressed`). */
  onError: (err: unknown, job: BookkeepingJob, suppressed: number) => void;
  /** Requests in flight of stopped processes were completed and their reservations released. */
  onReleased?: (released: number) => void;
}

export interface BookkeepingJobs {
  /** This process's lease recorded and a first sweep run (null when either failed; reported to onError). */
  readonly started: Promise<SweepResult | null>;
  /** Releases the work of stopped processes, then runs the TTL sweep, in batches until nothing is due. */
  sweepNow(): Promise<SweepResult>;
  /** Releases the work of stopped processes now (a run already under way is shared); how many requests it completed. */
  releaseOrphansNow(): Promise<number>;
  /** Runs the purge now, in batches until nothing is left to delete. */
  purgeNow(): Promise<PurgeResult>;
  /** Stops the timers, waits for running jobs and ends this process's lease. */
  stop(): Promise<void>;
}

/**
 * The periodic jobs of the books. The lease: this process renews its lease every few seconds, so that the others know
 * it is alive. The sweep, every few seconds: the requests in flight of processes that are gone (their lease ended,
 * or on SQLite they ran before this process started) are completed at once as gateway_error with nothing charged and
 * their reservations released; requests left in flight past the reservation TTL (storage that was down when they
 * ended) likewise, with their reservations expired. The purge deletes expired idempotency entries and preview
 * counters of past days. At start, the lease is recorded and the sweep runs once (`started`).
 */
export function startBookkeepingJobs(
  store: Pick<BookkeepingStore, "sweep" | "purge" | "releaseOrphans" | "renewLease">,
  clock: Clock,
  options: BookkeepingJobsOptions,
): BookkeepingJobs {
  const { instance } = options;
  const leaseMs = options.leaseMs ?? LEASE_MS;
  const inProgress = new Set<Promise<unknown>>();
  /** One run of a job at a time: a call while it runs gets the running one. */
  const once = <T>(job: () => Promise<T>) => {
    let running: Promise<T> | null = null;
    return () => {
      if (!running) {
        const run = job().finally(() => {
          running = null;
          inProgress.delete(run);
        });
        inProgress.add(run);
        running = run;
      }
      return running;
    };
  };
  const lastReport = new Map<BookkeepingJob, { atMs: number; suppressed: number }>();
  const report = (job: BookkeepingJob) => (err: unknown) => {
    const now = Date.now();
    const last = lastReport.get(job);
    if (last && now - last.atMs < REPORT_EVERY_MS) {
      last.suppressed += 1;
      return;
    }
    lastReport.set(job, { atMs: now, suppressed: 0 });
    options.onError(err, job, last?.suppressed ?? 0);
  };

  const renewLease = (leaseUntilMs: number) =>
    store.renewLease({ instanceId: instance.id, startedAtMs: instance.startedAtMs, leaseUntilMs, nowMs: clock.nowMs() });
  const releaseOrphansNow = once(async () => {
    let total = 0;
    for (;;) {
      const pass = await store.releaseOrphans({
        instanceId: instance.id,
        nowMs: clock.nowMs(),
        createdBeforeMs: instance.alone ? instance.startedAtMs : null,
        limit: SWEEP_BATCH,
      });
      total += pass.released;
      if (pass.released < SWEEP_BATCH) break;
    }
    if (total > 0) options.onReleased?.(total);
    return total;
  });
  const sweepNow = once(async () => {
    const total: SweepResult = { abandoned: await releaseOrphansNow() };
    for (;;) {
      const now = clock.nowMs();
      const pass = await store.sweep({ nowMs: now, inFlightBeforeMs: now - options.inFlightTtlMs, limit: SWEEP_BATCH });
      total.abandoned += pass.abandoned;
      if (pass.abandoned < SWEEP_BATCH) return total;
    }
  });
  const purgeNow = once(async () => {
    const total: PurgeResult = { idempotencyKeys: 0, previewCounters: 0 };
    for (;;) {
      const now = clock.nowMs();
      const pass = await store.purge({ nowMs: now, keepFromDay: utcDay(now - PREVIEW_COUNTER_DAYS_KEPT * DAY_MS), limit: PURGE_BATCH });
      total.idempotencyKeys += pass.idempotencyKeys;
      total.previewCounters += pass.previewCounters;
      if (pass.idempotencyKeys < PURGE_BATCH && pass.previewCounters < PURGE_BATCH) return total;
    }
  });
  const renewNow = once(() => renewLease(clock.nowMs() + leaseMs));

  const started = (async () => {
    try {
      await renewNow();
    } catch (err) {
      report("lease")(err);
    }
    return sweepNow().catch((err: unknown) => {
      report("sweep")(err);
      return null;
    });
  })();
  inProgress.add(started);
  const leaseTimer = setInterval(() => renewNow().catch(report("lease")), options.leaseRenewalMs ?? LEASE_RENEWAL_MS);
  const sweepTimer = setInterval(() => sweepNow().catch(report("sweep")), options.sweepIntervalMs);
  const purgeTimer = setInterval(() => purgeNow().catch(report("purge")), options.purgeIntervalMs);
  for (const timer of [leaseTimer, sweepTimer, purgeTimer]) timer.unref();
  return {
    started,
    sweepNow,
    releaseOrphansNow,
    purgeNow,
    async stop() {
      for (const timer of [leaseTimer, sweepTimer, purgeTimer]) clearInterval(timer);
      await Promise.allSettled([...inProgress]);
      // Whatever this process leaves in flight is released at once by the others (or the next to start).
      await renewLease(clock.nowMs()).catch(() => undefined);
    },
  };
}
