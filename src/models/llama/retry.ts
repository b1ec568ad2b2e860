/** The waits between attempts to load a model: `initialMs`, doubling after each failure, at most `maxMs`. */
export interface RetryBackoff {
  initialMs: number;
  maxMs: number;
}

export const DEFAULT_RETRY_BACKOFF: RetryBackoff = { initialMs: 1000, maxMs: 60_000 };

/** The wait after the `failedAttempts`-th failure in a row (1 → initialMs). */
export function retryDelayMs(failedAttempts: number, backoff: RetryBackoff): number {
  return Math.min(backoff.maxMs, backoff.initialMs * 2 ** Math.min(failedAttempts - 1, 30));
}

/** Resolves after `ms`, or at once when `signal` fires. */
export function pause(ms: number, signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}
