import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { Redis } from "ioredis";
import { RATE_WINDOW_MS, type RateDecision, type RateLimiter, requireValidLimit } from "./rate-limiter.ts";
import { parseSlidingLogReply, SLIDING_LOG_LUA } from "./redis-sliding-log-script.ts";

export const DEFAULT_KEY_PREFIX = "tds:rl:";
export const DEFAULT_COMMAND_TIMEOUT_MS = 200;
export const DEFAULT_CONNECT_TIMEOUT_MS = 1000;
export const DEFAULT_MAX_RECONNECT_DELAY_MS = 2000;

export interface RedisSlidingLogOptions {
  /** redis:// or rediss:// URL of the Redis shared by all gateway instances. */
  url: string;
  /** Prefix of the sorted-set keys (default "tds:rl:"); the organization id follows it. */
  keyPrefix?: string;
  /** Longest a check (waiting for the connection included) or a ping waits for Redis (default 200 ms). */
  commandTimeoutMs?: number;
  /** TCP connect timeout of each (re)connection attempt (default 1000 ms). */
  connectTimeoutMs?: number;
  /** Cap of the reconnect backoff while Redis is down (default 2000 ms). */
  maxReconnectDelayMs?: number;
  /**
   * Sliding window length (default 60 000 = RATE_WINDOW_MS, the product's per-minute rate). Exists
   * so tests can exercise exact timing against a real Redis in real time, and for operations
   * that want another window; the gateway's contract is per minute.
   */
  windowMs?: number;
}

/**
 * The Redis adapter alone: no fallback. A check that Redis does not answer within the command
 * timeout rejects, and a later check tries Redis again (ioredis keeps reconnecting meanwhile).
 */
export interface RedisSlidingLogLimiter extends RateLimiter {
  /**
   * Rejects with an Error when Redis cannot answer within the command timeout: connection not ready
   * (refused, down, still connecting), timed out, an error reply, an unexpected reply. Rejects with
   * a RangeError for a limit that is not a positive integer, and after close(). isRedisOutage tells
   * the first kind from the others.
   */
  consume(key: string, limit: number): Promise<RateDecision>;
  /** True while the connection is up (a check is sent at once rather than waiting for it). */
  isReady(): boolean;
  /** PING, counting nothing; rejects when Redis does not answer within the command timeout. */
  ping(): Promise<void>;
  /**
   * Runs `listener` on every (re)connection, before the checks waiting for that connection resume
   * (listeners registered right after opening). It must not throw.
   */
  onReady(listener: () => void): void;
  /** QUITs (within the command timeout), then disconnects. consume() afterwards rejects. */
  close(): Promise<void>;
}

const SCRIPT_NAME = "tdsSlidingLog";

interface SlidingLogCommands {
  tdsSlidingLog(key: string, limit: number, windowMs: number, member: string): Promise<unknown>;
}

class RedisLimiterClosedError extends Error {}

/** Whether a rejection of RedisSlidingLogLimiter.consume() means Redis could not answer (not a misuse). */
export function isRedisOutage(err: unknown): boolean {
  return !(err instanceof RangeError) && !(err instanceof RedisLimiterClosedError);
}

/**
 * A RateLimiter whose counts live in Redis, shared by every gateway instance: one Lua script per
 * check (EVALSHA, EVAL when the script is not loaded yet) implements the exact sliding log with
 * Redis's clock (redis-sliding-log-script.ts). Holds one connection, opened at once: close() it.
 *
 * A check that timed out may still have been counted by Redis when it eventually ran; the error
 * is on the safe side (a request counted twice, never a request not counted at all).
 */
export function openRedisSlidingLogLimiter(options: RedisSlidingLogOptions): RedisSlidingLogLimiter {
  const keyPrefix = options.keyPrefix ?? DEFAULT_KEY_PREFIX;
  const windowMs = options.windowMs ?? RATE_WINDOW_MS;
  const commandTimeoutMs = options.commandTimeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
  const connectTimeoutMs = options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
  const maxReconnectDelayMs = options.maxReconnectDelayMs ?? DEFAULT_MAX_RECONNECT_DELAY_MS;
  requirePositiveInteger("windowMs", windowMs);
  requirePositiveInteger("commandTimeoutMs", commandTimeoutMs);
  requirePositiveInteger("connectTimeoutMs", connectTimeoutMs);
  requirePositiveInteger("maxReconnectDelayMs", maxReconnectDelayMs);

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
  /** The last connection error or failed call: the cause named when the connection is not ready. */
  let lastError: unknown;
  let closed = false;

  // Without a listener ioredis prints every connection error; whoever handles outages logs them.
  redis.on("error", (err: unknown) => {
    lastError = err;
  });

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
    sequence = (sequence + 1) % Number.MAX_SAFE_INTEGER;
    const member = `${instanceId}:${sequence}`;
    const reply = await withDeadline(commands.tdsSlidingLog(keyPrefix + key, limit, windowMs, member), deadline);
    return parseSlidingLogReply(reply);
  }

  return {
    async consume(key: string, limit: number): Promise<RateDecision> {
      if (closed) throw new RedisLimiterClosedError("Redis rate limiter is closed");
      requireValidLimit(limit);
      try {
        return await checkInRedis(key, limit, performance.now() + commandTimeoutMs);
      } catch (err) {
        lastError = err;
        throw err;
      }
    },

    isReady: () => redis.status === "ready",

    async ping(): Promise<void> {
      try {
        await withDeadline(redis.ping(), performance.now() + commandTimeoutMs);
      } catch (err) {
        lastError = err;
        throw err;
      }
    },

    onReady(listener: () => void): void {
      redis.on("ready", listener);
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
    },
  };
}

function requirePositiveInteger(name: string, value: number): void {
  if (!Number.isSafeInteger(value) || value < 1) throw new RangeError(`${name} must be a positive integer, got ${value}`);
}

/** host:port/db of the URL for logs, without credentials. */
export function describeRedisUrl(url: string): string {
  try {
    const u = new URL(url);
    return `${u.protocol}//${u.host}${u.pathname === "/" ? "" : u.pathname}`;
  } catch {
    return "(unparsable Redis URL)";
  }
}
