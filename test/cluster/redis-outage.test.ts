import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { systemClock } from "../../src/domain/clock.ts";
import { MemoryRateLimiter } from "../../src/limits/memory-rate-limiter.ts";
import type { RateLimiter } from "../../src/limits/rate-limiter.ts";
import { openRedisRateLimiter } from "../../src/limits/redis-rate-limiter.ts";
import { DEFAULT_COMMAND_TIMEOUT_MS } from "../../src/limits/redis-sliding-log-limiter.ts";
import { Metrics } from "../../src/observability/metrics.ts";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { freePort, startRedisServer, stopRedisServer } from "../support/redis-server.ts";
import { settlesBefore } from "../support/timer-race.ts";

async function fallbackGauge(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith("tds_rate_limiter_fallback "));
  return Number(line?.split(" ")[1]);
}

describe("Redis stopped and started under a running gateway", () => {
  test("the local fallback engages (limited, not unlimited), shows in /metrics, and releases when Redis returns", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-redis-"));
    const port = await freePort();
    let redis: ChildProcess | undefined = await startRedisServer(port, dir);
    const metrics = new Metrics();
    const warnings: string[] = [];
    // What the fallback allowed, per key: on a busy machine a check may time out while Redis is up, and the fallback
    // then answers (and counts) it.
    const memory = new MemoryRateLimiter(systemClock);
    const allowedByFallback = new Map<string, number>();
    const fallback: RateLimiter = {
      async consume(key, limit) {
        const decision = await memory.consume(key, limit);
        if (decision.allowed) allowedByFallback.set(key, (allowedByFallback.get(key) ?? 0) + 1);
        return decision;
      },
      close: () => memory.close(),
    };
    let outages = 0;
    const limiter = openRedisRateLimiter({
      url: `redis://127.0.0.1:${port}`,
      fallback,
      logger: { warn: (_o, msg) => warnings.push(msg), info: () => {} },
      onModeChange: (mode) => {
        if (mode === "fallback") outages++;
        metrics.rateLimiterModeChanged(mode);
      },
    });
    // Every check the gateway makes, raced against a timer of 5 command timeouts started with it: the limiter's own
    // deadline timer is due first, so a check that loses waited for something else (a connection, a reconnect).
    const late: string[] = [];
    const watched: RateLimiter = {
      consume(key, limit) {
        const check = limiter.consume(key, limit);
        void settlesBefore(check, 5 * DEFAULT_COMMAND_TIMEOUT_MS).then((inTime) => {
          if (!inTime) late.push(`${key} in mode ${limiter.mode()}`);
        });
        return check;
      },
      close: () => limiter.close(),
    };
    const gw = await startGateway({ rateLimiter: watched, metrics, env: { TDS_REQUESTS_PER_MINUTE: "5" } });
    try {
      for (let i = 0; i < 2; i++) assert.equal((await gw.decide(sampleRequest())).status, 200);
      assert.equal(limiter.mode(), "redis");
      assert.equal(await fallbackGauge(gw.url), 0);

      const countedBefore = Math.max(0, ...allowedByFallback.values());
      await stopRedisServer(redis);
      redis = undefined;
      const statuses: number[] = [];
      for (let i = 0; i < 6; i++) statuses.push((await gw.decide(sampleRequest())).status);
      assert.deepEqual(late, [], "no check waits longer than the command timeout while Redis is down");
      const allowed = 5 - countedBefore;
      assert.deepEqual(
        statuses,
        [...Array(allowed).fill(200), ...Array(6 - allowed).fill(429)],
        `the fallback limits each instance to the same per-minute limit (${countedBefore} counted by it before Redis stopped)`,
      );
      assert.equal(limiter.mode(), "fallback");
      assert.equal(await fallbackGauge(gw.url), 1);
      assert.ok(outages >= 1);
      assert.equal(warnings.length, outages, "logged once per outage");

      redis = await startRedisServer(port, dir);
      // Reconnects back off (up to 2 s): a bound against hanging, not a claim about speed.
      const deadline = Date.now() + 60_000;
      while (limiter.mode() !== "redis" && Date.now() < deadline) {
        await (await gw.decide(sampleRequest())).text();
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.equal(limiter.mode(), "redis", "back on Redis without a restart");
      assert.equal(await fallbackGauge(gw.url), 0);
    } finally {
      await gw.close();
      await limiter.close();
      await stopRedisServer(redis);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
