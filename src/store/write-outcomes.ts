import type { WriteCheck } from "./store.ts";

/** How long a failed write is remembered when no write succeeds after it. */
export const WRITE_FAILURE_MEMORY_MS = 10_000;

/**
 * What the latest writes met, for the write check: the last failure that says the database does not take writes
 * (read-only, disk full, I/O), until a write succeeds or WRITE_FAILURE_MEMORY_MS passes. It is forgotten after that
 * time so that a gateway taken out of rotation, which gets no writes to succeed, is tried again rather than kept out.
 */
export class WriteOutcomes {
  #last: { check: WriteCheck; atMs: number } | null = null;

  constructor(
    private readonly nowMs: () => number = Date.now,
    private readonly memoryMs: number = WRITE_FAILURE_MEMORY_MS,
  ) {}

  failed(check: WriteCheck): void {
    if (check.state !== "ok") this.#last = { check, atMs: this.nowMs() };
  }

  succeeded(): void {
    this.#last = null;
  }

  /** The remembered failure, or null. */
  latest(): WriteCheck | null {
    if (this.#last !== null && this.nowMs() - this.#last.atMs > this.memoryMs) this.#last = null;
    return this.#last?.check ?? null;
  }
}

/** A write check is run at most this often, unless the store has seen a failure since the last one. */
export const WRITE_CHECK_INTERVAL_MS = 1000;

/**
 * The last write check, reused for WRITE_CHECK_INTERVAL_MS (and while it runs) so that no number of readiness probes
 * loads the database; `invalidate` (a call failed, a connection was lost) makes the next check run anew, so that a
 * change is seen at once.
 */
export class SharedCheck {
  #last: { result: Promise<WriteCheck>; settledAtMs: number | null; epoch: number } | null = null;
  #epoch = 0;

  constructor(
    private readonly run: () => Promise<WriteCheck>,
    private readonly nowMs: () => number = Date.now,
    private readonly intervalMs: number = WRITE_CHECK_INTERVAL_MS,
  ) {}

  invalidate(): void {
    this.#epoch++;
  }

  check(): Promise<WriteCheck> {
    const last = this.#last;
    const reusable =
      last !== null && (last.settledAtMs === null || (last.epoch === this.#epoch && this.nowMs() - last.settledAtMs < this.intervalMs));
    if (reusable) return last.result;
    const entry: { result: Promise<WriteCheck>; settledAtMs: number | null; epoch: number } = {
      result: this.run(),
      settledAtMs: null,
      epoch: this.#epoch,
    };
    entry.result.then(
      () => {
        entry.settledAtMs = this.nowMs();
      },
      () => {
        // A check that throws is not kept: the next call runs one anew.
        if (this.#last === entry) this.#last = null;
      },
    );
    this.#last = entry;
    return entry.result;
  }
}
