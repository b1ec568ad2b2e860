import type { Clock } from "../domain/clock.ts";
import { DAY_MS } from "../domain/utc-day.ts";
import type { BatchStore, ClaimedRequest, ClaimRef } from "../store/batches.ts";
import { DEFER_MS, type RunOutcome } from "./batch-request-run.ts";

/** A claim lasts this long from its last renewal; then another instance (or this one, restarted) takes it over. */
export const BATCH_LEASE_MS = 15_000;
/** The most requests one claim transaction takes. */
const CLAIM_MAX = 32;
/** With nothing to claim, the runner looks again this often. */
const IDLE_POLL_MS = 500;
/** Batches past their completion window (and cancels a process left unfinished) are ended this often. */
const EXPIRY_INTERVAL_MS = 10_000;
/** Ended batches past their retention, and uploads abandoned by their process, are deleted this often. */
const PURGE_INTERVAL_MS = 10 * 60_000;
/** An upload not written to for this long was abandoned by its process (a live upload writes every few MiB). */
export const ABANDONED_UPLOAD_MS = 60 * 60_000;
/** A failing job is reported at most this often. */
const REPORT_EVERY_MS = 60_000;
/** The most batches one purge pass deletes of each kind (each in chunked transactions). */
const PURGE_BATCHES = 20;

type WakeReason = "finish" | "nudge";

export type BatchJob = "claim" | "renewal" | "expiry" | "purge" | "release";

export interface BatchRunnerOptions {
  store: BatchStore;
  clock: Clock;
  instanceId: string;
  /** Runs one claimed request to its result (BatchRequestRun.run). */
  run: (claim: ClaimedRequest) => Promise<RunOutcome>;
  /** batch_concurrency: the most requests of one organization's batches running at once, every instance counted. */
  perOrgConcurrency: number;
  /** batch_global_concurrency: the most batch requests this instance runs at once. */
  globalConcurrency: number;
  /** Interactive decisions in progress in this instance: each takes a batch slot while it runs (at least one stays). */
  interactiveInFlight: () => number;
  /** The most batch requests that may run now beside the interactive ones (BatchShare); default globalConcurrency. */
  share?: () => number;
  retentionDays: number;
  leaseMs?: number;
  /** Tracks a running request for the server's shutdown (its drain waits for it). */
  track?: <T>(work: Promise<T>) => Promise<T>;
  /** A job failed (told at most once a minute per job, with the failures not told since). */
  onError?: (err: unknown, job: BatchJob, suppressed: number) => void;
  /** A request's run failed (storage, or an unexpected error): it is given back and run again later. */
  onRunFailed?: (err: unknown, claim: ClaimRef) => void;
}

/**
 * This instance's share of the batch work: it claims requests (oldest batch first, within the organization's and
 * its own concurrency, interactive requests first), runs them, renews their leases, ends batches past their window
 * and purges old ones. Stopping stops the claims; closing waits for the loop and gives this instance's claims back
 * at once (the requests cut short by the shutdown are claimed again, by this instance after a restart or another).
 */
export class BatchRunner {
  readonly #leaseMs: number;
  #running = 0;
  #stopped = false;
  #wake: ((reason: WakeReason) => void) | null = null;
  /** A wake-up that came while the loop was not waiting: it looks again at once. */
  #woken: WakeReason | null = null;
  /** Finished requests wake the claim loop once no more than this many run. */
  #claimAgainAt = -1;
  #started = 0;
  readonly #timers: NodeJS.Timeout[] = [];
  #loop: Promise<void> = Promise.resolve();
  /** Claims whose run failed, to give back before the next renewal (which would keep them held). */
  readonly #toGiveBack = new Map<string, ClaimRef>();
  readonly #reported = new Map<BatchJob, { atMs: number; suppressed: number }>();
  #takeOverPending = false;

  constructor(private readonly options: BatchRunnerOptions) {
    this.#leaseMs = options.leaseMs ?? BATCH_LEASE_MS;
  }

  /** Requests of batches running in this instance now. */
  get running(): number {
    return this.#running;
  }

  /** Requests this runner has started so far (a count that only grows). */
  get started(): number {
    return this.#started;
  }

