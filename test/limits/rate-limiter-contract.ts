import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import { describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import fc from "fast-check";
import { type Clock, systemClock } from "../../src/domain/clock.ts";
import { RATE_WINDOW_MS, type RateDecision, type RateLimiter } from "../../src/limits/rate-limiter.ts";
import { FixedClock } from "../support/fixed-clock.ts";

/**
 * The behaviour every RateLimiter must have: an exact sliding log, in any window at most `limit`
 * allowed, a refused request not counted, retry-after exact.
 *
 * By default time is a FixedClock handed to `make` (window RATE_WINDOW_MS), so every assertion is
 * exact. With `realTime`, the limiter under test keeps its own clock (e.g. Redis TIME) and uses
 * `realTime.windowMs`; time passes by sleeping, every call is timed (start..end on a monotonic
 * clock), and the same assertions are made on the bounds those timings allow, plus `slackMs`.
 * An outcome that the timings leave undecided (a call within the measurement error of an
 * entry's leaving) is not asserted either way.
 */
export interface RateLimiterContractOptions {
  realTime?: {
    windowMs: number;
    /** Tolerance added to measured bounds (timer and clock granularity, rounding). Default 3 ms. */
    slackMs?: number;
    /** Property runs (each sleeps about 1-2 windows). Default 4. */
    numRuns?: number;
  };
  /** Skips the whole suite (node:test `skip`: a reason string or true). */
  skip?: string | boolean;
}

interface ContractTime {
  clock: Clock;
  windowMs: number;
  slackMs: number;
  /** How far before an expected change of outcome the "still refused" check is made. */
  marginMs: number;
  now(): number;
  advance(ms: number): Promise<void>;
}

function fixedTime(start: number): ContractTime {
  const clock = new FixedClock(start);
  return {
    clock,
    windowMs: RATE_WINDOW_MS,
    slackMs: 0,
    marginMs: 1,
    now: () => clock.nowMs(),
    advance: async (ms) => clock.advance(ms),
  };
}

function realTime(windowMs: number, slackMs: number): ContractTime {
  return {
    clock: systemClock,
    windowMs,
    slackMs,
    marginMs: Math.max(10, Math.round(windowMs / 20)),
    now: () => performance.now(),
    advance: (ms) => sleep(Math.max(0, ms)),
  };
}

interface Timed {
  decision: RateDecision;
  /** The call started no earlier than `start` and was decided no later than `end`. */
  start: number;
  end: number;
}

/**
 * The model of an exact sliding log, fed with the timed calls of one key under a constant limit.
 * `expect` checks a decision against what the timings allow, then records it.
 */
class SlidingLogOracle {
  readonly allowed: Timed[] = [];
  undecided = 0;

  constructor(
    private readonly time: ContractTime,
    private readonly limit: number,
  ) {}

  expect(call: Timed, label = ""): void {
    const { decision: d, start, end } = call;
    const W = this.time.windowMs;
    const slack = this.time.slackMs;
    // An entry allowed at t_a (start_a <= t_a <= end_a) is in the window of a call at t iff t_a > t - W.
    const surelyIn = this.allowed.filter((a) => a.start > end - W).length;
    const maybeIn = this.allowed.filter((a) => !(a.end <= start - W)).length;
    const at = `${label} (allowed so far ${this.allowed.length}, surely in window ${surelyIn}, maybe ${maybeIn}, limit ${this.limit}) ${JSON.stringify(d)}`;
    if (maybeIn < this.limit) assert.equal(d.allowed, true, `must be allowed ${at}`);
    else if (surelyIn >= this.limit) assert.equal(d.allowed, false, `must be refused ${at}`);
    else this.undecided++;

    if (d.allowed) {
      assert.equal(d.retryAfterMs, 0, `retryAfterMs of an allowed request ${at}`);
      const lo = this.limit - Math.min(maybeIn, this.limit - 1) - 1;
      const hi = this.limit - surelyIn - 1;
      assert.ok(d.remaining >= lo && d.remaining <= hi, `remaining ${d.remaining} not in [${lo}, ${hi}] ${at}`);
      this.allowed.push(call);
      return;
    }
    assert.equal(d.remaining, 0, `remaining of a refused request ${at}`);
    // Under a constant limit a refusal means exactly `limit` entries in the window, the oldest of
    // which is allowed[n - limit]; the wait is until it leaves.
    const oldest = this.allowed[this.allowed.length - this.limit];
    assert.ok(oldest, `refused with only ${this.allowed.length} allowed ${at}`);
    const lo = Math.max(1, oldest.start + W - end - slack);
    const hi = oldest.end + W - start + slack;
    assert.ok(d.retryAfterMs >= lo && d.retryAfterMs <= hi, `retryAfterMs ${d.retryAfterMs} not in [${lo}, ${hi}] ${at}`);
  }

  /** In any window of W (measured from an allowed entry) at most `limit` entries were allowed. */
  assertWindowInvariant(): void {
    const W = this.time.windowMs;
    for (let i = 0; i < this.allowed.length; i++) {
      const first = this.allowed[i]!;
      const within = this.allowed.slice(i).filter((b) => b.end - first.start < W).length;
      assert.ok(within <= this.limit, `${within} allowed within one window after entry ${i}, limit ${this.limit}`);
    }
  }
}

export function describeRateLimiterContract(
  name: string,
  make: (clock: Clock) => Promise<RateLimiter>,
  options: RateLimiterContractOptions = {},
): void {
  const real = options.realTime;
  const newTime = (): ContractTime => (real ? realTime(real.windowMs, real.slackMs ?? 3) : fixedTime(1_000_000));

  async function withLimiter(fn: (limiter: RateLimiter, time: ContractTime) => Promise<void>): Promise<void> {
    const time = newTime();
    const limiter = await make(time.clock);
    try {
      await fn(limiter, time);
    } finally {
      await limiter.close();
    }
  }

  async function timed(limiter: RateLimiter, time: ContractTime, key: string, limit: number): Promise<Timed> {
    const start = time.now();
    const decision = await limiter.consume(key, limit);
    return { decision, start, end: time.now() };
  }

  const suite = `${name}: RateLimiter contract (${real ? `real time, ${real.windowMs} ms window` : "fixed clock, 60 s window"})`;
  describe(suite, { skip: options.skip ?? false }, () => {
    test("allows `limit` at once, refuses the next with the exact wait, and frees a slot as the oldest leaves", async () => {
      await withLimiter(async (limiter, time) => {
        const W = time.windowMs;
        const oracle = new SlidingLogOracle(time, 3);
        for (let i = 0; i < 3; i++) {
          const call = await timed(limiter, time, "org", 3);
          assert.equal(call.decision.allowed, true);
          assert.equal(call.decision.remaining, 2 - i);
          oracle.expect(call, `#${i}`);
          await time.advance(W / 6);
        }
        const refused = await timed(limiter, time, "org", 3);
        assert.equal(refused.decision.allowed, false);
        oracle.expect(refused, "refused");
        if (!real) assert.deepEqual(refused.decision, { allowed: false, retryAfterMs: 30_000, remaining: 0 });
        assert.ok(refused.decision.retryAfterMs <= W / 2 + time.slackMs, "the oldest entry is at least half a window old");

        await time.advance(refused.decision.retryAfterMs - time.marginMs);
        const early = await timed(limiter, time, "org", 3);
        oracle.expect(early, "just before the oldest leaves");
        if (!real) assert.equal(early.decision.allowed, false);
        // (In real time a late timer may already have let the oldest leave: the oracle judged that.)
        if (!early.decision.allowed) {
          await time.advance(time.marginMs + (real ? time.slackMs : 0));
          const later = await timed(limiter, time, "org", 3);
          assert.equal(later.decision.allowed, true, "allowed once the oldest has left");
          oracle.expect(later, "once the oldest left");
        }
        assert.equal((await limiter.consume("other", 3)).allowed, true, "keys are independent");
        oracle.assertWindowInvariant();
      });
    });

    test("a refused request is not counted", async () => {
      await withLimiter(async (limiter, time) => {
        const W = time.windowMs;
        const oracle = new SlidingLogOracle(time, 2);
        oracle.expect(await timed(limiter, time, "k", 2), "first");
        await time.advance(W / 2);
        oracle.expect(await timed(limiter, time, "k", 2), "second");
        for (let i = 0; i < 5; i++) {
          const call = await timed(limiter, time, "k", 2);
          assert.equal(call.decision.allowed, false);
          oracle.expect(call, `refusal ${i}`);
        }
        // The first entry leaves; had the refusals counted, the window would still be full.
        await time.advance(W / 2 + time.slackMs + 1);
        const after = await timed(limiter, time, "k", 2);
        assert.equal(after.decision.allowed, true);
        oracle.expect(after, "after the first left");
      });
    });

    test("property: in every window at most `limit` requests are allowed, and every refusal's wait is exact", async () => {
      await withLimiter(async (limiter, time) => {
        const scale = time.windowMs / RATE_WINDOW_MS;
        let run = 0;
        let undecided = 0;
        await fc.assert(
          fc.asyncProperty(
            fc.integer({ min: 1, max: 6 }),
            fc.array(fc.integer({ min: 0, max: 25_000 }), { minLength: 1, maxLength: real ? 16 : 80 }),
            async (limit, gaps) => {
              const key = `prop-${run++}`;
              const oracle = new SlidingLogOracle(time, limit);
              for (const [i, gap] of gaps.entries()) {
                await time.advance(Math.round(gap * scale));
                oracle.expect(await timed(limiter, time, key, limit), `call ${i}`);
              }
              oracle.assertWindowInvariant();
              undecided += oracle.undecided;
            },
          ),
          { numRuns: real ? (real.numRuns ?? 4) : 200 },
        );
        if (!real) assert.equal(undecided, 0, "a fixed clock decides every outcome");
      });
    });

    test("a lower limit after a change keeps the newest entries", async () => {
      await withLimiter(async (limiter, time) => {
        const W = time.windowMs;
        const calls: Timed[] = [];
        for (let i = 0; i < 5; i++) {
          calls.push(await timed(limiter, time, "k", 5));
          await time.advance(W / 10);
        }
        assert.ok(calls.every((c) => c.decision.allowed));
        const refused = await timed(limiter, time, "k", 2);
        assert.equal(refused.decision.allowed, false);
        // Two newest entries kept: the wait is until the older of them (the 4th) leaves.
        const fourth = calls[3]!;
        const lo = fourth.start + W - refused.end - time.slackMs;
        const hi = fourth.end + W - refused.start + time.slackMs;
        assert.ok(
          refused.decision.retryAfterMs >= lo && refused.decision.retryAfterMs <= hi,
          `retryAfterMs ${refused.decision.retryAfterMs} not in [${lo}, ${hi}]`,
        );
        if (!real) assert.equal(refused.decision.retryAfterMs, W - (2 * W) / 10);
        await time.advance(W);
        assert.equal((await limiter.consume("k", 2)).allowed, true);
      });
    });

    test("concurrent calls for one key: exactly `limit` allowed, each with its own `remaining`", async () => {
      await withLimiter(async (limiter) => {
        const limit = 7;
        const decisions = await Promise.all(Array.from({ length: 25 }, () => limiter.consume("burst", limit)));
        const allowed = decisions.filter((d) => d.allowed);
        assert.equal(allowed.length, limit);
        assert.deepEqual(
          allowed.map((d) => d.remaining).sort((a, b) => a - b),
          Array.from({ length: limit }, (_, i) => i),
        );
        for (const d of decisions.filter((x) => !x.allowed)) {
          assert.equal(d.remaining, 0);
          assert.ok(d.retryAfterMs >= 1);
        }
      });
    });
  });
}
