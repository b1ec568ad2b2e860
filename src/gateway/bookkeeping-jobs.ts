import type { Clock } from "../domain/clock.ts";
import { utcDay } from "../domain/utc-day.ts";
import type { BookkeepingStore, PurgeResult, SweepResult } from "../store/store.ts";

const SWEEP_BATCH = 500;
const PURGE_BATCH = 1000;
const DAY_MS = 24 * 60 * 60 * 1000;
/** Preview counters of this many past UTC days are kept besides today's. */
export const PREVIEW_COUNTER_DAYS_KEPT = 3;

export interface BookkeepingJobsOptions {
  /** Requests in flight longer than this are completed by the sweep (the reservation TTL). */
  inFlightTtlMs: number;
  sweepIntervalMs: number;
  purgeIntervalMs: number;
  onError: (err: unknown, job: "sweep" | "purge") => void;
}

export interface BookkeepingJobs {
  /** Runs the sweep now, in batches until nothing is due. */
  sweepNow(): Promise<SweepResult>;
  /** Runs the purge now, in batches until nothing is left to delete. */
  purgeNow(): Promise<PurgeResult>;
  stop(): Promise<void>;
}

/**
 * The periodic jobs of the books. The sweep completes requests left in flight past the reservation TTL (a crash,
 * or storage that was down when they ended) as gateway_error with nothing charged, and returns the funds of
 * expired reservations. The purge deletes expired idempotency entries and preview counters of past days.
 */
export function startBookkeepingJobs(
  store: Pick<BookkeepingStore, "sweep" | "purge">,
  clock: Clock,
  options: BookkeepingJobsOptions,
): BookkeepingJobs {
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
  const sweepNow = once(async () => {
    const total: SweepResult = { abandoned: 0, expired: 0 };
    for (;;) {
      const now = clock.nowMs();
      const pass = await store.sweep({ nowMs: now, inFlightBeforeMs: now - options.inFlightTtlMs, limit: SWEEP_BATCH });
      total.abandoned += pass.abandoned;
      total.expired += pass.expired;
      if (pass.abandoned < SWEEP_BATCH && pass.expired < SWEEP_BATCH) return total;
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
  const sweepTimer = setInterval(() => sweepNow().catch((err) => options.onError(err, "sweep")), options.sweepIntervalMs);
  const purgeTimer = setInterval(() => purgeNow().catch((err) => options.onError(err, "purge")), options.purgeIntervalMs);
  sweepTimer.unref();
  purgeTimer.unref();
  return {
    sweepNow,
    purgeNow,
    async stop() {
      clearInterval(sweepTimer);
      clearInterval(purgeTimer);
      await Promise.allSettled([...inProgress]);
    },
  };
}
