import type { AdmitCommand, AdmitResult, CompleteCommand, CompleteResult } from "../domain/bookkeeping.ts";
import type { BookkeepingStore, Store } from "./store.ts";
import type { StoreFailureKind } from "./store-errors.ts";

/** How long a step waits for storage (a busy SQLite database) before it fails, by default. */
export const DEFAULT_STORAGE_WAIT_MS = 2000;
/** Most steps committed in one transaction. */
export const MAX_BATCH = 256;

/** What the group commit needs of a store: the batch and the reading of its failures. */
export type GroupCommitStore = Pick<Store, "commitBatch" | "classifyFailure">;

export interface GroupCommitOptions {
  /** How long a step waits while the batch is retried before it fails with the last error. */
  waitMs?: number;
  maxBatch?: number;
  /**
   * Transactions in flight at once (default 1): each organization's steps go to one lane (`laneOf`), and each lane
   * commits one transaction at a time, so two transactions of this instance never hold one organization's rows.
   */
  lanes?: number;
  /** Told of every committed or failed transaction: its number of steps and its duration. */
  onCommit?: (steps: number, seconds: number, ok: boolean) => void;
  /** Monotonic milliseconds (tests). */
  nowMs?: () => number;
}

/** Most lanes a group commit runs. */
export const MAX_LANES = 16;

type Step =
  | { kind: "admit"; command: AdmitCommand; resolve: (r: AdmitResult) => void; reject: (e: unknown) => void; deadline: number }
  | { kind: "complete"; command: CompleteCommand; resolve: (r: CompleteResult) => void; reject: (e: unknown) => void; deadline: number };

type LaneOptions = Required<Omit<GroupCommitOptions, "onCommit" | "lanes">> & Pick<GroupCommitOptions, "onCommit">;

/** The lane of an organization's steps among `lanes` (FNV-1a of its id): the same for every step of it. */
export function laneOf(orgId: string, lanes: number): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < orgId.length; i++) hash = Math.imul(hash ^ orgId.charCodeAt(i), 0x01000193);
  return (hash >>> 0) % lanes;
}

/** Connections of a PostgreSQL pool the lanes leave to everything else (key lookups, reads, the readiness check). */
export const CONNECTIONS_KEPT_FOR_READS = 2;

/**
 * The lanes a store runs when `wanted` are configured: SQLite has one writer, so 1; PostgreSQL `wanted`, at most its
 * pool size − CONNECTIONS_KEPT_FOR_READS (at least 1), since a lane holds a connection for each transaction. `reduced`
 * says why fewer run than configured.
 */
export function lanesFor(
  store: { readonly dialect: "sqlite" | "postgres"; readonly settings?: { readonly poolSize?: number } },
  wanted: number,
): { lanes: number; reduced: string | null } {
  if (store.dialect === "sqlite") return { lanes: 1, reduced: null };
  const poolSize = store.settings?.poolSize;
  if (poolSize === undefined || poolSize - CONNECTIONS_KEPT_FOR_READS >= wanted) return { lanes: wanted, reduced: null };
  const lanes = Math.max(1, poolSize - CONNECTIONS_KEPT_FOR_READS);
  return {
    lanes,
    reduced:
      `TDS_BOOKKEEPING_LANES is ${wanted} but the PostgreSQL pool_size ${poolSize} leaves connections for ${lanes} ` +
      `(pool_size − ${CONNECTIONS_KEPT_FOR_READS}): ${lanes} run; raise pool_size to ${wanted + CONNECTIONS_KEPT_FOR_READS} for ${wanted}`,
  };
}

/**
 * Group commit of the two durable steps of every request, in `lanes` independent lanes; a step goes to its
 * organization's lane. In a lane, steps submitted while no transaction is running are committed together at the end
 * of the event-loop turn; steps submitted while one runs wait for it and go together into the next. Each step is
 * decided on its own inside the transaction; if the transaction fails as a whole for a reason that is neither "busy"
 * nor "unavailable" as the store reads it (`classifyFailure`; a constraint, a bug), every step of it is committed
 * again alone, so one step's failure fails only that step. A busy database is waited for asynchronously, up to each
 * step's deadline: the batch is tried again, unchanged, after a pause (the lane's own). Unavailable storage
 * (connection lost, disk full) fails every step of the batch at once, none tried alone. A step's promise settles
 * only after its transaction committed (or failed).
 */
export class GroupCommit {
  readonly #store: GroupCommitStore;
  readonly #lanes: Lane[];

