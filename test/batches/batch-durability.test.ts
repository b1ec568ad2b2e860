/**
 * Batches survive their gateway process and share work across instances, with real gateway processes, the fake model
 * server in this process and real SQLite / PostgreSQL. A request cut short by a crash (kill -9) or a shutdown is run
 * again, never failed: every result is 200, one line per request in input order, and each request is charged once —
 * the balance, the ledger, the batch's cost and the usage records all equal the sum of the results' costs.
 *
 * Mid-run is an order the test makes, not a delay it hopes is long enough: the model answers the first requests,
 * then holds the following ones (the fake's "hang", or a gate in front of one instance) until the kill.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, type TestContext, test } from "node:test";
import pg from "pg";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import { openStore } from "../../src/store/open-store.ts";
import type { Store } from "../../src/store/store.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { allUsage, assertLedgerMatches } from "../support/books.ts";
import { type GatewayProcess, startGatewayProcess, waitUntilReady } from "../support/gateway-process.ts";
import { startModelGate } from "../support/model-gate.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { reservationStatuses, rowsOf } from "../support/roll-up.ts";
import {
  type BatchClient,
  batchLine,
  batchResults,
  getBatch,
  ndjson,
  type ResultLine,
  submitBatch,
  waitForBatch,
  waitForEnd,
} from "./batch-support.ts";

const GRANT = 500_000_000;
/**
 * Paid, with a reservation TTL of a day: only the crash recovery can resolve what a dead process left in flight. A
 * model call held by the test never times out on a busy machine.
 */
const PAID = {
  TDS_SERVICE_MODE: "paid",
  TDS_PRICE_PER_MILLION_INPUT_USD: "1",
  TDS_RESERVATION_TTL_SECONDS: "86400",
  TDS_MODEL_TIMEOUT_MS: "600000",
};
const SKIP_POSTGRES = process.env.TDS_SKIP_POSTGRES === "1" ? "TDS_SKIP_POSTGRES=1" : false;

interface Org {
  store: Store;
  orgId: string;
  key: string;
}

async function setUpOrg(store: Store): Promise<Org> {
  const org = await store.createOrganization({ id: newOrganizationId(), name: "batch-org", nowMs: Date.now() });
  const key = generateApiKey();
  await store.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: Date.now() });
  await store.grantCredits({ orgId: org.id, amountMicrousd: GRANT, nowMs: Date.now() });
  return { store, orgId: org.id, key: key.raw };
}

const client = (gw: GatewayProcess, org: Org): BatchClient => ({ url: gw.url, key: org.key });

const running = (gw: GatewayProcess) => gw.child.exitCode === null && gw.child.signalCode === null;

/** Ends the process with `signal` and waits for it to exit. */
async function endProcess(gw: GatewayProcess, signal: "SIGKILL" | "SIGTERM"): Promise<void> {
  if (!running(gw)) return;
  const exited = new Promise((r) => gw.child.once("exit", r));
  gw.child.kill(signal);
  await exited;
}

