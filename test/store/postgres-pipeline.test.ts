/**
 * The PostgreSQL bookkeeping transaction, pipelined: two round trips ([BEGIN, advisory locks, combined read] and
 * [combined write, COMMIT]); a failed statement fails the transaction (COMMIT answers ROLLBACK) with the first failure
 * of its round trip, classified as before; a lost connection is discarded; balance rows are locked in org_id order
 * whatever order the planner scans them in. Real PostgreSQL, a scratch database.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import pg from "pg";
import type { AdmitCommand } from "../../src/domain/bookkeeping.ts";
import { emptyWriteSet, type UsageFinal } from "../../src/store/bookkeeping/rows.ts";
import { writeRows } from "../../src/store/postgres/postgres-book-rows.ts";
import { pipelinedTransaction } from "../../src/store/postgres/postgres-connection.ts";
import { openPostgresStore, type PostgresStore, type PostgresStoreOptions } from "../../src/store/postgres/postgres-store.ts";
import { StoreConflictError } from "../../src/store/store-errors.ts";
import { watchQueries } from "../support/pg-queries.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { admission, checkBalanceInvariants } from "./store-contract.ts";

type Db = Awaited<ReturnType<typeof createTestDatabase>>;
const T0 = Date.UTC(2026, 0, 1);
const IDEMPOTENCY_LOCK = "SELECT pg_advisory_xact_lock(1952671090, hashtext(length($1::text)::text || ':' || $1 || $2))";

type Label = "BEGIN" | "lock" | "read" | "write" | "COMMIT" | "ROLLBACK" | "other";

function labelOf(config: unknown): Label {
  const { text = "", name = "" } = (typeof config === "string" ? { text: config } : config) as { text?: string; name?: string };
  if (text.startsWith("BEGIN")) return "BEGIN";
  if (text === "COMMIT" || text === "ROLLBACK") return text;
  if (name === "tds_lockIdempotency") return "lock";
  if (name.startsWith("tds_")) return text.includes("RETURNING 1") ? "write" : "read";
  return "other";
}

/**
 * The round trips of every pg client while `fn` runs: the statements sent while none was waiting for its answer
 * start one, and it ends when every answer has come.
 */
async function roundTrips(fn: () => Promise<unknown>): Promise<Label[][]> {
  const trips: Label[][] = [];
  let current: Label[] | null = null;
  let inFlight = 0;
  await watchQueries(
    ({ config, answer }) => {
      if (current === null) {
        current = [];
        trips.push(current);
      }
      current.push(labelOf(config));
      inFlight++;
      const done = () => {
        if (--inFlight === 0) current = null;
      };
      answer.then(done, done);
    },
    () => fn().catch(() => undefined),
  );
  return trips;
}

function paid(requestId: string, orgId: string, key?: string): AdmitCommand {
  return admission({
    requestId,
    orgId,
    nowMs: T0,
    reservation: { amountMicrousd: 1000, expiresAtMs: T0 + 60_000 },
    idempotency: key ? { key, requestHash: "h", lockUntilMs: T0 + 60_000, expiresAtMs: T0 + 3_600_000 } : null,
  });
}

