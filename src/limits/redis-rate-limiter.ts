import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { Redis } from "ioredis";
import { systemClock, type Clock } from "../gateway/clock.ts";
import { MemoryRateLimiter } from "./memory-rate-limiter.ts";
import { RATE_WINDOW_MS, type RateDecision, type RateLimiter } from "./rate-limiter.ts";

/**
 * The exact sliding log of one key, run atomically inside Redis.
 *
 * KEYS[1]  the key's log: a sorted set, member = unique id, score = Redis time in microseconds
 * ARGV[1]  limit (positive integer)
 * ARGV[2]  window in milliseconds
 * ARGV[3]  a suffix unique to this call (instance id + counter), so two requests in the same
 *          microsecond are two members
 *
 * Time comes from Redis (`TIME`), never from the gateway, so every instance sharing this Redis
 * shares one clock. Entries at or before now − window leave the window (as in MemoryRateLimiter).
 * When the limit was lowered, only the newest `limit` entries are kept (as MemoryRateLimiter does),
 * which also bounds the set to `limit` members. Returns {allowed 0|1, retryAfterMs, remaining};
 * retryAfterMs is rounded up, so after waiting it the oldest entry has left.
 * Scores stay exact: microseconds since 1970 (~1.8e15) are far below 2^53.
 */
export const SLIDING_LOG_LUA = `
local limit = tonumber(ARGV[1])
local window_us = tonumber(ARGV[2]) * 1000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window_us)
local count = redis.call('ZCARD', KEYS[1])
if count > limit then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, count - limit - 1)
  count = limit
end
if count < limit then
  redis.call('ZADD', KEYS[1], now, string.format('%s%06d:%s', t[1], tonumber(t[2]), ARGV[3]))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, 0, limit - count - 1}
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait_us = tonumber(oldest[2]) + window_us - now
return {0, math.floor((wait_us + 999) / 1000), 0}
`;

export type RateLimiterMode = "redis" | "fallback";

export interface RateLimiterLogger {
  warn(obj: object, msg: string): void;
  info(obj: object, msg: string): void;
}

export interface RedisRateLimiterOptions {
  /** redis:// or rediss:// URL of the Redis shared by all gateway instances. */
  url: string;
  /** Prefix of the sorted-set keys (default "tds:rl:"); the organization id follows it. */
  keyPrefix?: string;
  /**
   * The local limiter answering while Redis is unreachable. It limits each gateway instance
   * separately (N instances may together allow up to N × limit), but never lets requests through
   * unlimited. Default: a MemoryRateLimiter on `clock`. The Redis limiter owns it: close() closes it.
   */
  fallback?: RateLimiter;
  /** Clock of the default fallback only (tests). The Redis path always uses Redis TIME. */
  clock?: Clock;
  /** One warn when falling back, one info when Redis answers again; nothing in between. */
  logger?: RateLimiterLogger;
  /** Longest a check waits for Redis before the fallback answers (default 200 ms). */
  commandTimeoutMs?: number;
  /** TCP connect timeout of each (re)connection attempt (default 1000 ms). */
  connectTimeoutMs?: number;
  /** Cap of the reconnect backoff while Redis is down (default 2000 ms). */
  maxReconnectDelayMs?: number;
  /**
   * Sliding window length (default 60 000 = RATE_WINDOW_MS, the product's per-minute rate). Exists
   * so tests can exercise exact timing against a real Redis in real time, and for operations
   * that want another window; the gateway's contract is per minute. The fallback keeps its own
   * window (MemoryRateLimiter: 60 s).
   */
  windowMs?: number;
  /** Called on every switch between Redis and the fallback (errors thrown by it are ignored). */
  onModeChange?: (mode: RateLimiterMode) => void;
}

export interface RedisRateLimiter extends RateLimiter {
  /** "redis" while Redis answers; "fallback" from a failed check until Redis answers again. */
  mode(): RateLimiterMode;
  /** Closes the Redis connection and the fallback. consume() afterwards rejects. */
  close(): Promise<void>;
}

const DEFAULT_KEY_PREFIX = "tds:rl:";
const SCRIPT_NAME = "tdsSlidingLog";

interface SlidingLogCommands {
  tdsSlidingLog(key: string, limit: number, windowMs: number, member: string): Promise<unknown>;
}

