import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import fc from "fast-check";
import { Redis } from "ioredis";
import { systemClock } from "../../src/domain/clock.ts";
import { MemoryRateLimiter } from "../../src/limits/memory-rate-limiter.ts";
import { RATE_WINDOW_MS, type RateDecision, type RateLimiter } from "../../src/limits/rate-limiter.ts";
import {
  openRedisRateLimiter,
  type RateLimiterMode,
  type RedisRateLimiter,
  type RedisRateLimiterOptions,
} from "../../src/limits/redis-rate-limiter.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { freePort, startRedisServer, stopRedisServer } from "../support/redis-server.ts";
import { settlesBefore } from "../support/timer-race.ts";
import { describeRateLimiterContract } from "./rate-limiter-contract.ts";

// Needs the Redis of services.md at 127.0.0.1:6379 (or TDS_TEST_REDIS_URL) and the redis-server binary.
// TDS_SKIP_REDIS=1 skips what needs them; otherwise an unreachable Redis fails the file clearly.
const REDIS_URL = process.env.TDS_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";
const SKIP = process.env.TDS_SKIP_REDIS === "1" ? "TDS_SKIP_REDIS=1" : false;
const RUN = randomUUID().slice(0, 8);
const PREFIX = `tds:test:${RUN}:`;
const COMMAND_TIMEOUT_MS = 200;
/**
 * What "answers within the command timeout" means here: before a timer of 5 command timeouts started with the
 * call. The limiter's own deadline timer, started no earlier, is always due first, however busy the machine.
 */
const GUARD_MS = COMMAND_TIMEOUT_MS * 5;

async function redisProblem(url: string): Promise<string | null> {
  const client = new Redis(url, {
    lazyConnect: true,
    retryStrategy: () => null,
    enableOfflineQueue: false,
    connectTimeout: 1000,
    maxRetriesPerRequest: 0,
  });
  let cause = "";
  client.on("error", (err: Error) => (cause ||= err.message));
  try {
    await client.connect();
    await client.ping();
    return null;
  } catch (err) {
    return cause || (err as Error).message;
  } finally {
    client.disconnect();
  }
}

const problem = SKIP ? null : await redisProblem(REDIS_URL);
const unreachable = problem
  ? `Redis at ${REDIS_URL} is not reachable (${problem}). Start it with: bash scripts/ensure-services.sh ` +
    `(see docs/services.md), or set TDS_SKIP_REDIS=1 to skip the Redis tests.`
  : null;
const skipShared: string | false = SKIP || (unreachable ? "Redis unreachable: see the failing test" : false);

test("Redis for the rate-limiter tests is reachable", { skip: SKIP }, () => {
  if (unreachable) assert.fail(unreachable);
});

class RecordingLogger {
  readonly warns: { obj: object; msg: string }[] = [];
  readonly infos: { obj: object; msg: string }[] = [];
  warn(obj: object, msg: string): void {
    this.warns.push({ obj, msg });
  }
  info(obj: object, msg: string): void {
    this.infos.push({ obj, msg });
  }
}

/** For tests that must be answered by Redis: any use of the fallback fails them. */
const noFallback: RateLimiter = {
  consume: async () => {
    throw new Error("the fallback answered: Redis did not (see the limiter's warn)");
  },
  close: async () => {},
};

let prefixes = 0;
function uniquePrefix(): string {
  return `${PREFIX}${prefixes++}:`;
}

function redisLimiter(overrides: Partial<RedisRateLimiterOptions> = {}): RedisRateLimiter {
  return openRedisRateLimiter({
    url: REDIS_URL,
    keyPrefix: uniquePrefix(),
    fallback: noFallback,
    commandTimeoutMs: 2000,
    ...overrides,
  });
}

/** A check, and whether it was answered before a timer of `guardMs` started with it fired (`ms` for messages only). */
async function timedConsume(
  limiter: RateLimiter,
  key: string,
  limit: number,
  guardMs = GUARD_MS,
): Promise<{ d: RateDecision; ms: number; inTime: boolean }> {
  const t0 = performance.now();
  const check = limiter.consume(key, limit);
  const inTime = await settlesBefore(check, guardMs);
  const d = await check;
  return { d, ms: performance.now() - t0, inTime };
}