describe("PostgreSQL bookkeeping transactions, pipelined", () => {
  let db: Db;
  let store: PostgresStore;
  const stores: PostgresStore[] = [];
  const raws: pg.Client[] = [];
  let orgs = 0;

  const open = async (options: PostgresStoreOptions = {}, urlOptions?: string) => {
    const url = urlOptions ? `${db.url}?options=${encodeURIComponent(urlOptions)}` : db.url;
    const s = await openPostgresStore(url, { applicationName: "tds-pipeline-test", ...options });
    stores.push(s);
    return s;
  };
  const raw = async () => {
    const c = new pg.Client({ connectionString: db.url });
    c.on("error", () => undefined);
    await c.connect();
    raws.push(c);
    return c;
  };
  /** A new organization with credits, through `on` (default: the shared store). */
  const organization = async (on: PostgresStore = store, id = `org_p${++orgs}`) => {
    await on.createOrganization({ id, name: id, nowMs: T0 });
    await on.grantCredits({ orgId: id, amountMicrousd: 1_000_000, nowMs: T0 });
    return id;
  };
  const admitted = async (on: PostgresStore, ...admissions: AdmitCommand[]) =>
    (await on.commitBatch({ admissions, completions: [] })).admissions.map((r) => r.kind);
  /** The store's backend that waits for a lock, once there is one. */
  const waitingBackend = async (monitor: pg.Client): Promise<number> => {
    for (let i = 0; i < 500; i++) {
      const row = (
        await monitor.query<{ pid: number }>(
          "SELECT pid FROM pg_stat_activity WHERE application_name = 'tds-pipeline-test' AND wait_event_type = 'Lock' AND datname = current_database()",
        )
      ).rows[0];
      if (row) return row.pid;
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error("no backend of the store waits for a lock");
  };
  const assertPoolIdle = (s: PostgresStore) => {
    for (const pool of [s.pool, s.bookkeepingPool]) {
      assert.equal(pool.waitingCount, 0);
      assert.equal(pool.idleCount, pool.totalCount, "every client went back to the pool");
    }
  };

  before(async () => {
    db = await createTestDatabase("tds_pipeline");
    store = await open();
  });
  after(async () => {
    await Promise.all(raws.map((c) => c.end().catch(() => undefined)));
    await Promise.all(stores.map((s) => s.close()));
    await db.drop();
  });

  it("commits a batch in two round trips: [BEGIN, advisory locks, read] and [write, COMMIT]", async () => {
    const orgId = await organization();
    const trips = await roundTrips(() => store.commitBatch({ admissions: [paid("req_trips", orgId, "key-trips")], completions: [] }));
    assert.deepEqual(trips, [
      ["BEGIN", "lock", "read"],
      ["write", "COMMIT"],
    ]);
    assert.equal((await store.getBalance(orgId)).reserved, 1000);
  });

  it("fails a batch whose write fails: COMMIT ends it with ROLLBACK, nothing is kept, the connection stays usable", async () => {
    const orgId = await organization();
    assert.deepEqual(await admitted(store, paid("req_dup", orgId)), ["admitted"]);
    const before = await store.getBalance(orgId);
    const clients = store.bookkeepingPool.totalCount;
    let failure: unknown;
    const trips = await roundTrips(async () => {
      failure = await store.commitBatch({ admissions: [paid("req_dup_other", orgId), paid("req_dup", orgId)], completions: [] }).then(
        () => assert.fail("a duplicate request id must fail the batch"),
        (err: unknown) => err,
      );
    });
    assert.ok(failure instanceof StoreConflictError, String(failure));
    assert.equal(store.classifyFailure(failure), "other");
    assert.deepEqual(trips.at(-1), ["write", "COMMIT"], "no ROLLBACK after the COMMIT that rolled back");
    assert.deepEqual(await store.getBalance(orgId), before, "the other admission of the batch was not kept either");
    assert.equal(await store.getUsage(orgId, "req_dup_other"), null);
    assertPoolIdle(store);
    assert.equal(store.bookkeepingPool.totalCount, clients, "the client was not discarded");
    assert.deepEqual(await admitted(store, paid("req_dup_next", orgId)), ["admitted"]);
    await checkBalanceInvariants(store, orgId);
  });

  it("fails the write (and the COMMIT behind it) when rows the snapshot locked were not there to change", async () => {
    const final = { requestId: "req_never_admitted", completedAtMs: T0, outcome: "succeeded", httpStatus: 200 } as unknown as UsageFinal;
    const counter = { scope: "org_conflict", day: "2026-01-01", count: 5 };
    await assert.rejects(
      pipelinedTransaction(store.bookkeepingPool, async (p) => {
        writeRows(p, { ...emptyWriteSet(), usageFinals: [final], counters: [counter] });
      }),
      /^Error: Bookkeeping conflict: 1 of 1 usage records were not in flight$/,
    );
    const c = await raw();
    assert.equal((await c.query("SELECT 1 FROM preview_counters WHERE scope = 'org_conflict'")).rowCount, 0, "nothing was committed");
    assertPoolIdle(store);
  });

  it("surfaces the first failure of a round trip (a lock wait past statement_timeout), not the aborted statements after it", async () => {
    const timed = await open({ statementTimeoutMs: 300 });
    const orgId = await organization(timed);
    const holder = await raw();
    await holder.query("BEGIN");
    await holder.query(IDEMPOTENCY_LOCK, [orgId, "key-held"]);
    const err = await timed.commitBatch({ admissions: [paid("req_held", orgId, "key-held")], completions: [] }).then(
      () => assert.fail("the lock is held"),
      (e: unknown) => e,
    );
    await holder.query("ROLLBACK");
    assert.equal((err as { code?: string }).code, "57014", `the lock's statement timeout, not 25P02: ${String(err)}`);
    assert.equal(timed.classifyFailure(err), "unavailable");
    assertPoolIdle(timed);
    assert.deepEqual(await admitted(timed, paid("req_held", orgId, "key-held")), ["admitted"], "no transaction was left open");
  });

  it("discards a connection that is killed while its transaction waits, and goes on with a new one", async () => {
    const orgId = await organization();
    const holder = await raw();
    await holder.query("BEGIN");
    await holder.query("SELECT 1 FROM org_balances WHERE org_id = $1 FOR UPDATE", [orgId]);
    const pending = store.commitBatch({ admissions: [paid("req_killed", orgId)], completions: [] }).then(
      () => assert.fail("the connection is killed"),
      (e: unknown) => e,
    );
    const monitor = await raw();
    const pid = await waitingBackend(monitor);
    await monitor.query("SELECT pg_terminate_backend($1)", [pid]);
    const err = await pending;
    await holder.query("ROLLBACK");
    assert.equal(store.classifyFailure(err), "unavailable", String(err));
    assertPoolIdle(store);
    const pids = (await monitor.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE application_name = 'tds-pipeline-test'"))
      .rows;
    assert.ok(!pids.some((r) => r.pid === pid), "the killed connection is not in the pool");
    assert.deepEqual(await admitted(store, paid("req_after_kill", orgId)), ["admitted"]);
    await checkBalanceInvariants(store, orgId);
  });

  it("locks balance rows in org_id order even when the planner reads them in another order", async () => {
    // Sequential scans only: the rows come in the order they were written (the larger id first).
    const scans = await open({}, "-c enable_indexscan=off -c enable_bitmapscan=off -c enable_indexonlyscan=off");
    const second = await organization(scans, "org_sorted_b");
    const first = await organization(scans, "org_sorted_a");
    const holder = await raw();
    await holder.query("BEGIN");
    await holder.query("SELECT 1 FROM org_balances WHERE org_id = $1 FOR UPDATE", [second]);
    const pending = scans.commitBatch({ admissions: [paid("req_sorted_b", second), paid("req_sorted_a", first)], completions: [] });
    const monitor = await raw();
    await waitingBackend(monitor);
    // Waiting for the larger id's row, the transaction holds the smaller one's already.
    await assert.rejects(
      monitor.query("SELECT 1 FROM org_balances WHERE org_id = $1 FOR UPDATE NOWAIT", [first]),
      (err: { code?: string }) => err.code === "55P03",
    );
    await holder.query("ROLLBACK");
    assert.deepEqual(
      (await pending).admissions.map((r) => r.kind),
      ["admitted", "admitted"],
    );
  });

  it("runs several transactions at once on different connections, and the books add up", async () => {
    const busy = await open({ poolSize: 4 });
    const ids = [await organization(busy), await organization(busy), await organization(busy)];
    const batches = Array.from({ length: 12 }, (_, i) =>
      busy.commitBatch({
        admissions: [paid(`req_many_${i}_a`, ids[i % 3]!, `k${i}`), paid(`req_many_${i}_b`, ids[(i + 1) % 3]!)],
        completions: [],
      }),
    );
    const results = await Promise.all(batches);
    assert.ok(results.every((r) => r.admissions.every((a) => a.kind === "admitted")));
    for (const orgId of ids) {
      const balance = await checkBalanceInvariants(busy, orgId);
      assert.equal(balance.reserved, 8 * 1000, "each organization holds 8 reservations");
    }
    assertPoolIdle(busy);
  });
});
