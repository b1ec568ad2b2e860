import type { Clock } from "../domain/clock.ts";
import { RATE_WINDOW_MS, type RateDecision, type RateLimiter } from "./rate-limiter.ts";

/**
 * Exact sliding-log limiter for one process: each key keeps the times of its allowed requests in
 * the last window (at most `limit` of them, in a ring). A request is allowed when fewer than
 * `limit` were allowed in the 60 s before it; otherwise it may retry when the oldest leaves.
 */
export class MemoryRateLimiter implements RateLimiter {
  private readonly logs = new Map<string, { times: number[]; start: number; size: number }>();
  private sweepAt = 0;

  constructor(private readonly clock: Clock) {}

  async consume(key: string, limit: number): Promise<RateDecision> {
    const now = this.clock.nowMs();
    this.sweep(now);
    let log = this.logs.get(key);
    if (!log || log.times.length !== limit) {
      log = resize(log, limit);
      this.logs.set(key, log);
    }
    while (log.size > 0 && log.times[log.start]! <= now - RATE_WINDOW_MS) {
      log.start = (log.start + 1) % limit;
      log.size--;
    }
    if (log.size >= limit) {
      const oldest = log.times[log.start]!;
      return { allowed: false, retryAfterMs: Math.max(1, oldest + RATE_WINDOW_MS - now), remaining: 0 };
    }
    log.times[(log.start + log.size) % limit] = now;
    log.size++;
    return { allowed: true, retryAfterMs: 0, remaining: limit - log.size };
  }

  async close(): Promise<void> {
    this.logs.clear();
  }

  /** Drops keys idle for a whole window, at most once per window. */
  private sweep(now: number): void {
    if (now < this.sweepAt) return;
    this.sweepAt = now + RATE_WINDOW_MS;
    for (const [key, log] of this.logs) {
      const newest = log.size === 0 ? -Infinity : log.times[(log.start + log.size - 1) % log.times.length]!;
      if (newest <= now - RATE_WINDOW_MS) this.logs.delete(key);
    }
  }
}

/** Keeps the newest entries when the configured limit changes. */
function resize(log: { times: number[]; start: number; size: number } | undefined, limit: number) {
  const times: number[] = new Array(limit).fill(0);
  let size = 0;
  if (log) {
    const keep = Math.min(log.size, limit);
    for (let i = log.size - keep; i < log.size; i++) times[size++] = log.times[(log.start + i) % log.times.length]!;
  }
  return { times, start: 0, size };
}
