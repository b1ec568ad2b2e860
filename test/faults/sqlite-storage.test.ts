/**
 * SQLite storage failures under a running gateway: the database locked by another connection's writer
 * (BEGIN IMMEDIATE) before the request or while the model works, and the disk filling up — a real full
 * disk: the database lives on a small tmpfs mounted for the test (needs root; without it the same
 * scenarios run with the store throwing better-sqlite3's own SQLITE_FULL error). Each: 503 with the
 * storage detail, nothing charged, no money lost, the books balance, exactly one final record per accepted
 * request, and the gateway recovers. (test/http/storage-failures.test.ts covers a paid request arriving while
 * the database is locked, and a lock held by another process while health checks run.)
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { closeSync, mkdtempSync, openSync, rmdirSync, rmSync, statfsSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import Database from "better-sqlite3";
import { utcDay } from "../../src/domain/utc-day.ts";
import type { ModelService } from "../../src/models/model-service.ts";
import { openSystemOneHttpService } from "../../src/models/systemone-http/systemone-http-service.ts";
import { Metrics } from "../../src/observability/metrics.ts";
import type { SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { allUsage, assertLedgerMatches, eventually } from "../support/books.ts";
import { errorBody, json } from "../support/contract-check.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { GENEROUS_MODEL_TIMEOUT_MS } from "../support/model-deadlines.ts";
import { byteBound } from "../support/token-bound.ts";

const PAID = {
  TDS_SERVICE_MODE: "paid",
  TDS_PRICE_PER_MILLION_INPUT_USD: "1",
  TDS_RESERVATION_TTL_SECONDS: "60",
  TDS_MODEL_TIMEOUT_MS: "5000",
};
const GRANT = 50_000;
/** What a paid sampleRequest() reserves at 1 USD per million input tokens: its token bound in microUSD. */
const RESERVED = byteBound(sampleRequest());
/** How long a durable step waits for the lock in these tests (the default is 2 s; the outcome is the same, sooner). */
const STORAGE_WAIT_MS = 300;

const sqliteOf = (store: Store) => (store as SqliteStore).db;

/** A model service that runs `during` inside the model call (after admission, before completion). */
function modelWith(upstream: ModelService, during: () => void | Promise<void>): ModelService {
  return {
    listModels: (o) => upstream.listModels(o),
    decide: async (call, o) => {
      const answer = await upstream.decide(call, o);
      await during();
      return answer;
    },
    close: async () => {},
  };
}

/** Metrics that tell when a commit of at least `steps` durable steps failed: that many steps are waiting for storage. */
class FailedCommits extends Metrics {
  #waiting: Array<{ steps: number; seen: () => void }> = [];