  /**
   * `takeOver`: first end the leases of every other instance's claims (the one process serving a SQLite file: the
   * processes before it are gone); tried until it succeeds, before anything is claimed.
   */
  start(options: { takeOver?: boolean } = {}): void {
    this.#takeOverPending = options.takeOver ?? false;
    this.#loop = this.#claimLoop();
    const every = (ms: number, job: BatchJob, work: () => Promise<unknown>) => {
      const timer = setInterval(() => work().catch((err) => this.#report(err, job)), ms);
      timer.unref();
      this.#timers.push(timer);
    };
    every(Math.max(1000, Math.floor(this.#leaseMs / 3)), "renewal", () => this.renewNow());
    every(EXPIRY_INTERVAL_MS, "expiry", () => this.expireNow());
    every(PURGE_INTERVAL_MS, "purge", () => this.purgeNow());
  }

  /** Claims nothing more (the server is closing); requests running go on. */
  stopClaiming(): void {
    this.#stopped = true;
    this.#wakeUp("nudge");
  }

  /** After the running requests ended (the server's drain): stops the jobs and gives this instance's claims back. */
  async close(): Promise<void> {
    this.stopClaiming();
    for (const timer of this.#timers) clearInterval(timer);
    await this.#loop;
    await this.options.store.releaseClaims(this.options.instanceId).catch((err) => this.#report(err, "release"));
  }

  /** Gives back the claims whose run failed, then extends the leases of the rest. */
  async renewNow(): Promise<number> {
    for (const [key, ref] of this.#toGiveBack) {
      await this.options.store.deferClaim({ ...ref, untilMs: this.options.clock.nowMs() + DEFER_MS });
      this.#toGiveBack.delete(key);
    }
    return this.options.store.renewClaims(this.options.instanceId, this.options.clock.nowMs() + this.#leaseMs);
  }

  /** Wakes the claim loop (a batch was submitted). */
  nudge(): void {
    this.#wakeUp("nudge");
  }

  #wakeUp(reason: WakeReason): void {
    if (this.#wake) this.#wake(reason);
    else if (this.#woken !== "nudge") this.#woken = reason;
  }

  expireNow(): Promise<number> {
    return this.options.store.expireBatches(this.options.clock.nowMs());
  }

  purgeNow(): Promise<number> {
    const now = this.options.clock.nowMs();
    return this.options.store.purgeBatches({
      endedBeforeMs: now - this.options.retentionDays * DAY_MS,
      untouchedBeforeMs: now - ABANDONED_UPLOAD_MS,
      limit: PURGE_BATCHES,
    });
  }

  #report(err: unknown, job: BatchJob): void {
    const now = Date.now();
    const last = this.#reported.get(job);
    if (last && now - last.atMs < REPORT_EVERY_MS) {
      last.suppressed++;
      return;
    }
    this.options.onError?.(err, job, last?.suppressed ?? 0);
    this.#reported.set(job, { atMs: now, suppressed: 0 });
  }

  /** Slots free for batch requests: the instance's cap (or its share) less the interactive requests running, at least one. */
  #room(): number {
    const cap = Math.min(
      this.options.share?.() ?? Number.POSITIVE_INFINITY,
      this.options.globalConcurrency - this.options.interactiveInFlight(),
    );
    return Math.max(1, cap) - this.#running;
  }

  /**
   * Claims go in groups, not one per finished request: after a claim the loop waits until a quarter of what runs has
   * finished (#claimAgainAt), a submission nudges it, or the idle poll passes.
   */
  async #claimLoop(): Promise<void> {
    let due = true;
    while (!this.#stopped) {
      if (this.#takeOverPending) {
        try {
          await this.options.store.releaseClaimsOfOthers(this.options.instanceId);
          this.#takeOverPending = false;
        } catch (err) {
          this.#report(err, "release");
        }
      }
      const room = this.#room();
      let claimed = 0;
      let asked = 0;
      if (due && room > 0 && !this.#takeOverPending) {
        asked = Math.min(room, CLAIM_MAX);
        const now = this.options.clock.nowMs();
        try {
          const claims = await this.options.store.claimRequests({
            instanceId: this.options.instanceId,
            nowMs: now,
            leaseUntilMs: now + this.#leaseMs,
            limit: asked,
            perOrgLimit: this.options.perOrgConcurrency,
          });
          claimed = claims.length;
          // Claimed while the server began closing: not started (the drain would not wait for them); close() gives them back.
          if (!this.#stopped) for (const claim of claims) this.#start(claim);
        } catch (err) {
          this.#report(err, "claim");
        }
        this.#claimAgainAt = this.#running - Math.max(1, Math.floor(this.#running / 4));
      }
      if (this.#stopped) return;
      // All that was asked for was there, and there is room for more (claims are at most CLAIM_MAX).
      if (claimed > 0 && claimed === asked && this.#room() > 0) {
        due = true;
        continue;
      }
      due = (await this.#sleep()) !== "finish" || this.#running <= this.#claimAgainAt;
    }
  }

  /** Until the idle poll passes or something wakes the loop; what did. */
  async #sleep(): Promise<"timer" | WakeReason> {
    const early = this.#woken;
    if (early) {
      this.#woken = null;
      return early;
    }
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#wake = null;
        resolve("timer");
      }, IDLE_POLL_MS);
      this.#wake = (reason) => {
        clearTimeout(timer);
        this.#wake = null;
        // The finishes of one turn are claimed for together.
        setImmediate(() => resolve(reason));
      };
    });
  }

  #giveBack(err: unknown, claim: ClaimRef): void {
    this.options.onRunFailed?.(err, claim);
    this.#toGiveBack.set(`${claim.batchId}:${claim.position}`, claim);
  }

  #start(claim: ClaimedRequest): void {
    this.#running++;
    this.#started++;
    const work = this.options
      .run(claim)
      .then(
        (outcome) => {
          if (outcome.kind === "failed") this.#giveBack(outcome.error, outcome.claim);
        },
        (err) => this.#giveBack(err, { batchId: claim.batchId, position: claim.position, requestId: claim.requestId }),
      )
      .finally(() => {
        this.#running--;
        if (this.#running <= this.#claimAgainAt) this.#wakeUp("finish");
      });
    this.options.track?.(work);
  }
}
