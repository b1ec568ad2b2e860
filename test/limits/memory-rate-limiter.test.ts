import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { FixedClock } from "../../src/gateway/clock.ts";
import { MemoryRateLimiter } from "../../src/limits/memory-rate-limiter.ts";
import { RATE_WINDOW_MS } from "../../src/limits/rate-limiter.ts";

describe("MemoryRateLimiter (sliding log)", () => {
  test("allows `limit` at once, refuses the next with the exact wait, and frees a slot as the oldest leaves", async () => {
    const clock = new FixedClock(1_000_000);
    const limiter = new MemoryRateLimiter(clock);
    for (let i = 0; i < 3; i++) {
      assert.equal((await limiter.consume("org", 3)).allowed, true);
      clock.advance(10_000);
    }
    const refused = await limiter.consume("org", 3);
    assert.deepEqual(refused, { allowed: false, retryAfterMs: 30_000, remaining: 0 });
    clock.advance(29_999);
    assert.equal((await limiter.consume("org", 3)).allowed, false);
    clock.advance(1);
    assert.equal((await limiter.consume("org", 3)).allowed, true);
    assert.equal((await limiter.consume("other", 3)).allowed, true, "keys are independent");
  });

  test("property: in every 60-second window at most `limit` requests are allowed, and every refusal's wait is exact", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 6 }),
        fc.array(fc.integer({ min: 0, max: 25_000 }), { minLength: 1, maxLength: 80 }),
        async (limit, gaps) => {
          const clock = new FixedClock(5_000_000);
          const limiter = new MemoryRateLimiter(clock);
          const allowed: number[] = [];
          for (const gap of gaps) {
            clock.advance(gap);
            const now = clock.nowMs();
            const d = await limiter.consume("k", limit);
            const inWindow = allowed.filter((t) => t > now - RATE_WINDOW_MS);
            assert.equal(d.allowed, inWindow.length < limit);
            if (d.allowed) allowed.push(now);
            else assert.equal(d.retryAfterMs, inWindow[0]! + RATE_WINDOW_MS - now);
          }
          for (const t of allowed) assert.ok(allowed.filter((u) => u >= t && u < t + RATE_WINDOW_MS).length <= limit);
        },
      ),
      { numRuns: 200 },
    );
  });

  test("a lower limit after a change keeps the newest entries", async () => {
    const clock = new FixedClock(0);
    const limiter = new MemoryRateLimiter(clock);
    for (let i = 0; i < 5; i++) await limiter.consume("k", 5);
    assert.equal((await limiter.consume("k", 2)).allowed, false);
    clock.advance(RATE_WINDOW_MS);
    assert.equal((await limiter.consume("k", 2)).allowed, true);
  });
});
