/**
 * The budget of an API key in the books (migration 013: key_spend, usage_records.key_budget_key_id and
 * key_budget_period), on SQLite and PostgreSQL: a paid admission by a key with a budget sets its reservation aside in
 * the spend of the key's lineage (the key and the keys that replaced it by rotation: one row) in the period,
 * refused (key_budget_exhausted, with what is left) when it would pass the limit, after the organization's balance
 * is asked; the completion, the sweep and the release of orphans move it out of reserved (its cost into spent when
 * settled). Under concurrency (separate commitBatch calls; on PostgreSQL also two stores on one database) exactly
 * as many are admitted as the budget covers, never more.
 *
 * PostgreSQL: a fresh database per test (TDS_TEST_POSTGRES_URL); TDS_SKIP_POSTGRES=1 skips those tests.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, afterEach, beforeEach, describe, it } from "node:test";
import type { AdmitCommand, AdmitResult, CompleteCommand } from "../../src/domain/bookkeeping.ts";
import { openPostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";
import { StoreInputError } from "../../src/store/store-errors.ts";
import { assertLedgerMatches } from "../support/books.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { assertRollUpExact, reservationStatuses, rowsOf } from "../support/roll-up.ts";
import { admission, completion, T0 } from "./store-contract.ts";

const SKIP_POSTGRES = process.env.TDS_SKIP_POSTGRES === "1";
const MINUTE = 60_000;
const DAY_MS = 86_400_000;
const GRANT = 1_000_000;
const DAY1 = "2026-01-01";
const DAY2 = "2026-01-02";
const ORG = "org_a";

const dirs: string[] = [];
after(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/**
 * A paid admission of `keyId` reserving `amount`, counted in the budget of its lineage (`lineage`, default the key
 * itself) of `period` up to `limit`.
 */
function paid(
  requestId: string,
  amount: number,
  budget: { keyId?: string; lineage?: string; period?: string; limit: number } | null,
  more: Partial<AdmitCommand> = {},
): AdmitCommand {
  const nowMs = more.nowMs ?? T0;
  const keyId = budget?.keyId ?? "key_1";
  return admission({
    requestId,
    orgId: ORG,
    keyId,
    nowMs,
    reservation: { amountMicrousd: amount, expiresAtMs: nowMs + 2 * MINUTE },
    keyBudget: budget && { keyId: budget.lineage ?? keyId, period: budget.period ?? DAY1, limitMicrousd: budget.limit },
    ...more,
  });
}

/** The completion of a paid request whose reservation counts in the budget of lineage `keyId` of `period`. */
function done(requestId: string, cost: number, more: Partial<CompleteCommand> = {}, keyId = "key_1", period = DAY1): CompleteCommand {
  return completion({ requestId, orgId: ORG, costMicrousd: cost, reserved: true, keyBudget: { keyId, period }, ...more });
}

const failed = (requestId: string, keyId = "key_1", period = DAY1): CompleteCommand =>
  done(requestId, 0, { outcome: "model_error", httpStatus: 502, errorDetail: "the model service failed" }, keyId, period);

interface Opened {
  store: Store;
  /** Another store on the same database (PostgreSQL), or the same one (SQLite: one writer). */
  other(): Promise<Store>;
  close(): Promise<void>;
}

async function open(dialect: "sqlite" | "postgres"): Promise<Opened> {
  if (dialect === "sqlite") {
    const dir = mkdtempSync(join(tmpdir(), "tds-key-budget-"));
    dirs.push(dir);
    const store = openSqliteStore(join(dir, "tds.sqlite"));
    return { store, other: async () => store, close: () => store.close() };
  }
  const db = await createTestDatabase("tds_key_budget");
  const store = await openPostgresStore(db.url);
  const others: Store[] = [];
  return {
    store,
    async other() {
      const s = await openPostgresStore(db.url);
      others.push(s);
      return s;
    },
    async close() {
      for (const s of others) await s.close();
      await store.close();
      await db.drop();
    },
  };
}

