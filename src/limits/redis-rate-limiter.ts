import { type FallbackMode, type RateLimiterLogger, withFallback } from "./fallback-rate-limiter.ts";
import type { RateLimiter } from "./rate-limiter.ts";
import {
  DEFAULT_COMMAND_TIMEOUT_MS,
  describeRedisUrl,
  isRedisOutage,
  openRedisSlidingLogLimiter,
  type RedisSlidingLogOptions,
} from "./redis-sliding-log-limiter.ts";

export type { RateLimiterLogger } from "./fallback-rate-limiter.ts";

export type RateLimiterMode = "redis" | "fallback";

export interface RedisRateLimiterOptions extends RedisSlidingLogOptions {
  /**
   * The local limiter answering while Redis is unreachable (the gateway: a MemoryRateLimiter). It
   * limits each gateway instance separately (N instances may together allow up to N × limit), but
   * never lets requests through unlimited. The Redis limiter owns it: close() closes it. It keeps
   * its own window (MemoryRateLimiter: 60 s) whatever `windowMs` is.
   */
  fallback: RateLimiter;
  /** One warn when falling back, one info when Redis answers again; nothing in between. */
  logger?: RateLimiterLogger;
  /** Called on every switch between Redis and the fallback (errors thrown by it are ignored). */
  onModeChange?: (mode: RateLimiterMode) => void;
  /** Longest a check waits for Redis before the fallback answers (default 200 ms). */
  commandTimeoutMs?: number;
}

export interface RedisRateLimiter extends RateLimiter {
  /** "redis" while Redis answers; "fallback" from a failed check until Redis answers again. */
  mode(): RateLimiterMode;
  /** Closes the Redis connection and the fallback. consume() afterwards rejects. */
  close(): Promise<void>;
}

const toRateLimiterMode = (mode: FallbackMode): RateLimiterMode => (mode === "primary" ? "redis" : "fallback");

/**
 * The gateway's shared rate limiter: the Redis sliding log (redis-sliding-log-limiter.ts) behind
 * the fallback wrapper (fallback-rate-limiter.ts). When Redis cannot answer within
 * `commandTimeoutMs` (refused, down, timed out, or an error reply) the check is answered by the
 * local fallback instead, so calls stay fast and limited; ioredis keeps reconnecting and the first
 * check (or reconnect probe) that Redis answers switches back. A limit that is not a positive
 * integer is a RangeError, not an outage.
 *
 * Holds a connection, opened at once: close() it. Requests answered by the fallback during an
 * outage are not in Redis after recovery.
 */
export function openRedisRateLimiter(options: RedisRateLimiterOptions): RedisRateLimiter {
  const { fallback, logger, onModeChange, ...redisOptions } = options;
  const commandTimeoutMs = options.commandTimeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
  const redis = openRedisSlidingLogLimiter({ ...redisOptions, commandTimeoutMs });
  const target = describeRedisUrl(options.url);
  const limiter = withFallback(redis, fallback, {
    name: "Redis rate limiter",
    isOutage: isRedisOutage,
    primaryReady: () => redis.isReady(),
    ping: () => redis.ping(),
    logger,
    logLines: {
      outage:
        "Redis rate limiter unreachable (TDS_REDIS_URL): falling back to the local limiter, which limits each gateway instance separately until Redis answers again",
      outageFields: { redis: target, commandTimeoutMs },
      recovered: "Redis rate limiter reachable again: rate limits are shared across instances again",
      recoveredFields: { redis: target },
    },
    onModeChange: onModeChange && ((mode) => onModeChange(toRateLimiterMode(mode))),
  });
  // A reconnect during an outage: try Redis at once rather than waiting for the next check.
  redis.onReady(() => void limiter.probe());
  return {
    mode: () => toRateLimiterMode(limiter.mode()),
    consume: (key, limit) => limiter.consume(key, limit),
    close: () => limiter.close(),
  };
}