  override storeCommitted(steps: number, seconds: number, ok: boolean): void {
    super.storeCommitted(steps, seconds, ok);
    if (ok) return;
    for (const w of this.#waiting.filter((w) => steps >= w.steps)) w.seen();
    this.#waiting = this.#waiting.filter((w) => steps < w.steps);
  }

  of(steps: number): Promise<void> {
    return new Promise((seen) => this.#waiting.push({ steps, seen }));
  }
}

async function expect503(res: Response): Promise<void> {
  const body = await errorBody(res, 503);
  assert.match(body.detail, /Storage is temporarily unavailable/);
}

describe("database locked by another connection's writer", { timeout: 30_000 }, () => {
  let fake: FakeModelServer;
  let upstream: ModelService;
  before(async () => {
    fake = await startFakeModelServer();
    upstream = openSystemOneHttpService({ baseUrl: fake.url });
  });
  after(async () => {
    await upstream.close();
    await fake.close();
  });

  /** A gateway whose model call optionally takes the lock (`lockDuringCall`), with a second connection as the intruder. */
  async function lockedGateway(
    env: Record<string, string>,
    clock: FixedClock,
    options: { storageWaitMs?: number; metrics?: Metrics } = {},
  ) {
    const state = { lockDuringCall: false, intruder: null as Database.Database | null };
    const gw = await startGateway({
      clock,
      storageWaitMs: options.storageWaitMs ?? STORAGE_WAIT_MS,
      ...(options.metrics ? { metrics: options.metrics } : {}),
      modelService: modelWith(upstream, () => {
        if (state.lockDuringCall) state.intruder!.exec("BEGIN IMMEDIATE");
      }),
      env,
    });
    const intruder = new Database((gw.store as SqliteStore).path);
    intruder.pragma("busy_timeout = 0");
    state.intruder = intruder;
    return {
      gw,
      state,
      intruder,
      unlock: () => {
        if (intruder.inTransaction) intruder.exec("ROLLBACK");
      },
      close: async () => {
        intruder.close();
        await gw.close();
      },
    };
  }

  test("preview: locked before the request → 503 after the wait, no quota consumed, no model call, nothing recorded; recovers", async () => {
    const clock = new FixedClock(Date.now());
    const t = await lockedGateway({ TDS_MODEL_TIMEOUT_MS: "5000" }, clock);
    try {
      assert.equal((await t.gw.decide(sampleRequest())).status, 200, "warm: the model list is cached");
      const calls = fake.calls.decide;
      const day = utcDay(clock.nowMs());
      t.intruder.exec("BEGIN IMMEDIATE");
      const started = performance.now();
      await expect503(await t.gw.decide(sampleRequest({ state: { n: 1 } })));
      const waited = performance.now() - started;
      // Not at once (a lower bound: a timer never fires early), and not when the lock went: it is released only below.
      assert.ok(waited >= STORAGE_WAIT_MS - 5, `answered after the storage wait, not at once: ${waited} ms`);
      t.unlock();
      assert.equal(fake.calls.decide, calls, "no model call");
      assert.deepEqual(await t.gw.store.previewUsage(t.gw.orgId, day), { org: 1, global: 1 }, "the day counters did not move");
      assert.equal((await allUsage(t.gw.store, t.gw.orgId)).length, 1);
      assert.equal((await t.gw.decide(sampleRequest({ state: { n: 2 } }))).status, 200, "recovers once the lock is gone");
      assert.deepEqual(await t.gw.store.previewUsage(t.gw.orgId, day), { org: 2, global: 2 });
    } finally {
      await t.close();
    }
  });

  test("a lock held for less than the wait: the requests wait for it without failing", async () => {
    const clock = new FixedClock(Date.now());
    // The lock goes once all 8 admissions are seen waiting for it (a commit of the 8 failed as busy), within a wait no
    // busy machine outlasts: the order is the test's, not two timers'.
    const failed = new FailedCommits();
    const t = await lockedGateway({ TDS_MODEL_TIMEOUT_MS: GENEROUS_MODEL_TIMEOUT_MS }, clock, { storageWaitMs: 20_000, metrics: failed });
    try {
      const calls = fake.calls.decide;
      t.intruder.exec("BEGIN IMMEDIATE");
      const allWaiting = failed.of(8);
      const answers = Promise.all(Array.from({ length: 8 }, (_, i) => t.gw.decide(sampleRequest({ state: { i } })).then((r) => r.status)));
      await allWaiting;
      assert.equal(fake.calls.decide, calls, "no request went past admission while the lock was held");
      t.unlock();
      assert.deepEqual(await answers, Array(8).fill(200));
      assert.equal((await allUsage(t.gw.store, t.gw.orgId)).filter((r) => r.outcome === "succeeded").length, 8);
    } finally {
      await t.close();
    }
  });

  test("paid + Idempotency-Key: locked while the model works → 503, then completed in the background with nothing charged; the retry is charged once", async () => {
    const clock = new FixedClock(Date.now());
    const t = await lockedGateway(PAID, clock);
    try {
      await t.gw.store.grantCredits({ orgId: t.gw.orgId, amountMicrousd: GRANT, nowMs: clock.nowMs() });
      const key = { "idempotency-key": "order-42" };
      t.state.lockDuringCall = true;
      const first = await t.gw.decide(sampleRequest(), key);
      await expect503(first);
      t.state.lockDuringCall = false;
      const firstId = first.headers.get("x-service-request-id")!;
      t.unlock();
      await eventually(
        "the first attempt is completed in the background",
        async () => (await t.gw.store.getUsage(t.gw.orgId, firstId))?.outcome !== "in_flight",
      );
      const failed = await t.gw.store.getUsage(t.gw.orgId, firstId);
      assert.deepEqual([failed?.outcome, failed?.httpStatus, failed?.costMicrousd], ["gateway_error", 503, 0]);
      assert.equal((await t.gw.store.getReservation(firstId))?.status, "released");
      assert.deepEqual(
        await assertLedgerMatches(t.gw.store, t.gw.orgId),
        { available: GRANT, reserved: 0, spent: 0, granted: GRANT },
        "nothing charged",
      );

      const retry = await t.gw.decide(sampleRequest(), key);
      const body = await json(retry);
      assert.equal(retry.status, 200, JSON.stringify(body));
      assert.notEqual(body.request_id, firstId, "the retry ran anew");
      const replay = await t.gw.decide(sampleRequest(), key);
      assert.equal(replay.status, 200);
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.equal(await replay.text(), JSON.stringify(body));
      const cost = body.usage.cost_microusd as number;
      assert.deepEqual(
        await assertLedgerMatches(t.gw.store, t.gw.orgId),
        { available: GRANT - cost, reserved: 0, spent: cost, granted: GRANT },
        "charged once",
      );
      const records = await allUsage(t.gw.store, t.gw.orgId);
      assert.deepEqual(records.map((r) => r.outcome).sort(), ["gateway_error", "succeeded"], "one final record per accepted request");
    } finally {
      await t.close();
    }
  });

  test("preview: locked while the model works → 503; once unlocked, exactly one final record and one quota unit", async () => {
    const clock = new FixedClock(Date.now());
    const t = await lockedGateway({ TDS_MODEL_TIMEOUT_MS: "5000" }, clock);
    try {
      const day = utcDay(clock.nowMs());
      t.state.lockDuringCall = true;
      const res = await t.gw.decide(sampleRequest());
      await expect503(res);
      t.state.lockDuringCall = false;
      const requestId = res.headers.get("x-service-request-id")!;
      assert.equal((await t.gw.store.getUsage(t.gw.orgId, requestId))?.outcome, "in_flight", "admitted: recorded in flight");
      t.unlock();
      await eventually(
        "completed in the background",
        async () => (await t.gw.store.getUsage(t.gw.orgId, requestId))?.outcome === "gateway_error",
      );
      assert.deepEqual(
        await t.gw.store.previewUsage(t.gw.orgId, day),
        { org: 1, global: 1 },
        "accepted, so it counts (once), with its record",
      );
      assert.equal((await allUsage(t.gw.store, t.gw.orgId)).length, 1);
      assert.equal((await t.gw.decide(sampleRequest({ state: { n: 2 } }))).status, 200);
      assert.deepEqual(await t.gw.store.previewUsage(t.gw.orgId, day), { org: 2, global: 2 });
    } finally {
      await t.close();
    }
  });

  test("paid: locked until past the reservation's expiry → the sweep completes it, nothing charged, one final record", async () => {
    const clock = new FixedClock(Date.now());
    const t = await lockedGateway(PAID, clock);
    try {
      await t.gw.store.grantCredits({ orgId: t.gw.orgId, amountMicrousd: GRANT, nowMs: clock.nowMs() });
      t.state.lockDuringCall = true;
      const res = await t.gw.decide(sampleRequest());
      await expect503(res);
      t.state.lockDuringCall = false;
      const requestId = res.headers.get("x-service-request-id")!;
      // While the lock is held nothing can complete it (after a crash it would stay like this too).
      await sleep(STORAGE_WAIT_MS);
      assert.deepEqual(
        await assertLedgerMatches(t.gw.store, t.gw.orgId),
        { available: GRANT - RESERVED, reserved: RESERVED, spent: 0, granted: GRANT },
        "reserved, not charged",
      );
      clock.advance(61_000);
      t.unlock();
      await eventually("completed (by the background completion or the sweep)", async () => {
        await t.gw.app.sweepBooks();
        return (await t.gw.store.getUsage(t.gw.orgId, requestId))?.outcome !== "in_flight";
      });
      assert.deepEqual(await assertLedgerMatches(t.gw.store, t.gw.orgId), { available: GRANT, reserved: 0, spent: 0, granted: GRANT });
      assert.notEqual((await t.gw.store.getReservation(requestId))?.status, "pending");
      assert.deepEqual(
        (await allUsage(t.gw.store, t.gw.orgId)).map((r) => r.outcome),
        ["gateway_error"],
      );
    } finally {
      await t.close();
    }
  });
});

// ── disk full ─────────────────────────────────────────────────────────────────────────────────

interface SmallDisk {
  dir: string;
  /** Writes a filler file until the file system is full (ENOSPC). */
  fill(): void;
  /** Deletes the filler. */
  free(): void;
  unmount(): void;
}

/** A tmpfs of `bytes` mounted on a fresh temp dir; null when mounting is not permitted (not root, no tmpfs). */
function mountSmallDisk(bytes: number): SmallDisk | null {
  const dir = mkdtempSync(join(tmpdir(), "tds-full-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${bytes}`, "tmpfs", dir], { stdio: "ignore" });
  } catch {
    rmdirSync(dir);
    return null;
  }
  const filler = join(dir, "filler");
  return {
    dir,
    fill() {
      const fd = openSync(filler, "a");
      try {
        for (const size of [256 * 1024, 4096, 512, 1]) {
          const chunk = Buffer.alloc(size, 1);
          try {
            for (;;) writeSync(fd, chunk);
          } catch (err) {
            if ((err as NodeJS.ErrnoException).code !== "ENOSPC") throw err;
          }
        }
      } finally {
        closeSync(fd);
      }
      assert.equal(statfsSync(dir).bavail, 0, "the file system is full");
    },
    free() {
      rmSync(filler, { force: true });
    },
    unmount() {
      execFileSync("umount", ["-l", dir], { stdio: "ignore" });
      rmdirSync(dir);
    },
  };
}

/** TDS_TEST_SIMULATE_DISK_FULL=1 runs the simulated variant even where mounting works. */
const disk = process.env.TDS_TEST_SIMULATE_DISK_FULL === "1" ? null : mountSmallDisk(8 * 1024 * 1024);

describe(`disk full (${disk ? "a real full tmpfs under the database" : "simulated: the store throws SQLITE_FULL"})`, {
  timeout: 30_000,
}, () => {
  let fake: FakeModelServer;
  let upstream: ModelService;
  before(async () => {
    fake = await startFakeModelServer();
    upstream = openSystemOneHttpService({ baseUrl: fake.url });
  });
  after(async () => {
    await upstream.close();
    await fake.close();
    disk?.unmount();
  });

  /**
   * The disk "fills": for real, the WAL is checkpointed and truncated (so the next commit needs new blocks)
   * and the rest of the tmpfs is taken by a filler file; simulated, every write method of the store throws
   * better-sqlite3's SqliteError with code SQLITE_FULL until freed.
   */
  function diskFor(gw: Gateway): { fill(): void; free(): void } {
    if (disk) {
      return {
        fill: () => {
          sqliteOf(gw.store).pragma("wal_checkpoint(TRUNCATE)");
          disk.fill();
        },
        free: () => disk.free(),
      };
    }
    const store = gw.store as unknown as Record<string, unknown>;
    const writes = ["grantCredits", "commitBatch", "sweep", "purge"];
    return {
      fill: () => {
        for (const name of writes) {
          store[name] = async () => {
            throw new Database.SqliteError("database or disk is full", "SQLITE_FULL");
          };
        }
      },
      free: () => {
        for (const name of writes) delete store[name];
      },
    };
  }

  let n = 0;
  async function gatewayOnSmallDisk(env: Record<string, string>, clock: FixedClock, during: () => void = () => {}) {
    const file = disk ? join(disk.dir, `tds-${++n}.sqlite`) : null;
    const gw = await startGateway({
      clock,
      modelService: modelWith(upstream, during),
      env: { ...env, ...(file ? { TDS_DATABASE_URL: `sqlite:${file}` } : {}) },
    });
    return gw;
  }

  test("paid: full before the request → 503, no model call, nothing charged or recorded; recovers when space is freed", async () => {
    const clock = new FixedClock(Date.now());
    const gw = await gatewayOnSmallDisk(PAID, clock);
    const full = diskFor(gw);
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: GRANT, nowMs: clock.nowMs() });
      const warm = await json(await gw.decide(sampleRequest()));
      const spent = warm.usage.cost_microusd as number;
      const calls = fake.calls.decide;
      full.fill();
      try {
        for (let i = 0; i < 3; i++) await expect503(await gw.decide(sampleRequest({ state: { i } })));
        // What the store saw: SQLite's own "disk full" (ENOSPC → SQLITE_FULL), not some other failure.
        await assert.rejects(
          gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 1, nowMs: clock.nowMs() }),
          (err: Error & { code?: string }) => {
            assert.equal(err.code, "SQLITE_FULL", String(err));
            return true;
          },
        );
      } finally {
        full.free();
      }
      assert.equal(fake.calls.decide, calls, "no model call without a reservation");
      assert.deepEqual(await assertLedgerMatches(gw.store, gw.orgId), { available: GRANT - spent, reserved: 0, spent, granted: GRANT });
      assert.equal((await allUsage(gw.store, gw.orgId)).length, 1);
      const ok = await gw.decide(sampleRequest({ state: { after: true } }));
      const body = await json(ok);
      assert.equal(ok.status, 200, JSON.stringify(body));
      const total = spent + (body.usage.cost_microusd as number);
      assert.deepEqual(await assertLedgerMatches(gw.store, gw.orgId), {
        available: GRANT - total,
        reserved: 0,
        spent: total,
        granted: GRANT,
      });
    } finally {
      full.free();
      await gw.close();
    }
  });

  test("paid: the disk fills while the model works → completion fails, 503, nothing charged; the sweep completes it once freed", async () => {
    const clock = new FixedClock(Date.now());
    let fillNow: (() => void) | null = null;
    const gw = await gatewayOnSmallDisk(PAID, clock, () => fillNow?.());
    const full = diskFor(gw);
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: GRANT, nowMs: clock.nowMs() });
      fillNow = () => full.fill();
      let res: Response;
      try {
        res = await gw.decide(sampleRequest());
        await expect503(res);
      } finally {
        fillNow = null;
        full.free();
      }
      const requestId = res.headers.get("x-service-request-id")!;
      assert.deepEqual(
        await assertLedgerMatches(gw.store, gw.orgId),
        { available: GRANT - RESERVED, reserved: RESERVED, spent: 0, granted: GRANT },
        "reserved, not charged",
      );
      assert.equal(
        (await gw.store.getUsage(gw.orgId, requestId))?.outcome,
        "in_flight",
        "the background completion failed too (disk full)",
      );
      clock.advance(61_000);
      assert.deepEqual(await gw.app.sweepBooks(), { abandoned: 1 });
      assert.deepEqual(await assertLedgerMatches(gw.store, gw.orgId), { available: GRANT, reserved: 0, spent: 0, granted: GRANT });
      assert.equal((await gw.store.getReservation(requestId))?.status, "expired");
      assert.deepEqual(
        (await allUsage(gw.store, gw.orgId)).map((r) => r.outcome),
        ["gateway_error"],
      );
      const ok = await gw.decide(sampleRequest({ state: { after: true } }));
      assert.equal(ok.status, 200, await ok.text());
    } finally {
      full.free();
      await gw.close();
    }
  });

  test("preview: full before the request → 503, the day counters do not move; recovers", async () => {
    const clock = new FixedClock(Date.now());
    const gw = await gatewayOnSmallDisk({ TDS_MODEL_TIMEOUT_MS: "5000" }, clock);
    const full = diskFor(gw);
    try {
      const day = utcDay(clock.nowMs());
      assert.equal((await gw.decide(sampleRequest())).status, 200);
      full.fill();
      try {
        await expect503(await gw.decide(sampleRequest({ state: { i: 1 } })));
      } finally {
        full.free();
      }
      assert.deepEqual(await gw.store.previewUsage(gw.orgId, day), { org: 1, global: 1 });
      assert.equal((await allUsage(gw.store, gw.orgId)).length, 1);
      assert.equal((await gw.decide(sampleRequest({ state: { i: 2 } }))).status, 200);
      assert.deepEqual(await gw.store.previewUsage(gw.orgId, day), { org: 2, global: 2 });
    } finally {
      full.free();
      await gw.close();
    }
  });
});
