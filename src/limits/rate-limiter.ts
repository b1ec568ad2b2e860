export interface RateDecision {
  allowed: boolean;
  /** When refused: milliseconds until one more request would be allowed. 0 when allowed. */
  retryAfterMs: number;
  /** Requests still allowed in the current window after this one (0 when refused). */
  remaining: number;
}

/**
 * Per-key request rate over a sliding 60-second window. check-and-count is one atomic step: an
 * allowed request is counted, a refused one is not. In any window of 60 s at most `limit`
 * requests of a key are allowed, whatever their timing.
 */
export interface RateLimiter {
  consume(key: string, limit: number): Promise<RateDecision>;
  close(): Promise<void>;
}

export const RATE_WINDOW_MS = 60_000;

/** `limit` must be a positive integer: anything else is a programming error (RangeError), never an outage. */
export function requireValidLimit(limit: number): void {
  if (!Number.isSafeInteger(limit) || limit < 1) throw new RangeError(`limit must be a positive integer, got ${limit}`);
}