async function waitFor(what: string, condition: () => boolean, timeoutMs: number): Promise<number> {
  const t0 = performance.now();
  while (!condition()) {
    if (performance.now() - t0 > timeoutMs) assert.fail(`${what}: not within ${timeoutMs} ms`);
    await sleep(20);
  }
  return performance.now() - t0;
}

describeRateLimiterContract("RedisRateLimiter", async () => redisLimiter({ windowMs: 300 }), {
  realTime: { windowMs: 300, slackMs: 3, numRuns: 5 },
  skip: skipShared,
});

describe("RedisRateLimiter against the shared Redis", { skip: skipShared }, () => {
  let admin: Redis;
  before(() => {
    admin = new Redis(REDIS_URL);
  });
  after(async () => {
    let cursor = "0";
    do {
      const [next, keys] = await admin.scan(cursor, "MATCH", `${PREFIX}*`, "COUNT", 1000);
      if (keys.length) await admin.del(...keys);
      cursor = next;
    } while (cursor !== "0");
    await admin.quit();
  });

  test("property: concurrent calls from several instances (separate connections) allow exactly `limit`", async () => {
    const prefix = uniquePrefix();
    const instances = Array.from({ length: 4 }, () => redisLimiter({ keyPrefix: prefix }));
    try {
      let run = 0;
      await fc.assert(
        fc.asyncProperty(
          fc.integer({ min: 1, max: 20 }),
          fc.array(fc.integer({ min: 0, max: 3 }), { minLength: 1, maxLength: 80 }),
          async (limit, callers) => {
            const key = `org-${run++}`;
            const decisions = await Promise.all(callers.map((i) => instances[i]!.consume(key, limit)));
            const allowed = decisions.filter((d) => d.allowed);
            assert.equal(allowed.length, Math.min(limit, callers.length));
            // The checks ran one after another in Redis: each allowed one saw its own count.
            assert.deepEqual(
              allowed.map((d) => d.remaining).sort((a, b) => a - b),
              Array.from({ length: allowed.length }, (_, i) => limit - allowed.length + i),
            );
            for (const d of decisions.filter((x) => !x.allowed)) {
              assert.equal(d.remaining, 0);
              assert.ok(d.retryAfterMs >= 1 && d.retryAfterMs <= RATE_WINDOW_MS, `retryAfterMs ${d.retryAfterMs}`);
            }
            // One member per allowed request, even for requests in the same microsecond.
            assert.equal(await admin.zcard(prefix + key), allowed.length);
            const ttl = await admin.pttl(prefix + key);
            assert.ok(ttl > 0 && ttl <= RATE_WINDOW_MS, `PTTL ${ttl}`);
          },
        ),
        { numRuns: 30 },
      );
      const burst = await Promise.all(Array.from({ length: 400 }, (_, i) => instances[i % 4]!.consume("big", 150)));
      assert.equal(burst.filter((d) => d.allowed).length, 150);
      assert.ok(instances.every((l) => l.mode() === "redis"));
    } finally {
      await Promise.all(instances.map((l) => l.close()));
    }
  });

  test("the 60-second window's retry-after is exact to a few ms (Redis TIME, default window and prefix)", async () => {
    const org = `${PREFIX}default-prefix-${randomUUID()}`;
    const limiter = openRedisRateLimiter({ url: REDIS_URL, fallback: noFallback, commandTimeoutMs: 2000 });
    try {
      const t0 = performance.now();
      assert.equal((await limiter.consume(org, 2)).allowed, true);
      const t1 = performance.now();
      await sleep(40);
      assert.equal((await limiter.consume(org, 2)).allowed, true);
      const t2 = performance.now();
      const refused = await limiter.consume(org, 2);
      const t3 = performance.now();
      assert.equal(refused.allowed, false);
      // The first entry was made in [t0, t1], the refusal in [t2, t3]; +1 for rounding up to whole ms.
      const lo = t0 + RATE_WINDOW_MS - t3 - 2;
      const hi = t1 + RATE_WINDOW_MS - t2 + 3;
      assert.ok(refused.retryAfterMs >= lo && refused.retryAfterMs <= hi, `retryAfterMs ${refused.retryAfterMs} not in [${lo}, ${hi}]`);
      assert.equal(await admin.zcard(`tds:rl:${org}`), 2, 'the default key prefix is "tds:rl:"');
    } finally {
      await admin.del(`tds:rl:${org}`);
      await limiter.close();
    }
  });

  test("a limit that is not a positive integer is a programming error, not an outage", async () => {
    const logger = new RecordingLogger();
    const limiter = redisLimiter({ logger });
    try {
      await assert.rejects(limiter.consume("k", 0), RangeError);
      await assert.rejects(limiter.consume("k", 1.5), RangeError);
      assert.equal(limiter.mode(), "redis");
      assert.equal(logger.warns.length, 0);
    } finally {
      await limiter.close();
    }
    await assert.rejects(limiter.consume("k", 1), /closed/);
  });
});