/**
 * A RateLimiter whose counts live in Redis, shared by every gateway instance: one Lua script per
 * check (EVALSHA, EVAL when the script is not loaded yet) implements the exact sliding log with
 * Redis's clock. When Redis cannot answer within `commandTimeoutMs` (refused, down, timed out,
 * or an error reply) the check is answered by the local fallback instead, so calls stay fast and
 * limited; ioredis keeps reconnecting and the first check (or reconnect probe) that Redis answers
 * switches back.
 *
 * A check that timed out may still have been counted by Redis when it eventually ran; the error
 * is on the safe side (a request counted twice, never a request not counted at all). Requests
 * answered by the fallback during an outage are not in Redis after recovery.
 */
export function createRedisRateLimiter(options: RedisRateLimiterOptions): RedisRateLimiter {
  const keyPrefix = options.keyPrefix ?? DEFAULT_KEY_PREFIX;
  const windowMs = options.windowMs ?? RATE_WINDOW_MS;
  const commandTimeoutMs = options.commandTimeoutMs ?? 200;
  const connectTimeoutMs = options.connectTimeoutMs ?? 1000;
  const maxReconnectDelayMs = options.maxReconnectDelayMs ?? 2000;
  requirePositiveInteger("windowMs", windowMs);
  requirePositiveInteger("commandTimeoutMs", commandTimeoutMs);
  requirePositiveInteger("connectTimeoutMs", connectTimeoutMs);
  requirePositiveInteger("maxReconnectDelayMs", maxReconnectDelayMs);
  const fallback = options.fallback ?? new MemoryRateLimiter(options.clock ?? systemClock);
  const logger = options.logger;
  const target = describeUrl(options.url);

  const redis = new Redis(options.url, {
    lazyConnect: false,
    // A check never waits for a connection that is not there, and is never replayed later.
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    commandTimeout: commandTimeoutMs,
    connectTimeout: connectTimeoutMs,
    retryStrategy: (times) => Math.min(50 * 2 ** Math.min(times - 1, 10), maxReconnectDelayMs) + Math.floor(Math.random() * 50),
  });
  redis.defineCommand(SCRIPT_NAME, { numberOfKeys: 1, lua: SLIDING_LOG_LUA });
  const commands = redis as unknown as SlidingLogCommands;

  const instanceId = randomBytes(6).toString("hex");
  let sequence = 0;
  let currentMode: RateLimiterMode = "redis";
  /** Bumped on every mode switch: only a check started in the current epoch may switch again. */
  let epoch = 0;
  let lastError: unknown = undefined;
  let outageStartedAt = 0;
  let probing = false;
  let closed = false;

  // Without a listener ioredis prints every connection error; the outage is logged once instead.
  redis.on("error", (err: unknown) => {
    lastError = err;
  });
  // A reconnect while in fallback: try Redis at once rather than waiting for the next check.
  redis.on("ready", () => {
    if (currentMode === "fallback" && !closed) void probe();
  });

  function setMode(mode: RateLimiterMode, startedEpoch: number, err?: unknown): void {
    if (closed || mode === currentMode || startedEpoch !== epoch) return;
    currentMode = mode;
    epoch++;
    // A failing logger or listener must not turn a rate check into an error.
    try {
      if (mode === "fallback") {
        outageStartedAt = performance.now();
        logger?.warn(
          { err: err ?? lastError, redis: target, commandTimeoutMs },
          "Redis rate limiter unreachable (TDS_REDIS_URL): falling back to the local limiter, which limits each gateway instance separately until Redis answers again",
        );
      } else {
        logger?.info(
          { redis: target, outageMs: Math.round(performance.now() - outageStartedAt) },
          "Redis rate limiter reachable again: rate limits are shared across instances again",
        );
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

  /** Settles on the next "ready" (true) or failed attempt / end (false); shared by all waiting checks. */
  let nextConnectionOutcome: Promise<boolean> | null = null;
  function connectionOutcome(): Promise<boolean> {
    nextConnectionOutcome ??= new Promise<boolean>((resolve) => {
      const finish = (ready: boolean) => {
        redis.off("ready", onReady);
        redis.off("close", onFail);
        redis.off("end", onFail);
        nextConnectionOutcome = null;
        resolve(ready);
      };
      const onReady = () => finish(true);
      const onFail = () => finish(false);
      redis.on("ready", onReady);
      redis.on("close", onFail);
      redis.on("end", onFail);
    });
    return nextConnectionOutcome;
  }

  /** Resolves true when the connection is ready, false on a failed attempt or at the deadline. */
  async function waitForReady(deadline: number): Promise<boolean> {
    if (redis.status === "ready") return true;
    if (redis.status === "end") return false;
    return withDeadline(connectionOutcome(), deadline).catch(() => false);
  }

  /** Runs `op` against Redis, rejecting if it does not settle before the deadline. */
  function withDeadline<T>(op: Promise<T>, deadline: number): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`Redis did not answer within ${commandTimeoutMs} ms`)),
        Math.max(0, deadline - performance.now()),
      );
      op.then(
        (value) => {
          clearTimeout(timer);
          resolve(value);
        },
        (err: unknown) => {
          clearTimeout(timer);
          reject(err);
        },
      );
    });
  }

  async function checkInRedis(key: string, limit: number, deadline: number): Promise<RateDecision> {
    if (!(await waitForReady(deadline))) {
      throw lastError instanceof Error
        ? new Error(`Redis connection not ready (${redis.status}): ${lastError.message}`, { cause: lastError })
        : new Error(`Redis connection not ready (${redis.status})`);
    }
    const member = `${instanceId}:${(sequence = (sequence + 1) % Number.MAX_SAFE_INTEGER)}`;
    const reply = await withDeadline(commands.tdsSlidingLog(keyPrefix + key, limit, windowMs, member), deadline);
    return parseReply(reply);
  }

  async function probe(): Promise<void> {
    if (probing) return;
    probing = true;
    const startedEpoch = epoch;
    try {
      await withDeadline(redis.ping(), performance.now() + commandTimeoutMs);
      setMode("redis", startedEpoch);
    } catch (err) {
      lastError = err;
    } finally {
      probing = false;
    }
  }

  return {
    mode: () => currentMode,

    async consume(key: string, limit: number): Promise<RateDecision> {
      if (closed) throw new Error("Redis rate limiter is closed");
      requirePositiveInteger("limit", limit);
      const startedEpoch = epoch;
      if (currentMode === "redis") {
        try {
          const decision = await checkInRedis(key, limit, performance.now() + commandTimeoutMs);
          return decision;
        } catch (err) {
          lastError = err;
          setMode("fallback", startedEpoch, err);
          return fallback.consume(key, limit);
        }
      }
      // Fallback: while the connection is up, one check at a time tries Redis (bounded by the
      // timeout); the others, and all checks while the connection is down, answer locally at once.
      if (redis.status === "ready" && !probing) {
        probing = true;
        try {
          const decision = await checkInRedis(key, limit, performance.now() + commandTimeoutMs);
          setMode("redis", startedEpoch);
          return decision;
        } catch (err) {
          lastError = err;
        } finally {
          probing = false;
        }
      }
      return fallback.consume(key, limit);
    },

    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      try {
        if (redis.status === "ready") await withDeadline(redis.quit(), performance.now() + commandTimeoutMs);
      } catch {
        // fall through to a hard disconnect
      }
      redis.disconnect();
      await fallback.close();
    },
  };
}

function parseReply(reply: unknown): RateDecision {
  if (!Array.isArray(reply) || reply.length !== 3) throw new Error(`Unexpected rate-limit script reply: ${JSON.stringify(reply)}`);
  const [allowed, retryAfterMs, remaining] = reply.map(Number) as [number, number, number];
  return { allowed: allowed === 1, retryAfterMs, remaining };
}

function requirePositiveInteger(name: string, value: number): void {
  if (!Number.isSafeInteger(value) || value < 1) throw new RangeError(`${name} must be a positive integer, got ${value}`);
}

/** host:port/db of the URL for logs, without credentials. */
function describeUrl(url: string): string {
  try {
    const u = new URL(url);
    return `${u.protocol}//${u.host}${u.pathname === "/" ? "" : u.pathname}`;
  } catch {
    return "(unparsable Redis URL)";
  }
}