async function waitFor(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 60_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function submit(gw: BatchClient, count: number): Promise<string> {
  const res = await submitBatch(gw, ndjson(Array.from({ length: count }, (_, i) => batchLine(i))));
  const text = await res.text();
  assert.equal(res.status, 202, text);
  return (JSON.parse(text) as { id: string }).id;
}

/** How many calls of each ticket reached the model (`ticket i` → calls). */
function callsPerTicket(fake: FakeModelServer): Map<string, number> {
  const calls = new Map<string, number>();
  for (const call of fake.received) {
    const ticket = (call.state as { ticket?: unknown } | null)?.ticket;
    if (typeof ticket === "string") calls.set(ticket, (calls.get(ticket) ?? 0) + 1);
  }
  return calls;
}

/** Usage records completed by the crash recovery: gateway_error, nothing charged. */
async function releasedCount(org: Org): Promise<number> {
  const records = await allUsage(org.store, org.orgId);
  const released = records.filter((r) => r.outcome === "gateway_error");
  assert.ok(
    released.every((r) => r.costMicrousd === 0),
    "nothing charged for a released request",
  );
  return released.length;
}

const costOf = (line: ResultLine) => (line.body as { usage?: { cost_microusd?: number } }).usage?.cost_microusd ?? Number.NaN;

/** What a dead process left: the batch unfinished (read from the database) and the requests it had in flight. */
async function leftByCrash(org: Org, batchId: string): Promise<{ done: number; inFlight: number }> {
  const batch = await org.store.batches.getBatch(org.orgId, batchId);
  const records = await allUsage(org.store, org.orgId);
  return { done: (batch?.succeeded ?? 0) + (batch?.failed ?? 0), inFlight: records.filter((r) => r.outcome === "in_flight").length };
}

/**
 * The batch completed with every request answered 200, one result per request in input order, and each request
 * charged exactly once: its result's request id has the one succeeded usage record of that request, and the results'
 * costs sum to the batch's cost, to every batch usage record's cost (re-runs and released ones included) and to
 * the organization's spending, which the ledger sums to.
 */
async function assertExactlyOnce(gw: BatchClient, org: Org, batchId: string, count: number): Promise<ResultLine[]> {
  const batch = await waitForEnd(gw, batchId, 180_000);
  const results = await batchResults(gw, batchId);
  assert.equal(batch.status, "completed");
  assert.deepEqual(
    results.map((r) => r.custom_id),
    Array.from({ length: count }, (_, i) => `r${i}`),
    "one result per request, in input order",
  );
  const failed = results.filter((r) => r.status !== 200);
  assert.deepEqual(failed, [], "no request failed: those cut short were run again");
  const costs = results.map(costOf);
  assert.ok(
    costs.every((c) => Number.isSafeInteger(c) && c > 0),
    "every result is charged",
  );
  const total = costs.reduce((a, c) => a + c, 0);
  assert.deepEqual(batch.request_counts, { total: count, succeeded: count, failed: 0 });
  assert.equal(batch.cost_microusd, total, "the batch's cost is the sum of its results'");

  const records = await allUsage(org.store, org.orgId);
  assert.deepEqual(
    records.filter((r) => r.outcome === "in_flight"),
    [],
    "nothing left in flight",
  );
  assert.ok(
    records.every((r) => r.source === "batch"),
    "only batch requests ran",
  );
  const succeeded = new Map(records.filter((r) => r.outcome === "succeeded").map((r) => [r.requestId, r]));
  assert.equal(succeeded.size, count, "one succeeded usage record per request");
  results.forEach((line, i) => {
    const record = line.request_id === null ? undefined : succeeded.get(line.request_id);
    assert.ok(record, `${line.custom_id}: its request id ${line.request_id} has a succeeded usage record`);
    assert.equal(record.costMicrousd, costs[i], `${line.custom_id}: charged what its result says`);
  });
  assert.equal(
    records.reduce((a, r) => a + r.costMicrousd, 0),
    total,
    "no request charged twice",
  );
  const balance = await assertLedgerMatches(org.store, org.orgId);
  assert.deepEqual(balance, { available: GRANT - total, reserved: 0, spent: total, granted: GRANT });
  const reservations = await reservationStatuses(org.store);
  assert.equal(reservations.settled, count, "one settled reservation per request");
  assert.equal(reservations.pending, undefined);
  return results;
}

/** Every ticket reached the model at least once, and at most twice (a run cut short, then its re-run). */
function assertEveryTicketRan(t: TestContext, fake: FakeModelServer, count: number, cut: number): void {
  const calls = callsPerTicket(fake);
  assert.equal(calls.size, count, "every request reached the model");
  const twice = [...calls.values()].filter((n) => n === 2).length;
  assert.ok(
    [...calls.values()].every((n) => n === 1 || n === 2),
    "no request reached the model more than twice",
  );
  assert.ok(twice <= cut, `${twice} requests reached the model twice, but only ${cut} were cut short`);
  t.diagnostic(`${cut} requests cut short; ${twice} of them had reached the model and were sent again`);
}

describe("batches survive their gateway process", { timeout: 300_000 }, () => {
  test("SQLite, kill -9 mid-batch: the next process on the file finishes it; every request answered and charged once", async (t) => {
    const dir = mkdtempSync(join(tmpdir(), "tds-batch-crash-"));
    const url = `sqlite:${join(dir, "tds.sqlite")}`;
    const fake = await startFakeModelServer();
    fake.setModelsBehavior("ok");
    const org = await setUpOrg(await openStore(url));
    const gateways: GatewayProcess[] = [];
    const count = 300;
    try {
      const env = {
        ...PAID,
        TDS_DATABASE_URL: url,
        TDS_MODEL_SERVICE_URL: fake.url,
        TDS_BATCH_CONCURRENCY: "4",
        TDS_BATCH_GLOBAL_CONCURRENCY: "4",
      };
      const first = await startGatewayProcess(env);
      gateways.push(first);
      fake.setBehavior("delay:20");
      const id = await submit(client(first, org), count);
      await waitForBatch(client(first, org), id, (b) => b.request_counts.succeeded >= 40);
      // From here the model holds every call: the process dies with requests at the model.
      const answered = fake.received.length;
      fake.setBehavior("hang");
      await waitFor("a request held at the model", () => fake.received.length > answered);
      await endProcess(first, "SIGKILL");

      const left = await leftByCrash(org, id);
      assert.ok(left.done >= 40 && left.done < count, `mid-batch at the kill: ${left.done} of ${count} done`);
      assert.ok(left.inFlight > 0, "requests were in flight at the kill");
      fake.setBehavior(null);
      const second = await startGatewayProcess(env);
      gateways.push(second);
      await assertExactlyOnce(client(second, org), org, id, count);
      assert.equal(await releasedCount(org), left.inFlight, "each request cut short was released once (nothing charged), then run again");
      assertEveryTicketRan(t, fake, count, left.inFlight);
    } finally {
      for (const gw of gateways.filter(running)) await gw.stop();
      await org.store.close();
      await fake.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("SQLite, SIGTERM mid-batch: the server drains its running requests and gives its claims back; a restart finishes", async (t) => {
    const dir = mkdtempSync(join(tmpdir(), "tds-batch-term-"));
    const url = `sqlite:${join(dir, "tds.sqlite")}`;
    const fake = await startFakeModelServer();
    fake.setModelsBehavior("ok");
    fake.setBehavior("delay:20");
    const org = await setUpOrg(await openStore(url));
    const gateways: GatewayProcess[] = [];
    const count = 200;
    try {
      const env = {
        ...PAID,
        TDS_DATABASE_URL: url,
        TDS_MODEL_SERVICE_URL: fake.url,
        TDS_BATCH_CONCURRENCY: "4",
        TDS_BATCH_GLOBAL_CONCURRENCY: "4",
      };
      const first = await startGatewayProcess(env);
      gateways.push(first);
      const id = await submit(client(first, org), count);
      // Slowed once 20 have succeeded, the batch is surely mid-run at the SIGTERM (the drain waits for the running ones).
      await waitForBatch(client(first, org), id, (b) => {
        if (b.request_counts.succeeded < 20) return false;
        fake.setBehavior("delay:1000");
        return true;
      });
      await endProcess(first, "SIGTERM");
      fake.setBehavior("delay:20");

      const left = await leftByCrash(org, id);
      assert.ok(left.done >= 20 && left.done < count, `mid-batch at the shutdown: ${left.done} of ${count} done`);
      assert.equal(left.inFlight, 0, "the running requests were finished before the process exited");
      const held = await rowsOf(
        org.store,
        "SELECT position FROM batch_requests WHERE batch_id = $1 AND state = 'claimed' AND lease_until_ms > 0",
        [id],
      );
      assert.deepEqual(held, [], "no claim is held by the stopped process");
      assert.deepEqual(
        (await allUsage(org.store, org.orgId)).filter((r) => r.outcome !== "succeeded"),
        [],
        "nothing was cut short",
      );

      const second = await startGatewayProcess(env);
      gateways.push(second);
      await assertExactlyOnce(client(second, org), org, id, count);
      const calls = callsPerTicket(fake);
      assert.equal(calls.size, count);
      assert.ok(
        [...calls.values()].every((n) => n === 1),
        "each request reached the model once",
      );
      t.diagnostic(`${left.done} of ${count} done at the shutdown`);
    } finally {
      for (const gw of gateways.filter(running)) await gw.stop();
      await org.store.close();
      await fake.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("SQLite, SIGTERM with requests held at the model past the drain: they are given up, given back and run again", async (t) => {
    const dir = mkdtempSync(join(tmpdir(), "tds-batch-stuck-"));
    const url = `sqlite:${join(dir, "tds.sqlite")}`;
    const fake = await startFakeModelServer();
    fake.setModelsBehavior("ok");
    fake.setBehavior("delay:20");
    const org = await setUpOrg(await openStore(url));
    const gateways: GatewayProcess[] = [];
    const count = 100;
    try {
      const env = {
        ...PAID,
        TDS_DATABASE_URL: url,
        TDS_MODEL_SERVICE_URL: fake.url,
        TDS_BATCH_CONCURRENCY: "4",
        TDS_BATCH_GLOBAL_CONCURRENCY: "4",
      };
      const first = await startGatewayProcess(env);
      gateways.push(first);
      const id = await submit(client(first, org), count);
      await waitForBatch(client(first, org), id, (b) => b.request_counts.succeeded >= 10);
      const answered = fake.received.length;
      fake.setBehavior("hang");
      await waitFor("a request held at the model", () => fake.received.length > answered);
      let stderr = "";
      first.child.stderr?.on("data", (d) => (stderr += d));
      await endProcess(first, "SIGTERM");

      const left = await leftByCrash(org, id);
      assert.ok(left.done >= 10 && left.done < count, `mid-batch at the shutdown: ${left.done} of ${count} done`);
      // Abandoned by the drain: their records end failed, or stay in flight for the next instance to release.
      const givenUp = (await allUsage(org.store, org.orgId)).filter((r) => r.outcome !== "succeeded").map((r) => r.requestId);
      assert.ok(givenUp.length > 0, "requests held at the model were given up");
      const held = await rowsOf(
        org.store,
        "SELECT position FROM batch_requests WHERE batch_id = $1 AND state = 'claimed' AND lease_until_ms > 0",
        [id],
      );
      assert.deepEqual(held, [], "their claims were given back");

      fake.setBehavior(null);
      const second = await startGatewayProcess(env);
      gateways.push(second);
      await assertExactlyOnce(client(second, org), org, id, count);
      const failed = (await allUsage(org.store, org.orgId)).filter((r) => r.outcome !== "succeeded");
      assert.deepEqual(
        failed.map((r) => r.requestId).sort(),
        [...givenUp].sort(),
        "each request given up ran again under a new request id",
      );
      assertEveryTicketRan(t, fake, count, givenUp.length);
      t.diagnostic(`${givenUp.length} requests given up at the shutdown (${left.inFlight} left in flight)`);
      assert.equal(first.child.exitCode, 0, `a clean shutdown:\n${stderr}`);
    } finally {
      for (const gw of gateways.filter(running)) await gw.stop();
      await org.store.close();
      await fake.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("PostgreSQL, two instances, kill -9 of one mid-batch: the other takes its claims over and finishes", {
    skip: SKIP_POSTGRES,
  }, async (t) => {
    const db = await createTestDatabase("tds_batch_crash");
    const fake = await startFakeModelServer();
    fake.setModelsBehavior("ok");
    fake.setBehavior("delay:20");
    // Instance A's model calls are held until it is killed: it dies with requests at the model.
    const gate = await startModelGate(fake.url);
    const org = await setUpOrg(await openStore(db.url));
    const gateways: GatewayProcess[] = [];
    const count = 300;
    try {
      const env = { ...PAID, TDS_DATABASE_URL: db.url, TDS_BATCH_CONCURRENCY: "8", TDS_BATCH_GLOBAL_CONCURRENCY: "4" };
      const a = await startGatewayProcess({ ...env, TDS_MODEL_SERVICE_URL: gate.url });
      gateways.push(a);
      const b = await startGatewayProcess({ ...env, TDS_MODEL_SERVICE_URL: fake.url });
      gateways.push(b);
      const id = await submit(client(a, org), count);
      await waitFor("instance A holding requests at the model", () => gate.held() > 0);
      await waitForBatch(client(b, org), id, (x) => x.request_counts.succeeded >= 20);
      await endProcess(a, "SIGKILL");

      const left = await leftByCrash(org, id);
      assert.ok(left.done < count, `mid-batch at the kill: ${left.done} of ${count} done`);
      // A's calls never got past its gate: what B admitted is what succeeded; every other record is A's, in flight.
      const [ofB] = await rowsOf(org.store, "SELECT instance_id FROM usage_records WHERE outcome = 'succeeded' LIMIT 1");
      const ofA = await rowsOf(org.store, "SELECT outcome FROM usage_records WHERE instance_id <> $1", [ofB?.instance_id]);
      assert.ok(ofA.length > 0, "A had requests in flight at the kill");
      assert.ok(
        ofA.every((r) => r.outcome === "in_flight"),
        JSON.stringify(ofA),
      );
      await assertExactlyOnce(client(b, org), org, id, count);
      assert.equal(await releasedCount(org), ofA.length, "each request A left in flight was released once, then run again by B");
      const calls = callsPerTicket(fake);
      assert.equal(calls.size, count, "every request reached the model");
      assert.ok(
        [...calls.values()].every((n) => n === 1),
        "A's held calls never reached the model: each request reached it once, from B",
      );
      t.diagnostic(`${left.done} of ${count} done and ${ofA.length} of A's requests in flight at the kill`);
    } finally {
      for (const gw of gateways.filter(running)) await gw.stop();
      await org.store.close();
      await gate.close();
      await fake.close();
      await db.drop();
    }
  });

  test("PostgreSQL, kill -9 after decisions were charged but before their results were written: replayed, not charged again", {
    skip: SKIP_POSTGRES,
  }, async (t) => {
    const db = await createTestDatabase("tds_batch_replay");
    const fake = await startFakeModelServer();
    fake.setModelsBehavior("ok");
    fake.setBehavior("delay:20");
    const org = await setUpOrg(await openStore(db.url));
    const gateways: GatewayProcess[] = [];
    const lock = new pg.Client({ connectionString: db.url });
    await lock.connect();
    const count = 100;
    try {
      const env = { ...PAID, TDS_MODEL_SERVICE_URL: fake.url, TDS_BATCH_CONCURRENCY: "4", TDS_BATCH_GLOBAL_CONCURRENCY: "4" };
      // Its finishes wait on the test's lock of the batch row for as long as the test holds it.
      const a = await startGatewayProcess({ ...env, TDS_DATABASE_URL: `${db.url}?statement_timeout_ms=600000` });
      gateways.push(a);
      const id = await submit(client(a, org), count);
      await waitForBatch(client(a, org), id, (b) => b.request_counts.succeeded >= 10);
      // A request's finish adds it to its batch's counts: with the batch row locked, decisions complete (charged)
      // and their results are not written.
      await lock.query("BEGIN");
      await lock.query("SELECT id FROM batches WHERE id = $1 FOR UPDATE", [id]);
      const unwritten = () =>
        rowsOf(
          org.store,
          "SELECT u.request_id FROM usage_records u JOIN batch_requests r ON r.request_id = u.request_id " +
            "WHERE r.batch_id = $1 AND u.outcome = 'succeeded' AND r.state <> 'done' ORDER BY r.position",
          [id],
        );
      await waitFor("decisions charged whose results wait", async () => (await unwritten()).length > 0);
      await endProcess(a, "SIGKILL");
      await lock.query("ROLLBACK");

      const charged = (await unwritten()).map((r) => r.request_id as string);
      assert.ok(charged.length > 0);
      const left = await leftByCrash(org, id);
      const b = await startGatewayProcess({ ...env, TDS_DATABASE_URL: db.url });
      gateways.push(b);
      const results = await assertExactlyOnce(client(b, org), org, id, count);
      const resultOf = new Map(results.map((r) => [r.request_id, r]));
      const calls = callsPerTicket(fake);
      for (const requestId of charged) {
        const line = resultOf.get(requestId);
        assert.ok(line, `the charged decision ${requestId} is its request's result (replayed under its id)`);
        assert.equal(calls.get(`ticket ${line.custom_id.slice(1)}`), 1, `${line.custom_id}: the replay did not call the model`);
      }
      assertEveryTicketRan(t, fake, count, left.inFlight);
      t.diagnostic(`${charged.length} decisions charged but unwritten at the kill, replayed`);
    } finally {
      await lock.end().catch(() => null);
      for (const gw of gateways.filter(running)) await gw.stop();
      await org.store.close();
      await fake.close();
      await db.drop();
    }
  });

  test("PostgreSQL, two instances share one batch: both run some, no request runs twice", { skip: SKIP_POSTGRES }, async (t) => {
    const db = await createTestDatabase("tds_batch_share");
    const fake = await startFakeModelServer();
    fake.setModelsBehavior("ok");
    // Each instance's calls are held until both have some at the model: neither can run the batch alone.
    const gates = [await startModelGate(fake.url), await startModelGate(fake.url)];
    const org = await setUpOrg(await openStore(db.url));
    const gateways: GatewayProcess[] = [];
    const count = 600;
    try {
      // The organization's limit lets each instance fill its own.
      const env = { ...PAID, TDS_DATABASE_URL: db.url, TDS_BATCH_CONCURRENCY: "16", TDS_BATCH_GLOBAL_CONCURRENCY: "8" };
      for (const gate of gates) gateways.push(await startGatewayProcess({ ...env, TDS_MODEL_SERVICE_URL: gate.url }));
      await Promise.all(gateways.map((g) => waitUntilReady(g)));
      const id = await submit(client(gateways[0]!, org), count);
      await waitFor("both instances holding requests at the model", () => gates.every((g) => g.held() > 0));
      for (const gate of gates) gate.open();

      await assertExactlyOnce(client(gateways[1]!, org), org, id, count).catch((err: unknown) => {
        // What the instances said about the model service (a deployment taken out of rotation explains 502s).
        for (const line of gateways
          .flatMap((g) => g.lines)
          .filter((l) => /deployment|model service/i.test(l))
          .slice(-20))
          t.diagnostic(line);
        throw err;
      });
      const calls = callsPerTicket(fake);
      assert.equal(calls.size, count, "every request reached the model");
      assert.ok(
        [...calls.values()].every((n) => n === 1),
        "no request reached the model twice",
      );
      const split = await rowsOf(org.store, "SELECT instance_id, count(*) AS n FROM usage_records GROUP BY instance_id ORDER BY n DESC");
      assert.equal(split.length, 2, `two instances ran the batch: ${JSON.stringify(split)}`);
      assert.equal(
        split.reduce((a, r) => a + (r.n as number), 0),
        count,
      );
      t.diagnostic(`split between the instances: ${split.map((r) => r.n).join(" / ")}`);
      assert.equal((await getBatch(client(gateways[0]!, org), id)).status, "completed");
    } finally {
      for (const gw of gateways.filter(running)) await gw.stop();
      await org.store.close();
      for (const gate of gates) await gate.close();
      await fake.close();
      await db.drop();
    }
  });
});
