import { setMaxListeners } from "node:events";

/**
 * Decisions in progress, for a graceful shutdown: new requests are refused by Fastify while
 * closing, in-flight ones get until the deadline to finish, then their model calls are aborted
 * (the pipeline releases their reservations and records them) and they are awaited once more.
 */
export class InFlight {
  private readonly running = new Set<Promise<unknown>>();
  private readonly controller = new AbortController();
  #started = 0;

  constructor() {
    // Every concurrent model call listens on this one signal.
    setMaxListeners(0, this.controller.signal);
  }

  /** Fires when the shutdown deadline passed: abandon model calls. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get size(): number {
    return this.running.size;
  }

  /** Work tracked so far (a count that only grows). */
  get started(): number {
    return this.#started;
  }

  track<T>(work: Promise<T>): Promise<T> {
    this.#started++;
    this.running.add(work);
    const done = () => this.running.delete(work);
    work.then(done, done);
    return work;
  }

  /** Waits for in-flight work up to `deadlineMs`, then aborts what is left and waits for it to wind up. */
  async drain(deadlineMs: number): Promise<{ finished: boolean }> {
    if (this.running.size === 0) return { finished: true };
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<"timeout">((resolve) => {
      timer = setTimeout(() => resolve("timeout"), deadlineMs);
    });
    const settled = Promise.allSettled([...this.running]).then(() => "done" as const);
    const first = await Promise.race([settled, timedOut]);
    clearTimeout(timer);
    if (first === "done") return { finished: true };
    this.controller.abort(new Error("server shutting down"));
    await Promise.allSettled([...this.running]);
    return { finished: false };
  }
}
