/**
 * Gateway processes killed with `kill -9` while paid requests are in flight (the fake model server holds their
 * answers), then a new process on the same database. What the dead process left is resolved at once, not after the
 * reservation TTL (a day here, so the TTL sweep cannot be what resolves it): each of its requests is completed as
 * gateway_error with nothing charged and its reservation released — exactly once — and a retry with the dead
 * request's Idempotency-Key runs. Afterwards the books are exact: the ledger sums to each balance, the daily roll-up
 * equals the records, every reservation is resolved once.
 *
 * SQLite (one process serves the file): the next process releases everything from before its start, before it
 * listens. PostgreSQL, two instances: the survivor releases the dead one's work once its lease has ended; a process
 * started after the last one died releases it at start. Skipped on PostgreSQL with TDS_SKIP_POSTGRES=1.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import type { UsageRecord } from "../../src/domain/usage-records.ts";
import { ORPHANED_DETAIL } from "../../src/store/bookkeeping/programs.ts";
import { openStore } from "../../src/store/open-store.ts";
import type { Store } from "../../src/store/store.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { allUsage, assertLedgerMatches } from "../support/books.ts";
import { sampleRequest } from "../support/gateway-harness.ts";
import { type GatewayProcess, startGatewayProcess } from "../support/gateway-process.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { assertRollUpExact, reservationStatuses, rowsOf } from "../support/roll-up.ts";

const GRANT = 50_000_000;
const RELEASED_LINE = "completed requests left in flight by stopped gateway processes";
/** Paid, with a reservation TTL of a day: only the crash recovery can resolve what a dead process left. */
const PAID = {
  TDS_SERVICE_MODE: "paid",
  TDS_PRICE_PER_MILLION_INPUT_USD: "1",
  TDS_RESERVATION_TTL_SECONDS: "86400",
};

interface Setup {
  store: Store;
  orgId: string;
  key: string;
}

async function setUp(store: Store): Promise<Setup> {
  const org = await store.createOrganization({ id: newOrganizationId(), name: "crash-org", nowMs: Date.now() });
  const key = generateApiKey();
  await store.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: Date.now() });
  await store.grantCredits({ orgId: org.id, amountMicrousd: GRANT, nowMs: Date.now() });
  return { store, orgId: org.id, key: key.raw };
}

