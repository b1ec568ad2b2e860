import type { Clock } from "../domain/clock.ts";

/** How often an instance writes the last use of the keys it saw: last_used_at is accurate to about this. */
export const KEY_USE_INTERVAL_MS = 60_000;

export interface KeyUseRecorderOptions {
  /** Writes the uses in one step (store.recordKeyUse: each key's last_used_at moved forward, never back). */
  record: (uses: { keyId: string; atMs: number }[]) => Promise<void>;
  clock: Clock;
  /** Default KEY_USE_INTERVAL_MS. */
  intervalMs?: number;
  /** Told of a failed write; its uses are kept for the next one. */
  onError?: (err: unknown) => void;
}

/**
 * The last use of each API key this instance authenticated, kept in memory and written at most once an interval
 * (one write for all the keys seen since the last), so that a request costs no write. close() writes what is left.
 */
export class KeyUseRecorder {
  readonly #pending = new Map<string, number>();
  readonly #intervalMs: number;
  #timer: NodeJS.Timeout | null = null;
  /** The write in progress: a flush waits for it, so that uses are written in order. */
  #writing: Promise<void> = Promise.resolve();

  constructor(private readonly options: KeyUseRecorderOptions) {
    this.#intervalMs = options.intervalMs ?? KEY_USE_INTERVAL_MS;
  }

  /** Notes that the key was used now. */
  note(keyId: string): void {
    const atMs = this.options.clock.nowMs();
    if ((this.#pending.get(keyId) ?? -1) < atMs) this.#pending.set(keyId, atMs);
  }

  /** The keys noted since the last write. */
  get pending(): number {
    return this.#pending.size;
  }

  /** Writes every interval until close(); the timer keeps no process alive. */
  start(): void {
    if (this.#timer !== null) return;
    this.#timer = setInterval(() => void this.flush().catch(() => {}), this.#intervalMs);
    this.#timer.unref();
  }

  /** Writes the uses noted so far now; a failed write keeps them (unless a later use replaced them) for the next. */
  flush(): Promise<void> {
    const run = this.#writing.then(async () => {
      if (this.#pending.size === 0) return;
      const uses = [...this.#pending].map(([keyId, atMs]) => ({ keyId, atMs }));
      this.#pending.clear();
      try {
        await this.options.record(uses);
      } catch (err) {
        for (const { keyId, atMs } of uses) if ((this.#pending.get(keyId) ?? -1) < atMs) this.#pending.set(keyId, atMs);
        this.options.onError?.(err);
      }
    });
    this.#writing = run.catch(() => {});
    return run;
  }

  /** Stops the timer and writes what is left. */
  async close(): Promise<void> {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
    await this.flush();
  }
}
