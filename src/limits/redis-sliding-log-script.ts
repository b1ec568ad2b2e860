import type { RateDecision } from "./rate-limiter.ts";

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
 * which also bounds the set to `limit` members. Returns {allowed 0|1, retryAfterMs, remaining}
 * (read by parseSlidingLogReply); retryAfterMs is rounded up, so after waiting it the oldest entry
 * has left. Scores stay exact: microseconds since 1970 (~1.8e15) are far below 2^53.
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

/**
 * The decision in the script's reply: an array of three integers, as ioredis returns it. A reply of
 * another shape is an Error (not a RangeError), so the composition counts it as Redis failing.
 */
export function parseSlidingLogReply(reply: unknown): RateDecision {
  if (!Array.isArray(reply) || reply.length !== 3) throw new Error(`Unexpected rate-limit script reply: ${JSON.stringify(reply)}`);
  const [allowed, retryAfterMs, remaining] = reply.map(Number) as [number, number, number];
  return { allowed: allowed === 1, retryAfterMs, remaining };
}