  constructor(store: GroupCommitStore, options: GroupCommitOptions = {}) {
    const { lanes = 1, ...rest } = options;
    if (!Number.isSafeInteger(lanes) || lanes < 1 || lanes > MAX_LANES) {
      throw new RangeError(`lanes must be a whole number from 1 to ${MAX_LANES}, got ${lanes}`);
    }
    this.#store = store;
    const laneOptions: LaneOptions = { waitMs: DEFAULT_STORAGE_WAIT_MS, maxBatch: MAX_BATCH, nowMs: () => performance.now(), ...rest };
    this.#lanes = Array.from({ length: lanes }, () => new Lane(store, laneOptions));
  }

  /** How the store reads a failure of admit or complete (the pipeline answers busy or unavailable storage with 503). */
  classifyFailure(err: unknown): StoreFailureKind {
    return this.#store.classifyFailure(err);
  }

  /** Steps waiting for a transaction, in every lane (for metrics and tests). */
  get waiting(): number {
    return this.#lanes.reduce((sum, lane) => sum + lane.waiting, 0);
  }

  get lanes(): number {
    return this.#lanes.length;
  }

  admit(command: AdmitCommand, waitMs?: number): Promise<AdmitResult> {
    const lane = this.#laneFor(command.orgId);
    return new Promise((resolve, reject) => lane.submit({ kind: "admit", command, resolve, reject, deadline: lane.deadline(waitMs) }));
  }

  complete(command: CompleteCommand, waitMs?: number): Promise<CompleteResult> {
    const lane = this.#laneFor(command.orgId);
    return new Promise((resolve, reject) => lane.submit({ kind: "complete", command, resolve, reject, deadline: lane.deadline(waitMs) }));
  }

  #laneFor(orgId: string): Lane {
    return this.#lanes[this.#lanes.length === 1 ? 0 : laneOf(orgId, this.#lanes.length)]!;
  }
}

/** One lane: its queue, its one transaction at a time, its pause after busy storage. */
class Lane {
  #queue: Step[] = [];
  #running = false;
  #timer: NodeJS.Immediate | NodeJS.Timeout | null = null;
  #pause = 0;

  constructor(
    private readonly store: GroupCommitStore,
    private readonly options: LaneOptions,
  ) {}

  get waiting(): number {
    return this.#queue.length;
  }

  deadline(waitMs = this.options.waitMs): number {
    return this.options.nowMs() + waitMs;
  }

  submit(step: Step): void {
    this.#queue.push(step);
    this.#schedule();
  }

  #schedule(): void {
    if (this.#running || this.#timer !== null || this.#queue.length === 0) return;
    const run = () => {
      this.#timer = null;
      void this.#flush();
    };
    this.#timer = this.#pause > 0 ? setTimeout(run, this.#pause) : setImmediate(run);
  }

  async #flush(): Promise<void> {
    this.#running = true;
    const batch = this.#queue.splice(0, this.options.maxBatch);
    try {
      await this.#commit(batch);
    } finally {
      this.#running = false;
      this.#schedule();
    }
  }

  async #commit(batch: Step[]): Promise<void> {
    try {
      await this.#transaction(batch);
      this.#pause = 0;
    } catch (err) {
      const kind = this.store.classifyFailure(err);
      if (kind === "retryable") return this.#retryLater(batch, err);
      this.#pause = 0;
      if (batch.length === 1 || kind === "unavailable") {
        for (const step of batch) step.reject(err);
        return;
      }
      for (const step of batch) {
        try {
          await this.#transaction([step]);
        } catch (alone) {
          if (this.store.classifyFailure(alone) === "retryable") this.#retryLater([step], alone);
          else step.reject(alone);
        }
      }
    }
  }

  /** Steps past their deadline fail with the error; the others go back to the front of the queue, after a pause. */
  #retryLater(steps: Step[], err: unknown): void {
    const now = this.options.nowMs();
    const alive = steps.filter((s) => s.deadline > now);
    for (const s of steps) if (s.deadline <= now) s.reject(err);
    this.#queue.unshift(...alive);
    this.#pause = Math.min(Math.max(this.#pause * 2, 2), 50);
  }

  async #transaction(steps: Step[]): Promise<void> {
    const admissions: AdmitCommand[] = [];
    const completions: CompleteCommand[] = [];
    for (const s of steps) {
      if (s.kind === "admit") admissions.push(s.command);
      else completions.push(s.command);
    }
    const started = this.options.nowMs();
    let results: Awaited<ReturnType<BookkeepingStore["commitBatch"]>>;
    try {
      results = await this.store.commitBatch({ admissions, completions });
    } catch (err) {
      this.options.onCommit?.(steps.length, (this.options.nowMs() - started) / 1000, false);
      throw err;
    }
    this.options.onCommit?.(steps.length, (this.options.nowMs() - started) / 1000, true);
    let a = 0;
    let c = 0;
    for (const s of steps) {
      if (s.kind === "admit") s.resolve(results.admissions[a++]!);
      else s.resolve(results.completions[c++]!);
    }
  }
}
