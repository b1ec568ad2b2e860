import { performance } from "node:perf_hooks";
import { type RateDecision, type RateLimiter, requireValidLimit } from "./rate-limiter.ts";

/** Which limiter answers: the primary, or the fallback during an outage of the primary. */
export type FallbackMode = "primary" | "fallback";

export interface RateLimiterLogger {
  warn(obj: object, msg: string): void;
  info(obj: object, msg: string): void;
}

/** The two log lines of an outage, with the fields that describe the primary. */
export interface FallbackLogLines {
  /** Warned once when an outage begins, with `{ err, ...outageFields }`. */
  outage: string;
  outageFields?: object;
  /** Logged (info) once when the primary answers again, with `{ ...recoveredFields, outageMs }`. */
  recovered: string;
  recoveredFields?: object;
}

export interface FallbackOptions {
  /**
   * Whether a rejection of the primary's consume() is an outage, answered by the fallback. Any
   * other rejection (a misuse, e.g. a RangeError) is passed on to the caller and switches nothing.
   */
  isOutage(err: unknown): boolean;
  /**
   * During an outage, whether a check may try the primary now (e.g. its connection is up); when
   * false the fallback answers at once. Default: always.
   */
  primaryReady?: () => boolean;
  /** A check that the primary answers that counts nothing (e.g. PING), run by probe(). */
  ping?: () => Promise<void>;
  /** One warn when an outage begins, one info when the primary answers again; nothing in between. */
  logger?: RateLimiterLogger;
  logLines?: FallbackLogLines;
  /** Called on every switch between the primary and the fallback (errors thrown by it are ignored). */
  onModeChange?: (mode: FallbackMode) => void;
  /** Names the limiter in the error of a call after close() (default "Rate limiter"). */
  name?: string;
  /** Monotonic milliseconds, for the outage's length in the recovery line (default performance.now). */
  now?: () => number;
}

export interface FallbackRateLimiter extends RateLimiter {
  /** "primary" while the primary answers; "fallback" from an outage until the primary answers again. */
  mode(): FallbackMode;
  /**
   * During an outage: asks the primary once (options.ping, unless a check is already trying it) and
   * switches back if it answers. Otherwise, or without options.ping, does nothing. Never rejects.
   * Call it when the primary may be back (e.g. it reconnected) rather than waiting for the next check.
   */
  probe(): Promise<void>;
  /** Closes the primary, then the fallback: this limiter owns both. consume() afterwards rejects. */
  close(): Promise<void>;
}

const DEFAULT_LOG_LINES: FallbackLogLines = {
  outage: "Primary rate limiter unreachable: falling back to the local limiter until it answers again",
  recovered: "Primary rate limiter reachable again",
};

/**
 * A RateLimiter that asks `primary` and, from the first check the primary fails with an outage,
 * answers from `fallback` until the primary answers again — limited throughout, never unlimited
 * (a rejection of the fallback is passed on). During an outage one check at a time (while
 * `primaryReady()`) still tries the primary, and `probe()` may too; the first the primary answers
 * switches back, with that check answered by the primary. Requests the fallback answered are not
 * known to the primary afterwards.
 *
 * The wrapper adds no timeout: a check waits as long as the primary takes to answer or fail, so the
 * primary must bound its own calls (the Redis limiter does: its command timeout).
 *
 * A switch is made only by a check (or probe) that started after the previous switch, so a slow
 * answer from before an outage or recovery cannot undo it.
 */
export function withFallback(primary: RateLimiter, fallback: RateLimiter, options: FallbackOptions): FallbackRateLimiter {
  const now = options.now ?? (() => performance.now());
  const primaryReady = options.primaryReady ?? (() => true);
  const lines = options.logLines ?? DEFAULT_LOG_LINES;
  const name = options.name ?? "Rate limiter";
  let currentMode: FallbackMode = "primary";
  /** Bumped on every mode switch: only a check started in the current epoch may switch again. */
  let epoch = 0;
  let outageStartedAt = 0;
  /** A check or probe is trying the primary during an outage. */
  let probing = false;
  let closed = false;

  function setMode(mode: FallbackMode, startedEpoch: number, err?: unknown): void {
    if (closed || mode === currentMode || startedEpoch !== epoch) return;
    currentMode = mode;
    epoch++;
    // A failing logger or listener must not turn a rate check into an error.
    try {
      if (mode === "fallback") {
        outageStartedAt = now();
        options.logger?.warn({ err, ...lines.outageFields }, lines.outage);
      } else {
        options.logger?.info({ ...lines.recoveredFields, outageMs: Math.round(now() - outageStartedAt) }, lines.recovered);
      }
    } catch {
      // ignored
    }
    try {
      options.onModeChange?.(mode);
    } catch {
      // ignored
    }
  }

  return {
    mode: () => currentMode,

    async consume(key: string, limit: number): Promise<RateDecision> {
      if (closed) throw new Error(`${name} is closed`);
      requireValidLimit(limit);
      const startedEpoch = epoch;
      if (currentMode === "primary") {
        try {
          return await primary.consume(key, limit);
        } catch (err) {
          if (!options.isOutage(err)) throw err;
          setMode("fallback", startedEpoch, err);
          return fallback.consume(key, limit);
        }
      }
      // Outage: while the primary is ready, one check at a time tries it; the others, and all checks
      // while it is not ready, are answered by the fallback at once.
      if (primaryReady() && !probing) {
        probing = true;
        try {
          const decision = await primary.consume(key, limit);
          setMode("primary", startedEpoch);
          return decision;
        } catch (err) {
          if (!options.isOutage(err)) throw err;
        } finally {
          probing = false;
        }
      }
      return fallback.consume(key, limit);
    },

    async probe(): Promise<void> {
      if (currentMode !== "fallback" || closed || probing || !options.ping) return;
      probing = true;
      const startedEpoch = epoch;
      try {
        await options.ping();
        setMode("primary", startedEpoch);
      } catch {
        // still out: the next check or probe tries again
      } finally {
        probing = false;
      }
    },

    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      try {
        await primary.close();
      } finally {
        await fallback.close();
      }
    },
  };
}
