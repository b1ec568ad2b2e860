import { ModelServiceError } from "../model-service.ts";

/** setTimeout's largest delay. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * A call's deadline and abort signal in one place: `stopped` is set (and `onStop` listeners run) once
 * the deadline passes ("timeout") or the signal fires ("aborted").
 */
export class Deadline {
  private error: ModelServiceError | null = null;
  private readonly listeners = new Set<(error: ModelServiceError) => void>();
  private readonly timer: NodeJS.Timeout | undefined;
  private readonly onAbort: () => void;
  /** Rejects with the stop error; never resolves. Handled, so it never becomes an unhandled rejection. */
  readonly stoppedPromise: Promise<never>;

  constructor(
    readonly timeoutMs: number,
    private readonly signal?: AbortSignal,
  ) {
    let reject!: (e: ModelServiceError) => void;
    this.stoppedPromise = new Promise<never>((_, r) => {
      reject = r;
    });
    this.stoppedPromise.catch(() => {});
    this.listeners.add((e) => reject(e));
    this.onAbort = () => this.stop(new ModelServiceError("aborted", "the call was aborted"));
    if (signal?.aborted) {
      this.onAbort();
    } else {
      signal?.addEventListener("abort", this.onAbort, { once: true });
      const ms = Number.isFinite(timeoutMs) ? Math.max(0, Math.min(timeoutMs, MAX_TIMER_MS)) : MAX_TIMER_MS;
      this.timer = setTimeout(() => {
        this.stop(new ModelServiceError("timeout", `the embedded model did not answer within ${timeoutMs} ms`));
      }, ms);
    }
  }

  get stopped(): ModelServiceError | null {
    return this.error;
  }

  throwIfStopped(): void {
    if (this.error) throw this.error;
  }

  onStop(listener: (error: ModelServiceError) => void): () => void {
    if (this.error) {
      listener(this.error);
      return () => {};
    }
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Resolves with `work`, or rejects with the stop error as soon as the deadline passes or the signal fires. */
  race<T>(work: Promise<T>): Promise<T> {
    return Promise.race([work, this.stoppedPromise]);
  }

  dispose(): void {
    if (this.timer) clearTimeout(this.timer);
    this.signal?.removeEventListener("abort", this.onAbort);
    this.listeners.clear();
  }

  private stop(error: ModelServiceError): void {
    if (this.error) return;
    this.error = error;
    if (this.timer) clearTimeout(this.timer);
    for (const l of [...this.listeners]) l(error);
    this.listeners.clear();
  }
}

interface Waiter<T> {
  resolve(lease: Lease<T>): void;
  reject(error: ModelServiceError): void;
  unlisten(): void;
}

export interface Lease<T> {
  readonly slot: T;
  /** Gives the slot back (to the first waiter, or the free list). Idempotent. */
  release(): void;
}

/**
 * A fixed set of slots (contexts) and a bounded FIFO queue of callers waiting for one. A caller
 * gets a free slot at once; otherwise it waits in the queue within its deadline. A full queue is
 * "overloaded" at once; a deadline or abort while waiting removes the caller from the queue.
 */
export class SlotPool<T> {
  private readonly free: T[];
  private readonly queue: Waiter<T>[] = [];
  private closedError: ModelServiceError | null = null;

  constructor(
    slots: readonly T[],
    readonly queueLimit: number,
  ) {
    if (slots.length < 1) throw new RangeError("a pool needs at least one slot");
    if (!Number.isInteger(queueLimit) || queueLimit < 0) throw new RangeError("queueLimit must be an integer >= 0");
    this.free = [...slots];
    this.size = slots.length;
  }

  readonly size: number;

  /** Callers waiting for a slot. */
  get waiting(): number {
    return this.queue.length;
  }

  /** Slots in use. */
  get busy(): number {
    return this.size - this.free.length;
  }

  acquire(deadline: Deadline): Promise<Lease<T>> {
    if (this.closedError) return Promise.reject(this.closedError);
    const stopped = deadline.stopped;
    if (stopped) return Promise.reject(stopped);
    const slot = this.free.shift();
    if (slot !== undefined) return Promise.resolve(this.lease(slot));
    if (this.queue.length >= this.queueLimit) {
      return Promise.reject(
        new ModelServiceError(
          "overloaded",
          `the embedded model is busy: ${this.size} request(s) running and ${this.queue.length} waiting (queue limit ${this.queueLimit})`,
        ),
      );
    }
    return new Promise<Lease<T>>((resolve, reject) => {
      const waiter: Waiter<T> = {
        resolve,
        reject,
        unlisten: () => {},
      };
      waiter.unlisten = deadline.onStop((error) => {
        const at = this.queue.indexOf(waiter);
        if (at >= 0) this.queue.splice(at, 1);
        reject(error);
      });
      this.queue.push(waiter);
    });
  }

  /** Rejects every waiter and every later acquire with `error`. Slots in use stay leased until released. */
  close(error: ModelServiceError): void {
    this.closedError = error;
    for (const w of this.queue.splice(0)) {
      w.unlisten();
      w.reject(error);
    }
  }

  private lease(slot: T): Lease<T> {
    let released = false;
    return {
      slot,
      release: () => {
        if (released) return;
        released = true;
        const next = this.queue.shift();
        if (next) {
          next.unlisten();
          next.resolve(this.lease(slot));
        } else {
          this.free.push(slot);
        }
      },
    };
  }
}