for (const dialect of ["sqlite", "postgres"] as const) {
  describe(`${dialect}: the budget of a key`, { skip: dialect === "postgres" && SKIP_POSTGRES, timeout: 120_000 }, () => {
    let opened: Opened;
    let store: Store;

    beforeEach(async () => {
      opened = await open(dialect);
      store = opened.store;
      await store.createOrganization({ id: ORG, name: "org a", nowMs: T0 });
      await store.grantCredits({ orgId: ORG, amountMicrousd: GRANT, nowMs: T0 });
    });
    afterEach(async () => opened.close());

    const commit = (admissions: AdmitCommand[], completions: CompleteCommand[] = []) => store.commitBatch({ admissions, completions });
    const admit = async (a: AdmitCommand): Promise<AdmitResult> => (await commit([a])).admissions[0]!;
    const complete = async (c: CompleteCommand) => (await commit([], [c])).completions[0]!;
    const spend = (keyId = "key_1", period = DAY1) => store.keySpend(keyId, period);
    const costOfRecords = async (keyId: string, period: string) =>
      (
        await rowsOf(
          store,
          "SELECT CAST(COALESCE(SUM(cost_microusd), 0) AS BIGINT) AS cost, count(*) AS n FROM usage_records WHERE key_budget_key_id = $1 AND key_budget_period = $2",
          [keyId, period],
        )
      )[0] as { cost: number; n: number };

    /** The organization's books and roll-up stay exact, whatever the key spend did. */
    async function booksExact(): Promise<void> {
      await assertLedgerMatches(store, ORG);
      await assertRollUpExact(store);
      await reservationStatuses(store);
    }

    it("reads zeros for a key without spend; refuses a period that is neither a day nor a month", async () => {
      assert.deepEqual(await spend("nobody", DAY1), { reservedMicrousd: 0, spentMicrousd: 0 });
      assert.deepEqual(await spend("nobody", "2026-01"), { reservedMicrousd: 0, spentMicrousd: 0 });
      await assert.rejects(store.keySpend("key_1", "2026-1-1"), StoreInputError);
      await assert.rejects(commit([paid("r_bad", 100, { limit: 1000, period: "today" })]), StoreInputError);
      await assert.rejects(commit([paid("r_bad", 100, { limit: -1 })]), StoreInputError);
    });

    it("settles: the reservation is set aside in the key's spend, then leaves it, its cost spent", async () => {
      assert.deepEqual(await admit(paid("r1", 300, { limit: 1000 })), { kind: "admitted" });
      assert.deepEqual(await spend(), { reservedMicrousd: 300, spentMicrousd: 0 });
      assert.deepEqual(await store.getBalance(ORG), { available: GRANT - 300, reserved: 300, spent: 0, granted: GRANT });
      assert.deepEqual(await complete(done("r1", 120)), { kind: "completed" });
      assert.deepEqual(await spend(), { reservedMicrousd: 0, spentMicrousd: 120 });
      assert.deepEqual(await costOfRecords("key_1", DAY1), { cost: 120, n: 1 });
      await booksExact();
    });

    it("releases: a failed request leaves nothing spent in the key's budget", async () => {
      await admit(paid("r1", 300, { limit: 1000 }));
      assert.deepEqual(await complete(failed("r1")), { kind: "completed" });
      assert.deepEqual(await spend(), { reservedMicrousd: 0, spentMicrousd: 0 });
      assert.equal((await store.getReservation("r1"))?.status, "released");
      await booksExact();
    });

    it("expires: a success completed after the reservation's expiry spends nothing of the key's budget", async () => {
      await admit(paid("r1", 300, { limit: 1000 }));
      const late = done("r1", 120, { nowMs: T0 + 3 * MINUTE });
      assert.deepEqual(await complete(late), { kind: "reservation_expired" });
      assert.deepEqual(await spend(), { reservedMicrousd: 0, spentMicrousd: 0 });
      assert.equal((await store.getReservation("r1"))?.status, "expired");
      await booksExact();
    });

    it("the sweep and the release of orphans take the reservations out of the key's spend", async () => {
      await store.renewLease({ instanceId: "gw_gone", startedAtMs: T0, leaseUntilMs: T0 + 15_000, nowMs: T0 });
      await commit([
        paid("r_swept", 200, { limit: 1000 }),
        paid("r_orphan", 300, { limit: 1000 }, { instanceId: "gw_gone", nowMs: T0 + 1 }),
        paid("r_other_key", 50, { keyId: "key_2", limit: 1000 }, { nowMs: T0 + 2 }),
        admission({ requestId: "r_preview", orgId: ORG, quota: { day: DAY1, orgLimit: 10, globalLimit: 100 } }),
      ]);
      assert.deepEqual(await spend(), { reservedMicrousd: 500, spentMicrousd: 0 });
      assert.deepEqual(await spend("key_2"), { reservedMicrousd: 50, spentMicrousd: 0 });

      assert.deepEqual(await store.releaseOrphans({ instanceId: "gw_me", nowMs: T0 + MINUTE, createdBeforeMs: null, limit: 10 }), {
        released: 1,
      });
      assert.deepEqual(await spend(), { reservedMicrousd: 200, spentMicrousd: 0 });
      assert.equal((await store.getReservation("r_orphan"))?.status, "released");

      assert.deepEqual(await store.sweep({ nowMs: T0 + DAY_MS, inFlightBeforeMs: T0 + DAY_MS, limit: 10 }), { abandoned: 3 });
      assert.deepEqual(await spend(), { reservedMicrousd: 0, spentMicrousd: 0 });
      assert.deepEqual(await spend("key_2"), { reservedMicrousd: 0, spentMicrousd: 0 });
      assert.equal((await store.getReservation("r_swept"))?.status, "expired");
      await booksExact();
    });

    it("refuses past the budget with what is left, after the organization's balance; a refusal moves nothing", async () => {
      await admit(paid("r1", 700, { limit: 1000 }));
      await complete(done("r1", 700));
      await admit(paid("r2", 200, { limit: 1000 }));
      assert.deepEqual(await spend(), { reservedMicrousd: 200, spentMicrousd: 700 });
      const before = await store.getBalance(ORG);

      assert.deepEqual(await admit(paid("r3", 101, { limit: 1000 })), { kind: "key_budget_exhausted", remainingMicrousd: 100 });
      // A limit lowered below what is spent: nothing left, never negative.
      assert.deepEqual(await admit(paid("r4", 1, { limit: 500 })), { kind: "key_budget_exhausted", remainingMicrousd: 0 });
      // The organization's balance is asked first.
      assert.deepEqual(await admit(paid("r5", GRANT, { limit: 1000 })), {
        kind: "insufficient_credits",
        availableMicrousd: before.available,
      });
      assert.deepEqual(await store.getBalance(ORG), before);
      assert.deepEqual(await spend(), { reservedMicrousd: 200, spentMicrousd: 700 });
      for (const id of ["r3", "r4", "r5"]) assert.equal(await store.getUsage(ORG, id), null, id);

      // Exactly what is left is admitted.
      assert.deepEqual(await admit(paid("r6", 100, { limit: 1000 })), { kind: "admitted" });
      assert.deepEqual(await spend(), { reservedMicrousd: 300, spentMicrousd: 700 });
      // A key without a budget, and a preview admission of the key, are not counted.
      assert.deepEqual(await admit(paid("r7", 5000, null)), { kind: "admitted" });
      const preview = admission({ requestId: "r8", orgId: ORG, quota: { day: DAY1, orgLimit: 10, globalLimit: 100 } });
      assert.deepEqual(await admit({ ...preview, keyBudget: { keyId: "key_1", period: DAY1, limitMicrousd: 0 } }), { kind: "admitted" });
      assert.deepEqual(await spend(), { reservedMicrousd: 300, spentMicrousd: 700 });
      await booksExact();
    });

    it("decides the admissions of one batch in order, after its completions", async () => {
      await admit(paid("r0", 100, { limit: 300 }));
      const batch = await commit(
        ["r1", "r2", "r3", "r4"].map((id) => paid(id, 100, { limit: 300 })),
        [failed("r0")],
      );
      assert.deepEqual(
        batch.admissions.map((a) => a.kind),
        ["admitted", "admitted", "admitted", "key_budget_exhausted"],
      );
      assert.deepEqual(await spend(), { reservedMicrousd: 300, spentMicrousd: 0 });
      await booksExact();
    });

    it("a completion must name the key budget its reservation counts in", async () => {
      await admit(paid("r1", 300, { limit: 1000 }));
      await assert.rejects(commit([], [completion({ requestId: "r1", orgId: ORG, costMicrousd: 10, reserved: true })]), /budget/);
      await assert.rejects(commit([], [done("r1", 10, {}, "key_1", DAY2)]), /budget/);
      await assert.rejects(commit([], [done("r1", 10, {}, "key_2", DAY1)]), /budget/);
      assert.deepEqual(await spend(), { reservedMicrousd: 300, spentMicrousd: 0 });
      assert.equal((await store.getUsage(ORG, "r1"))?.outcome, "in_flight");
      // Naming a budget a request does not count in changes nothing.
      await admit(paid("r2", 10, null));
      assert.deepEqual(await complete(done("r2", 10)), { kind: "completed" });
      assert.deepEqual(await complete(done("r1", 10)), { kind: "completed" });
      assert.deepEqual(await spend(), { reservedMicrousd: 0, spentMicrousd: 10 });
      await booksExact();
    });

    it("a key and the key that replaced it by rotation spend in one row: their lineage's", async () => {
      const old = { keyId: "key_1", limit: 1000 };
      const rotated = { keyId: "key_1b", lineage: "key_1", limit: 1000 };
      assert.deepEqual(await admit(paid("r_old", 600, old)), { kind: "admitted" });
      await complete(done("r_old", 600));
      assert.deepEqual(await admit(paid("r_new", 300, rotated, { nowMs: T0 + 1 })), { kind: "admitted" });
      assert.deepEqual(await spend("key_1"), { reservedMicrousd: 300, spentMicrousd: 600 });
      assert.deepEqual(await spend("key_1b"), { reservedMicrousd: 0, spentMicrousd: 0 }, "no row of the new key's own");
      // What is left of the one budget, by either key.
      assert.deepEqual(await admit(paid("r_new2", 101, rotated)), { kind: "key_budget_exhausted", remainingMicrousd: 100 });
      assert.deepEqual(await admit(paid("r_old2", 101, old)), { kind: "key_budget_exhausted", remainingMicrousd: 100 });
      assert.deepEqual(
        await rowsOf(store, "SELECT key_id, key_budget_key_id, key_budget_period FROM usage_records ORDER BY created_at_ms", []),
        [
          { key_id: "key_1", key_budget_key_id: "key_1", key_budget_period: DAY1 },
          { key_id: "key_1b", key_budget_key_id: "key_1", key_budget_period: DAY1 },
        ],
      );
      // The new key's request completes in the lineage's row, and must name it.
      await assert.rejects(commit([], [done("r_new", 50, {}, "key_1b")]), /budget/);
      assert.deepEqual(await complete(done("r_new", 50, {}, "key_1")), { kind: "completed" });
      assert.deepEqual(await spend("key_1"), { reservedMicrousd: 0, spentMicrousd: 650 });
      // The sweep resolves a lineage's reservation in its row too.
      await admit(paid("r_swept", 350, rotated, { nowMs: T0 + 2 }));
      assert.deepEqual(await spend("key_1"), { reservedMicrousd: 350, spentMicrousd: 650 });
      assert.deepEqual(await store.sweep({ nowMs: T0 + DAY_MS, inFlightBeforeMs: T0 + DAY_MS, limit: 10 }), { abandoned: 1 });
      assert.deepEqual(await spend("key_1"), { reservedMicrousd: 0, spentMicrousd: 650 });
      assert.deepEqual(await spend("key_1b"), { reservedMicrousd: 0, spentMicrousd: 0 });
      assert.deepEqual(await costOfRecords("key_1", DAY1), { cost: 650, n: 3 });
      await booksExact();
    });

    it("a new period starts from 0; a request settles in the period it was admitted in", async () => {
      await admit(paid("d1_a", 600, { limit: 1000 }));
      await admit(paid("d1_b", 400, { limit: 1000 }));
      assert.equal((await admit(paid("d1_c", 1, { limit: 1000 }))).kind, "key_budget_exhausted");
      const nextDay = T0 + DAY_MS;
      assert.deepEqual(await admit(paid("d2_a", 1000, { limit: 1000, period: DAY2 }, { nowMs: nextDay })), { kind: "admitted" });
      // Completed on the next day, in the first day's row.
      await complete(done("d1_a", 250, { nowMs: T0 + MINUTE }));
      await complete(done("d2_a", 900, { nowMs: nextDay + MINUTE }, "key_1", DAY2));
      assert.deepEqual(await spend("key_1", DAY1), { reservedMicrousd: 400, spentMicrousd: 250 });
      assert.deepEqual(await spend("key_1", DAY2), { reservedMicrousd: 0, spentMicrousd: 900 });
      // A month's budget is a row of its own.
      assert.deepEqual(await admit(paid("m1", 999, { limit: 1000, period: "2026-01" })), { kind: "admitted" });
      assert.deepEqual(await spend("key_1", "2026-01"), { reservedMicrousd: 999, spentMicrousd: 0 });
      await booksExact();
    });

    it("admits exactly as many concurrent requests as the budget covers, never more, by a key and its replacement together; another key of the organization is unaffected", async () => {
      const stores = [store, await opened.other()];
      const AMOUNT = 100;
      const COVERED = 7;
      const key1 = { keyId: "key_1", limit: COVERED * AMOUNT };
      // key_1's replacement by rotation, in its grace period: one budget with key_1.
      const key1b = { keyId: "key_1b", lineage: "key_1", limit: COVERED * AMOUNT };
      const key2 = { keyId: "key_2", limit: 10 * AMOUNT };
      const commands = [
        ...Array.from({ length: 40 }, (_, i) => paid(`k1_${i}`, AMOUNT, i % 2 ? key1b : key1)),
        ...Array.from({ length: 10 }, (_, i) => paid(`k2_${i}`, AMOUNT, key2)),
      ];
      // Interleaved, each its own commitBatch, alternating between the stores.
      const order = commands.map((c, i) => ({ c, at: (i * 37) % commands.length })).sort((a, b) => a.at - b.at);
      const results = await Promise.all(
        order.map(({ c }, i) =>
          stores[i % stores.length]!.commitBatch({ admissions: [c], completions: [] }).then((r) => ({ c, r: r.admissions[0]! })),
        ),
      );
      const admitted = (prefix: string) => results.filter(({ c, r }) => c.requestId.startsWith(prefix) && r.kind === "admitted");
      const refused = results.filter(({ r }) => r.kind !== "admitted").map(({ r }) => r);
      assert.equal(admitted("k1_").length, COVERED);
      assert.equal(admitted("k2_").length, 10);
      assert.deepEqual(
        new Set(refused.map((r) => JSON.stringify(r))),
        new Set([JSON.stringify({ kind: "key_budget_exhausted", remainingMicrousd: 0 })]),
      );
      assert.deepEqual(await spend("key_1"), { reservedMicrousd: COVERED * AMOUNT, spentMicrousd: 0 });
      assert.deepEqual(await spend("key_2"), { reservedMicrousd: 10 * AMOUNT, spentMicrousd: 0 });
      assert.deepEqual(await spend("key_1b"), { reservedMicrousd: 0, spentMicrousd: 0 });

      // Completed concurrently too, with different costs, one of them failed.
      const completions = results
        .filter(({ r }) => r.kind === "admitted")
        .map(({ c }, i) => {
          const lineage = c.keyBudget!.keyId;
          return i === 3 ? failed(c.requestId, lineage) : done(c.requestId, 10 + i, {}, lineage, DAY1);
        });
      await Promise.all(completions.map((c, i) => stores[(i + 1) % stores.length]!.commitBatch({ admissions: [], completions: [c] })));
      for (const keyId of ["key_1", "key_2"]) {
        const records = await costOfRecords(keyId, DAY1);
        assert.equal(records.n, keyId === "key_1" ? COVERED : 10, keyId);
        assert.deepEqual(await spend(keyId), { reservedMicrousd: 0, spentMicrousd: records.cost }, keyId);
      }
      await booksExact();
    });
  });
}
