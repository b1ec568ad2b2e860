import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, test } from "node:test";
import { Redis } from "ioredis";
import { isRedisOutage, openRedisSlidingLogLimiter } from "../../src/limits/redis-sliding-log-limiter.ts";
import { freePort } from "../support/redis-server.ts";
import { settlesBefore } from "../support/timer-race.ts";

// The Redis adapter alone, without the fallback: it answers from Redis or rejects.
// Needs the Redis at 127.0.0.1:6379 (or TDS_TEST_REDIS_URL); TDS_SKIP_REDIS=1 skips that part
// (redis-rate-limiter.test.ts fails clearly when it is unreachable).
const REDIS_URL = process.env.TDS_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";
const SKIP = process.env.TDS_SKIP_REDIS === "1" ? "TDS_SKIP_REDIS=1" : false;
const COMMAND_TIMEOUT_MS = 200;
/** A timer the checks race: the command timeout's own timer, started no earlier, is due well before it. */
const GUARD_MS = COMMAND_TIMEOUT_MS * 5;

describe("RedisSlidingLogLimiter alone", () => {
  test("nothing listening: every check rejects within the timeout with an outage, and keeps trying", async () => {
    const port = await freePort();
    const limiter = openRedisSlidingLogLimiter({ url: `redis://127.0.0.1:${port}`, commandTimeoutMs: COMMAND_TIMEOUT_MS });
    try {
      for (let i = 0; i < 5; i++) {
        const check = limiter.consume("org", 3);
        assert.ok(await settlesBefore(check, GUARD_MS), "bounded by the command timeout");
        await assert.rejects(check, (err: unknown) => {
          assert.ok(err instanceof Error && !(err instanceof RangeError), String(err));
          assert.ok(isRedisOutage(err));
          return true;
        });
      }
      assert.equal(limiter.isReady(), false);
      await assert.rejects(limiter.ping(), (err: unknown) => isRedisOutage(err));
      await assert.rejects(limiter.consume("org", 0), RangeError);
    } finally {
      await limiter.close();
    }
  });

  test("against Redis: answers, ready, pings; misuse and use after close are not outages", { skip: SKIP }, async () => {
    const prefix = `tds:test:${randomUUID().slice(0, 8)}:`;
    const limiter = openRedisSlidingLogLimiter({ url: REDIS_URL, keyPrefix: prefix, commandTimeoutMs: 2000 });
    let readies = 0;
    limiter.onReady(() => readies++);
    const admin = new Redis(REDIS_URL);
    try {
      assert.deepEqual(await limiter.consume("org", 2), { allowed: true, retryAfterMs: 0, remaining: 1 });
      assert.deepEqual(await limiter.consume("org", 2), { allowed: true, retryAfterMs: 0, remaining: 0 });
      const refused = await limiter.consume("org", 2);
      assert.equal(refused.allowed, false);
      assert.ok(refused.retryAfterMs > 59_000 && refused.retryAfterMs <= 60_000, `retryAfterMs ${refused.retryAfterMs}`);
      assert.equal(limiter.isReady(), true);
      assert.equal(readies, 1, "onReady runs on the connection");
      await limiter.ping();
      await assert.rejects(limiter.consume("org", 1.5), (err: unknown) => err instanceof RangeError && !isRedisOutage(err));
    } finally {
      await limiter.close();
      await admin.del(`${prefix}org`);
      await admin.quit();
    }
    await assert.rejects(limiter.consume("org", 2), (err: unknown) => /closed/.test(String(err)) && !isRedisOutage(err));
    await limiter.close();
  });
});
