/**
 * The service-wide preview counter handed out in blocks (quota.globalBlock), on real databases: one process's batches
 * use its block without writing the shared row, the row holds the units handed out, previewUsage reports the
 * requests counted, a closing store gives its unused units back, and two instances never pass the limit together.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import Database from "better-sqlite3";
import type { AdmitCommand, AdmitResult } from "../../src/domain/bookkeeping.ts";
import { GroupCommit } from "../../src/store/group-commit.ts";
import { openPostgresStore, type PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { admission } from "./store-contract.ts";

const SKIP_POSTGRES = process.env.TDS_SKIP_POSTGRES === "1";
const T0 = 1_767_225_600_000;
const DAY = "2026-01-01";
const ORGS = ["org_a", "org_b", "org_c"];

let n = 0;
const preview = (orgId: string, globalLimit: number, globalBlock: number): AdmitCommand =>
  admission({ requestId: `req_${++n}`, orgId, nowMs: T0, quota: { day: DAY, orgLimit: 1_000_000, globalLimit, globalBlock } });

async function admitOne(store: Store, command: AdmitCommand): Promise<AdmitResult> {
  return (await store.commitBatch({ admissions: [command], completions: [] })).admissions[0]!;
}

/**
 * The same checks on each database. `sharedRow` reads the '*' counter's row directly; `reopen` gives a store on the
 * same database (SQLite: after the first closed; one process writes a SQLite file).
 */
function describeBlocks(name: string, setup: { open(): Promise<Store>; sharedRow(): Promise<number> }) {
  describe(name, () => {
    it("the first request adds a block to the shared row; the next ones use it without writing it; close gives the rest back", async () => {
      const store = await setup.open();
      for (const id of ORGS) await store.createOrganization({ id, name: id, nowMs: T0 });
      assert.deepEqual(await admitOne(store, preview("org_a", 1000, 16)), { kind: "admitted" });
      assert.equal(await setup.sharedRow(), 16, "a block of 16 handed out");
      assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 1, global: 1 }, "the requests counted, not the units held");
      for (let i = 0; i < 15; i++) await admitOne(store, preview(ORGS[i % 3]!, 1000, 16));
      assert.equal(await setup.sharedRow(), 16, "15 more requests from the block: the shared row did not move");
      await admitOne(store, preview("org_b", 1000, 16));
      assert.equal(await setup.sharedRow(), 32, "the 17th took a new block");
      assert.deepEqual(await store.previewUsage("org_c", DAY), { org: 5, global: 17 });
      await store.close();
      assert.equal(await setup.sharedRow(), 17, "the 15 units held were given back at close");
    });

    it("one instance alone uses the whole limit: blocks shrink near it, and it is never passed", async () => {
      const store = await setup.open();
      const limit = 17 + 100;
      const results = [];
      for (let i = 0; i < 130; i++) results.push((await admitOne(store, preview(ORGS[i % 3]!, limit, 16))).kind);
      assert.equal(results.filter((k) => k === "admitted").length, 100);
      assert.deepEqual(results.slice(100), Array(30).fill("quota_exhausted"));
      assert.equal(await setup.sharedRow(), limit);
      assert.equal((await store.previewUsage("org_a", DAY)).global, limit);
      await store.close();
      assert.equal(await setup.sharedRow(), limit, "nothing held at the limit");
    });
  });
}

describe("the service-wide preview counter in blocks", () => {
  const dir = mkdtempSync(join(tmpdir(), "tds-blocks-"));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, "books.db");
  describeBlocks("SQLite", {
    open: async () => openSqliteStore(file),
    async sharedRow() {
      const db = new Database(file, { readonly: true });
      try {
        const row = db.prepare("SELECT count FROM preview_counters WHERE scope = '*' AND day = ?").get(DAY) as
          | { count: number }
          | undefined;
        return row?.count ?? 0;
      } finally {
        db.close();
      }
    },
  });

  describe("PostgreSQL", { skip: SKIP_POSTGRES, timeout: 120_000 }, () => {
    let db: Awaited<ReturnType<typeof createTestDatabase>>;
    let reader: PostgresStore;
    const opened: PostgresStore[] = [];
    const open = async () => {
      const store = await openPostgresStore(db.url, { poolSize: 6 });
      opened.push(store);
      return store;
    };
    const sharedRow = async () =>
      (await reader.pool.query<{ count: number }>("SELECT count FROM preview_counters WHERE scope = '*' AND day = $1", [DAY])).rows[0]
        ?.count ?? 0;
    before(async () => {
      db = await createTestDatabase("tds_blocks");
      reader = await openPostgresStore(db.url, { poolSize: 2 });
    });
    after(async () => {
      await Promise.all(opened.map((s) => s.close()));
      await reader.close();
      await db.drop();
    });

    describeBlocks("one instance", { open, sharedRow });

    it("two instances with four lanes each, many requests at once: never past the limit; closed, the row equals the requests counted", async () => {
      await reader.pool.query("TRUNCATE preview_counters, usage_records, usage_daily");
      const stores = [await open(), await open()];
      const instances = stores.map((s) => new GroupCommit(s, { lanes: 4 }));
      const limit = 500;
      const work: Promise<AdmitResult>[] = [];
      for (let turn = 0; turn < 12; turn++) {
        for (let i = 0; i < 50; i++) work.push(instances[i % 2]!.admit(preview(ORGS[(turn + i) % 3]!, limit, 16)));
        await new Promise((r) => setImmediate(r));
      }
      const results = await Promise.all(work);
      const admitted = results.filter((r) => r.kind === "admitted").length;
      assert.ok(admitted <= limit, `${admitted} admitted, limit ${limit}`);
      // Only units held unused can be missing: each lane of each instance may have added a block at once.
      assert.ok(admitted >= limit - 2 * 4 * 16, `${admitted} admitted of ${limit}`);
      assert.equal(results.length - admitted, results.filter((r) => r.kind === "quota_exhausted" && r.scope === "global").length);
      const counted = await sharedRow();
      assert.ok(counted >= admitted && counted <= limit, `the shared row ${counted}: between ${admitted} and ${limit}`);
      assert.equal((await reader.previewUsage("org_a", DAY)).global, admitted);
      await Promise.all(stores.map((s) => s.close()));
      assert.equal(await sharedRow(), admitted, "every unit held was given back");
    });
  });
});