describe("RedisRateLimiter when Redis cannot answer", () => {
  test("nothing listening: every call is answered by the fallback within the timeout, one warn, never unlimited", async () => {
    const port = await freePort();
    const logger = new RecordingLogger();
    const modes: RateLimiterMode[] = [];
    const limiter = openRedisRateLimiter({
      url: `redis://127.0.0.1:${port}`,
      fallback: new MemoryRateLimiter(new FixedClock(0)),
      logger,
      commandTimeoutMs: COMMAND_TIMEOUT_MS,
      onModeChange: (m) => modes.push(m),
    });
    try {
      const calls = [];
      // ~1 s of calls, across several reconnect attempts.
      for (let i = 0; i < 20; i++) {
        calls.push(await timedConsume(limiter, "org", 3));
        await sleep(50);
      }
      calls.push(...(await Promise.all(Array.from({ length: 30 }, () => timedConsume(limiter, "org", 3)))));
      for (const c of calls) assert.ok(c.inTime, `a call took ${c.ms.toFixed(0)} ms`);
      assert.deepEqual(
        calls.slice(0, 4).map((c) => c.d.allowed),
        [true, true, true, false],
      );
      assert.equal(calls.filter((c) => c.d.allowed).length, 3, "the fallback limits: not one request more");
      assert.deepEqual(calls[3]!.d, { allowed: false, retryAfterMs: RATE_WINDOW_MS, remaining: 0 });
      assert.equal(limiter.mode(), "fallback");
      assert.deepEqual(modes, ["fallback"]);
      assert.equal(logger.warns.length, 1, "one warn per outage");
      assert.equal(logger.infos.length, 0);
      assert.match(logger.warns[0]!.msg, /falling back/);
      assert.equal((logger.warns[0]!.obj as { redis?: string }).redis, `redis://127.0.0.1:${port}`);
    } finally {
      assert.ok(await settlesBefore(limiter.close(), GUARD_MS), "close() does not wait for Redis");
    }
  });

  test("a server that accepts connections but never answers: calls stay bounded by the timeout", async () => {
    const sockets = new Set<net.Socket>();
    const server = net.createServer((s) => {
      sockets.add(s);
      s.on("error", () => {});
    });
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    const { port } = server.address() as net.AddressInfo;
    const logger = new RecordingLogger();
    const limiter = openRedisRateLimiter({
      url: `redis://127.0.0.1:${port}`,
      fallback: new MemoryRateLimiter(systemClock),
      logger,
      commandTimeoutMs: COMMAND_TIMEOUT_MS,
    });
    try {
      const calls = await Promise.all(Array.from({ length: 10 }, () => timedConsume(limiter, "org", 100)));
      for (let i = 0; i < 10; i++) calls.push(await timedConsume(limiter, "org", 100));
      for (const c of calls) assert.ok(c.inTime, `a call took ${c.ms.toFixed(0)} ms`);
      assert.ok(calls.every((c) => c.d.allowed));
      assert.equal(limiter.mode(), "fallback");
      assert.equal(logger.warns.length, 1);
    } finally {
      await limiter.close();
      for (const s of sockets) s.destroy();
      server.close();
    }
  });
});

