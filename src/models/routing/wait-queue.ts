import type { RouterTimers } from "./types.ts";

/** Why a call got no deployment. */
export type AcquireReason = "down" | "busy" | "aborted" | "closed" | "exhausted";

/** Thrown by the router's slot acquisition (internal; `decide` turns it into a ModelServiceError). */
export class AcquireFailure extends Error {
  constructor(readonly reason: AcquireReason) {
    super(reason);
  }
}

/** What a waiter's `tryGrant` answers: a lease, a failure that ends its wait, or null to keep waiting. */
export type Grant<L> = { lease: L } | { fail: AcquireReason } | null;

interface Waiter<L> {
  tryGrant: () => Grant<L>;
  resolve: (lease: L) => void;
  reject: (err: AcquireFailure) => void;
  cleanup: () => void;
}

/** setTimeout's largest delay. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Calls waiting for a deployment below its maxConcurrency, served first in, first out. A waiter leaves with a lease
 * (`drain`, when a slot may have become free), at its deadline ("busy"), when its signal fires ("aborted"), or when
 * its `tryGrant` says it cannot succeed any more (e.g. "down": no usable deployment left).
 */
export class WaitQueue<L> {
  private readonly waiters: Waiter<L>[] = [];
  private draining = false;
  private again = false;

  constructor(
    private readonly timers: RouterTimers,
    private readonly nowMs: () => number,
  ) {}

  get length(): number {
    return this.waiters.length;
  }

  wait(tryGrant: () => Grant<L>, deadlineMs: number, signal?: AbortSignal): Promise<L> {
    return new Promise<L>((resolve, reject) => {
      if (signal?.aborted) return reject(new AcquireFailure("aborted"));
      const remaining = deadlineMs - this.nowMs();
      if (!(remaining > 0)) return reject(new AcquireFailure("busy"));
      const leave = (reason: AcquireReason) => {
        const i = this.waiters.indexOf(waiter);
        if (i < 0) return;
        this.waiters.splice(i, 1);
        waiter.cleanup();
        reject(new AcquireFailure(reason));
        // The head may have left: the next one may be servable now.
        if (i === 0) this.drain();
      };
      const timer = this.timers.setTimeout(() => leave("busy"), Math.min(Math.ceil(remaining), MAX_TIMER_MS));
      const onAbort = () => leave("aborted");
      signal?.addEventListener("abort", onAbort, { once: true });
      const waiter: Waiter<L> = {
        tryGrant,
        resolve,
        reject,
        cleanup: () => {
          this.timers.clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
        },
      };
      this.waiters.push(waiter);
    });
  }

  /** Serves waiters in order while the first one can be served (or failed). Safe to call from anywhere, re-entrantly. */
  drain(): void {
    if (this.draining) {
      this.again = true;
      return;
    }
    this.draining = true;
    try {
      do {
        this.again = false;
        while (this.waiters.length > 0) {
          const head = this.waiters[0] as Waiter<L>;
          const grant = head.tryGrant();
          if (grant === null) break;
          this.waiters.shift();
          head.cleanup();
          if ("lease" in grant) head.resolve(grant.lease);
          else head.reject(new AcquireFailure(grant.fail));
        }
      } while (this.again);
    } finally {
      this.draining = false;
    }
  }

  /** Ends every wait with `reason`. */
  rejectAll(reason: AcquireReason): void {
    for (const w of this.waiters.splice(0)) {
      w.cleanup();
      w.reject(new AcquireFailure(reason));
    }
  }
}