async function post(gw: GatewayProcess, s: Setup, body: unknown, idempotencyKey?: string) {
  const res = await fetch(`${gw.url}/v1/systemone`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${s.key}`,
      "content-type": "application/json",
      ...(idempotencyKey ? { "idempotency-key": idempotencyKey } : {}),
    },
    body: JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

async function waitFor(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 30_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const inFlight = async (s: Setup) => (await allUsage(s.store, s.orgId)).filter((r) => r.outcome === "in_flight");

/** Sends requests the fake model server holds, and waits until all of them are admitted and at the model. */
async function holdRequests(fake: FakeModelServer, gw: GatewayProcess, s: Setup, requests: { body: unknown; key?: string }[]) {
  const before = fake.received.length;
  const held = (await inFlight(s)).length;
  fake.setBehavior("hang");
  // Their connections break when the process is killed.
  for (const r of requests) void post(gw, s, r.body, r.key).catch(() => null);
  await waitFor(
    "the held requests to reach the model",
    async () => fake.received.length >= before + requests.length && (await inFlight(s)).length === held + requests.length,
  );
}

const running = (gw: GatewayProcess) => gw.child.exitCode === null && gw.child.signalCode === null;

async function kill(gw: GatewayProcess): Promise<void> {
  if (!running(gw)) return;
  const exited = new Promise((r) => gw.child.once("exit", r));
  gw.child.kill("SIGKILL");
  await exited;
}

/** The records released as their process stopped: failed, nothing charged, their reservations released. */
async function assertReleased(s: Setup, records: UsageRecord[]): Promise<void> {
  for (const r of records) {
    const now = await s.store.getUsage(s.orgId, r.requestId);
    assert.deepEqual(
      [now?.outcome, now?.httpStatus, now?.costMicrousd, now?.errorDetail],
      ["gateway_error", null, 0, ORPHANED_DETAIL],
      r.requestId,
    );
    assert.equal((await s.store.getReservation(r.requestId))?.status, "released", r.requestId);
  }
}

const logged = (gw: GatewayProcess, msg: string) =>
  gw.lines.flatMap((line) => {
    try {
      const entry = JSON.parse(line) as { msg?: string; released?: number };
      return entry.msg?.startsWith(msg) ? [entry] : [];
    } catch {
      return [];
    }
  });

/** The retry of a dead request's Idempotency-Key runs, and is what the key replays from then on. */
async function assertRetryRuns(gw: GatewayProcess, s: Setup, body: unknown, key: string): Promise<void> {
  const retry = await post(gw, s, body, key);
  assert.equal(retry.status, 200, retry.text);
  assert.equal(retry.headers.get("idempotent-replayed"), null, "it ran");
  const replay = await post(gw, s, body, key);
  assert.equal(replay.status, 200);
  assert.equal(replay.headers.get("idempotent-replayed"), "true");
  assert.equal(replay.text, retry.text);
}

/** The books after recovery: nothing in flight or reserved, the ledger and the roll-up exact, each reservation resolved once. */
async function assertExact(s: Setup, expected: Record<string, number>): Promise<void> {
  const records = await allUsage(s.store, s.orgId);
  assert.deepEqual(
    records.filter((r) => r.outcome === "in_flight"),
    [],
  );
  const balance = await assertLedgerMatches(s.store, s.orgId);
  const spent = records.reduce((sum, r) => sum + r.costMicrousd, 0);
  assert.deepEqual(balance, { available: GRANT - spent, reserved: 0, spent, granted: GRANT });
  assert.deepEqual(await reservationStatuses(s.store), expected);
  const rolled = await assertRollUpExact(s.store);
  assert.equal(
    rolled.reduce((n, r) => n + (r.failed as number), 0),
    records.filter((r) => r.outcome !== "succeeded").length,
  );
}

describe("a gateway process killed with requests in flight", { timeout: 180_000 }, () => {
  test("SQLite: the next process on the file releases them at start, before it listens; the retry of a dead key runs", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-crash-"));
    const url = `sqlite:${join(dir, "tds.sqlite")}`;
    const fake = await startFakeModelServer();
    fake.setModelsBehavior("ok");
    const s = await setUp(await openStore(url));
    const gateways: GatewayProcess[] = [];
    try {
      const env = { ...PAID, TDS_DATABASE_URL: url, TDS_MODEL_SERVICE_URL: fake.url };
      const first = await startGatewayProcess(env);
      gateways.push(first);
      const keyed = sampleRequest({ state: { tag: randomBytes(4).toString("hex") } });
      await holdRequests(fake, first, s, [{ body: keyed, key: "order-1" }, { body: sampleRequest({ state: { other: 1 } }) }]);
      const left = await inFlight(s);
      await kill(first);
      assert.equal((await s.store.getBalance(s.orgId)).reserved > 0, true, "the dead process's reservations are still held");

      fake.setBehavior(null);
      const second = await startGatewayProcess(env);
      gateways.push(second);
      // As soon as it listens, before any timed sweep: released.
      await assertReleased(s, left);
      assert.deepEqual(await s.store.getBalance(s.orgId), { available: GRANT, reserved: 0, spent: 0, granted: GRANT });
      const releasedAt = second.lines.findIndex((l) => l.includes(RELEASED_LINE));
      const listening = second.lines.findIndex((l) => l.includes("Server listening"));
      assert.ok(releasedAt >= 0 && releasedAt < listening, "released at start, logged before listening");
      assert.deepEqual(
        logged(second, RELEASED_LINE).map((e) => e.released),
        [2],
      );

      await assertRetryRuns(second, s, keyed, "order-1");
      await assertExact(s, { released: 2, settled: 1 });
    } finally {
      for (const gw of gateways.filter(running)) await gw.stop();
      await s.store.close();
      await fake.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("PostgreSQL, two instances: the survivor releases the dead one's work once its lease ended; a new process, at start", {
    skip: process.env.TDS_SKIP_POSTGRES === "1" ? "TDS_SKIP_POSTGRES=1" : false,
  }, async (t) => {
    const db = await createTestDatabase("tds_crash");
    const fake = await startFakeModelServer();
    fake.setModelsBehavior("ok");
    const s = await setUp(await openStore(db.url));
    const gateways: GatewayProcess[] = [];
    const leaseOf = async (instanceId: string) =>
      (await rowsOf(s.store, "SELECT lease_until_ms FROM gateway_instances WHERE id = $1", [instanceId]))[0]?.lease_until_ms as number;
    const instanceOf = async (requestId: string) =>
      (await rowsOf(s.store, "SELECT instance_id FROM usage_records WHERE request_id = $1", [requestId]))[0]?.instance_id as string;
    try {
      const env = { ...PAID, TDS_DATABASE_URL: db.url, TDS_MODEL_SERVICE_URL: fake.url };
      const [a, b] = await Promise.all([startGatewayProcess(env), startGatewayProcess(env)]);
      gateways.push(a!, b!);

      // A dies with two requests in flight; B lives on.
      const keyed = sampleRequest({ state: { tag: randomBytes(4).toString("hex") } });
      await holdRequests(fake, a!, s, [{ body: keyed, key: "order-a" }, { body: sampleRequest({ state: { other: 1 } }) }]);
      const leftByA = await inFlight(s);
      const instanceA = await instanceOf(leftByA[0]!.requestId);
      await kill(a!);
      fake.setBehavior(null);
      const early = await post(b!, s, keyed, "order-a");
      if (early.status === 409) {
        // A's lease has not ended yet: B cannot know A is gone, and says when to retry.
        assert.match(JSON.parse(early.text).detail, /still being processed by another gateway process/);
        assert.ok(Number(early.headers.get("retry-after")) >= 1, "Retry-After until A's lease ends");
      } else {
        assert.equal(early.status, 200, early.text);
      }
      const killedAt = Date.now();
      await waitFor("B to release A's requests", async () => (await inFlight(s)).length === 0, 60_000);
      t.diagnostic(`early retry on B: ${early.status}; A's requests released ${Date.now() - killedAt} ms after the kill`);
      await assertReleased(s, leftByA);
      const leaseA = await leaseOf(instanceA);
      for (const r of leftByA) {
        const completedAt = (await s.store.getUsage(s.orgId, r.requestId))?.completedAtMs ?? 0;
        assert.ok(completedAt >= leaseA, "released only once A's lease had ended");
      }
      assert.ok(logged(b!, RELEASED_LINE).length > 0, "B logged it");
      if (early.status === 409) await assertRetryRuns(b!, s, keyed, "order-a");

      // B dies too, with one request in flight; nobody is left to release it until a new process starts.
      const keyedB = sampleRequest({ state: { tag: randomBytes(4).toString("hex") } });
      await holdRequests(fake, b!, s, [{ body: keyedB, key: "order-b" }]);
      const leftByB = await inFlight(s);
      const leaseB = await leaseOf(await instanceOf(leftByB[0]!.requestId));
      await kill(b!);
      fake.setBehavior(null);
      await waitFor("B's lease to end", () => Date.now() > leaseB + 100, 30_000);
      assert.equal((await inFlight(s)).length, 1, "still in flight: no process is running");
      const c = await startGatewayProcess(env);
      gateways.push(c);
      await assertReleased(s, leftByB);
      assert.deepEqual(
        logged(c, RELEASED_LINE).map((e) => e.released),
        [1],
      );
      await assertRetryRuns(c, s, keyedB, "order-b");

      await assertExact(s, { released: 3, settled: 2 });
    } finally {
      for (const gw of gateways.filter(running)) await gw.stop();
      await s.store.close();
      await fake.close();
      await db.drop();
    }
  });
});