describe("RedisRateLimiter outage and recovery (throwaway redis-server)", { skip: SKIP }, () => {
  let dir: string;
  let port: number;
  let server: ChildProcess | undefined;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "tds-redis-"));
    port = await freePort();
    server = await startRedisServer(port, dir);
  });
  after(async () => {
    await stopRedisServer(server);
    rmSync(dir, { recursive: true, force: true });
  });

  test("killed: the fallback answers at once with one warn; restarted: back to Redis by itself, one info", async () => {
    const logger = new RecordingLogger();
    const modes: RateLimiterMode[] = [];
    const limiter = openRedisRateLimiter({
      url: `redis://127.0.0.1:${port}`,
      keyPrefix: uniquePrefix(),
      fallback: new MemoryRateLimiter(systemClock),
      logger,
      commandTimeoutMs: COMMAND_TIMEOUT_MS,
      onModeChange: (m) => modes.push(m),
    });
    try {
      // Redis answers (the first call waits for the connection, within the timeout).
      for (let i = 0; i < 3; i++) assert.equal((await limiter.consume("org", 3)).allowed, true);
      const refused = await limiter.consume("org", 3);
      assert.equal(refused.allowed, false);
      assert.equal(limiter.mode(), "redis");

      await stopRedisServer(server);
      const down = [];
      for (let i = 0; i < 10; i++) {
        down.push(await timedConsume(limiter, "org", 3));
        await sleep(30);
      }
      for (const c of down) assert.ok(c.inTime, `a call took ${c.ms.toFixed(0)} ms while Redis was down`);
      assert.equal(limiter.mode(), "fallback");
      assert.equal(down.filter((c) => c.d.allowed).length, 3, "the local limiter allows its own 3, then refuses");
      assert.equal(logger.warns.length, 1);

      server = await startRedisServer(port, dir);
      // Reconnects back off up to maxReconnectDelayMs: a bound against hanging, not a claim about speed.
      await waitFor("back to Redis after the restart", () => limiter.mode() === "redis", 60_000);
      assert.deepEqual(modes, ["fallback", "redis"]);
      assert.equal(logger.warns.length, 1);
      assert.equal(logger.infos.length, 1, "one info on recovery");
      // The restarted Redis is empty: 2 left there, while the exhausted fallback would refuse.
      assert.deepEqual(await limiter.consume("org", 3), { allowed: true, retryAfterMs: 0, remaining: 2 });
    } finally {
      await limiter.close();
    }
  });

  test("a paused server (connected, not answering): bounded calls, fallback, and back when it answers", async () => {
    const logger = new RecordingLogger();
    const modes: RateLimiterMode[] = [];
    const prefix = uniquePrefix();
    const limiter = openRedisRateLimiter({
      url: `redis://127.0.0.1:${port}`,
      keyPrefix: prefix,
      fallback: new MemoryRateLimiter(systemClock),
      logger,
      commandTimeoutMs: COMMAND_TIMEOUT_MS,
      onModeChange: (m) => modes.push(m),
    });
    const admin = new Redis(`redis://127.0.0.1:${port}`);
    try {
      assert.equal((await limiter.consume("org", 50)).allowed, true);
      // Paused until the test ends it: writes (the limiter's script) wait, CLIENT UNPAUSE does not.
      await admin.client("PAUSE", 600_000, "WRITE");
      const calls = await Promise.all(Array.from({ length: 10 }, () => timedConsume(limiter, "org", 50)));
      for (let i = 0; i < 10; i++) {
        // In fallback, one check at a time tries the (still connected) Redis and waits for its timeout; the rest
        // are answered at once, by the local limiter alone, before any timer can fire.
        const batch = await Promise.all(Array.from({ length: 5 }, () => timedConsume(limiter, "org", 50, COMMAND_TIMEOUT_MS / 2)));
        assert.ok(batch.filter((c) => !c.inTime).length <= 1, `batch took ${batch.map((c) => c.ms.toFixed(0))} ms`);
        calls.push(...batch);
        await sleep(20);
      }
      for (const c of calls.slice(0, 10)) assert.ok(c.inTime, `a call took ${c.ms.toFixed(0)} ms`);
      assert.equal(limiter.mode(), "fallback");
      assert.equal(logger.warns.length, 1);

      await admin.client("UNPAUSE");
      // The connection never dropped, so no reconnect: the checks themselves keep trying Redis,
      // one at a time, and the first one Redis answers switches back.
      let d: RateDecision | undefined;
      for (let i = 0; i < 1000 && limiter.mode() !== "redis"; i++) {
        d = await limiter.consume("org", 50);
        await sleep(20);
      }
      assert.equal(limiter.mode(), "redis");
      assert.deepEqual(modes, ["fallback", "redis"]);
      assert.equal(logger.infos.length, 1);
      assert.equal(d?.allowed, true);
    } finally {
      await limiter.close();
      admin.disconnect();
    }
  });
});
