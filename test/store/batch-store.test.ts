import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import Database from "better-sqlite3";
import { ERROR_CATALOGUE } from "../../src/domain/errors.ts";
import { nameKey } from "../../src/domain/name-key.ts";
import { BATCH_ROWS_PER_CHUNK, Batches, type BatchStore, type ClaimedRequest, MAX_LINES_PER_CALL } from "../../src/store/batches.ts";
import { readMigrations } from "../../src/store/migration-files.ts";
import { POSTGRES_MIGRATIONS_DIR } from "../../src/store/postgres/postgres-migrations.ts";
import { openPostgresStore, type PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import type { SqlProgram, SqlRunner } from "../../src/store/sql-program.ts";
import { applyMigrations, SQLITE_MIGRATIONS_DIR } from "../../src/store/sqlite/migrations.ts";
import { sqliteRunner } from "../../src/store/sqlite/sqlite-accounts.ts";
import { openSqliteStore, type SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { eventually } from "../support/timer-race.ts";
import { type BatchStoreFixture, describeBatchStoreContract, lines, T0 } from "./batch-store-contract.ts";

const SKIP_POSTGRES = process.env.TDS_SKIP_POSTGRES === "1";
const DAY = 86_400_000;

const root = mkdtempSync(join(tmpdir(), "tds-batch-store-"));
after(() => rmSync(root, { recursive: true, force: true }));
let fileCount = 0;
const tempFile = () => join(root, `batches-${++fileCount}.sqlite`);

/** A folder holding the shipped migrations before `version`. */
function migrationsBefore(dir: string, version: number): string {
  const copy = mkdtempSync(join(root, "migrations-"));
  for (const m of readMigrations(dir).filter((m) => m.version < version)) copyFileSync(join(dir, m.file), join(copy, m.file));
  return copy;
}

/** Runs `fn` on a new SQLite store at `path` holding the organization org_a, then closes it. */
async function onSqliteStore(path: string, fn: (store: SqliteStore) => Promise<void>): Promise<void> {
  const store = openSqliteStore(path);
  try {
    await store.createOrganization({ id: "org_a", name: "Acme", nowMs: T0 });
    await fn(store);
  } finally {
    await store.close();
  }
}

/** Batches on `store` whose every statement, and the rows each write transaction changed (not read), are reported. */
function recording(store: SqliteStore, on: { onStatement?: (sql: string) => void; onTransaction?: (changes: number) => void }): Batches {
  const base = sqliteRunner(store.db, (fn) => Promise.resolve(fn()));
  function* observed<T>(program: SqlProgram<T>, counted: (changes: number) => void): SqlProgram<T> {
    let changes = 0;
    let step = program.next();
    while (!step.done) {
      on.onStatement?.(step.value.sql);
      const result = yield step.value;
      if (!/^\s*SELECT/.test(step.value.sql)) changes += result.changes;
      step = program.next(result);
    }
    counted(changes);
    return step.value;
  }
  const runner: SqlRunner = {
    ...base,
    read: (program) => base.read(() => observed(program(), () => undefined)),
    write: (program) => base.write(() => observed(program(), (n) => on.onTransaction?.(n))),
  };
  return new Batches(runner, "sqlite");
}

function queryPlan(store: SqliteStore, sql: string, ...params: unknown[]): string {
  return (store.db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...params) as { detail: string }[]).map((p) => p.detail).join("\n");
}

/** Statements the migration's CHECKs and keys refuse (a batch `b` of org_a with 2 lines exists). */
const REFUSED = [
  "UPDATE batches SET status = 'paused' WHERE id = 'b'",
  "UPDATE batches SET succeeded = 3 WHERE id = 'b'",
  "UPDATE batches SET status = 'completed', ended_at_ms = 5 WHERE id = 'b'",
  "UPDATE batches SET ended_at_ms = 5 WHERE id = 'b'",
  "UPDATE batches SET cost_microusd = -1 WHERE id = 'b'",
  "UPDATE batches SET idempotency_key = 'k' WHERE id = 'b'",
  "UPDATE batches SET org_id = 'org_missing' WHERE id = 'b'",
  "UPDATE batches SET expired = 1 WHERE id = 'b'",
  "UPDATE batches SET touched_at_ms = 0 WHERE id = 'b'",
  "UPDATE batch_requests SET state = 'claimed' WHERE batch_id = 'b' AND position = 0",
  "UPDATE batch_requests SET state = 'done' WHERE batch_id = 'b' AND position = 0",
  "UPDATE batch_requests SET custom_id = 'c1' WHERE batch_id = 'b' AND position = 0",
  "UPDATE batch_requests SET position = -1 WHERE batch_id = 'b' AND position = 0",
  "UPDATE batch_requests SET custom_id = '' WHERE batch_id = 'b' AND position = 0",
  "INSERT INTO batch_requests (batch_id, position, custom_id, body) VALUES ('missing', 0, 'c', '{}')",
];

async function seedRefusable(batches: BatchStore): Promise<void> {
  await batches.beginBatch({ id: "b", orgId: "org_a", keyId: "k", model: null, nowMs: T0, expiresAtMs: T0 + DAY });
  await batches.addLines("b", lines(2), T0);
  await batches.openBatch({ batchId: "b", total: 2, inputBytes: 2, nowMs: T0, idempotency: null });
}

describeBatchStoreContract("sqlite (temp file)", async (): Promise<BatchStoreFixture> => {
  const store = openSqliteStore(tempFile());
  return {
    batches: store.batches,
    createOrganization: async (id) => void (await store.createOrganization({ id, name: `name of ${id}`, nowMs: T0 })),
    countRequests: async (batchId) =>
      (store.db.prepare("SELECT count(*) AS n FROM batch_requests WHERE batch_id = ?").get(batchId) as { n: number }).n,
    close: () => store.close(),
  };
});

describe("batches on SQLite", () => {
  it("migration 011 applies to a database at 010 and keeps its rows", async () => {
    const path = tempFile();
    // The rows as the service wrote them at 010: the store of today writes columns of later migrations.
    const old = new Database(path);
    try {
      assert.deepEqual(applyMigrations(old, readMigrations(migrationsBefore(SQLITE_MIGRATIONS_DIR, 11))).at(-1), 10);
      old
        .prepare("INSERT INTO organizations (id, name, paused, created_at_ms, name_key) VALUES (?, ?, 0, ?, ?)")
        .run("org_a", "Acme", T0, nameKey("Acme"));
      assert.equal(old.prepare("SELECT count(*) AS n FROM sqlite_master WHERE name = 'batches'").pluck().get(), 0);
    } finally {
      old.close();
    }
    const store = openSqliteStore(path);
    try {
      assert.deepEqual(store.db.prepare("SELECT version, name FROM schema_migrations WHERE version = 11").get(), {
        version: 11,
        name: "batches",
      });
      const org = { id: "org_a", name: "Acme", paused: false, createdAtMs: T0 };
      assert.deepEqual(await store.findOrganization("org_a"), org);
      assert.deepEqual(await store.findOrganization("Acme"), org);
      const { batches } = store;
      await seedRefusable(batches);
      assert.equal((await batches.getBatch("org_a", "b"))?.total, 2);
    } finally {
      await store.close();
    }
  });

  it("the store's batches report a connection gone, and use the connection the store opens again", async () => {
    const reopened: string[] = [];
    const store = openSqliteStore(tempFile(), { onReopen: (event) => reopened.push(event.message) });
    try {
      await store.createOrganization({ id: "org_a", name: "Acme", nowMs: T0 });
      await seedRefusable(store.batches);
      const first = store.db;
      first.close();
      const claim = { instanceId: "i", nowMs: T0 + 1, leaseUntilMs: T0 + 9, limit: 5 };
      await assert.rejects(store.batches.claimRequests(claim), /The database connection is not open/);
      // Only the batch store's failure told the store: it opens the file again on its own.
      await eventually("the store to open its file again", () => (store.db !== first && store.db.open ? true : undefined), 10_000);
      assert.equal(reopened.length, 1);
      assert.match(reopened[0]!, /takes writes again/);
      const claimed = await store.batches.claimRequests(claim);
      assert.deepEqual(
        claimed.map((c) => c.position),
        [0, 1],
      );
      for (const c of claimed)
        assert.equal(await store.batches.finishRequest({ ...c, status: 200, body: "{}", costMicrousd: 3, nowMs: T0 + 2 }), true);
      const batch = await store.batches.getBatch("org_a", "b");
      assert.deepEqual([batch?.status, batch?.succeeded, batch?.costMicrousd], ["completed", 2, 6]);
      assert.equal(store.db.prepare("SELECT count(*) FROM batch_requests WHERE state = 'done'").pluck().get(), 2);
    } finally {
      await store.close();
    }
  });

  it("the migration's checks and keys refuse inconsistent rows", () =>
    onSqliteStore(tempFile(), async (store) => {
      await seedRefusable(store.batches);
      for (const sql of REFUSED) assert.throws(() => store.db.exec(sql), /constraint failed/, sql);
    }));

  it("no transaction changes more than a chunk of rows: cancel, expiry, drop and purge of a large batch", () =>
    onSqliteStore(tempFile(), async (store) => {
      const changes: number[] = [];
      const batches = recording(store, { onTransaction: (n) => changes.push(n) });
      const size = 2 * BATCH_ROWS_PER_CHUNK + 1;
      for (const id of ["b_cancel", "b_expire", "b_drop"]) {
        await batches.beginBatch({ id, orgId: "org_a", keyId: "k", model: null, nowMs: T0, expiresAtMs: T0 + DAY });
        for (let from = 0; from < size; from += MAX_LINES_PER_CALL)
          await batches.addLines(id, lines(Math.min(MAX_LINES_PER_CALL, size - from), from), T0);
        if (id !== "b_drop") await batches.openBatch({ batchId: id, total: size, inputBytes: 1, nowMs: T0, idempotency: null });
      }
      changes.length = 0;
      assert.equal((await batches.cancelBatch("org_a", "b_cancel", T0 + 1))?.status, "cancelled");
      assert.equal(await batches.expireBatches(T0 + DAY), size);
      assert.equal(await batches.dropBatch("b_drop"), true);
      assert.equal(await batches.purgeBatches({ endedBeforeMs: T0 + 2 * DAY, untouchedBeforeMs: T0 + 2 * DAY, limit: 10 }), 2);
      assert.equal(store.db.prepare("SELECT count(*) FROM batch_requests").pluck().get(), 0);
      // A chunk of requests, plus the batch row it counts into or deletes.
      assert.ok(Math.max(...changes) <= BATCH_ROWS_PER_CHUNK + 1, `changes a transaction: ${changes.join(", ")}`);
      assert.ok(changes.filter((n) => n > BATCH_ROWS_PER_CHUNK / 2).length >= 4 * 2, "the work went in several transactions");
    }));

  it("a cancel interrupted between chunks is finished by the next expiry pass", () =>
    onSqliteStore(tempFile(), async (store) => {
      const { batches } = store;
      await batches.beginBatch({ id: "b", orgId: "org_a", keyId: "k", model: null, nowMs: T0, expiresAtMs: T0 + DAY });
      await batches.addLines("b", lines(5), T0);
      await batches.openBatch({ batchId: "b", total: 5, inputBytes: 1, nowMs: T0, idempotency: null });
      // The status is set first; the process died before any request ended.
      store.db.prepare("UPDATE batches SET status = 'cancelling' WHERE id = 'b'").run();
      assert.deepEqual(await batches.claimRequests({ instanceId: "i", nowMs: T0 + 1, leaseUntilMs: T0 + 9, limit: 5 }), []);
      assert.equal(await batches.expireBatches(T0 + 2), 5);
      const batch = await batches.getBatch("org_a", "b");
      assert.deepEqual([batch?.status, batch?.failed, batch?.endedAtMs], ["cancelled", 5, T0 + 2]);
      const results = (await batches.results("org_a", "b", { afterPosition: -1, limit: 10 }))!;
      assert.ok(results.every((r) => r.status === 409 && r.body === JSON.stringify({ detail: ERROR_CATALOGUE.batch_cancelled.detail })));
    }));

  it("claims, results pages, lists, the purge and expiry seek their indexes", () =>
    onSqliteStore(":memory:", async (store) => {
      const statements = new Set<string>();
      const batches = recording(store, { onStatement: (sql) => statements.add(sql) });
      for (const id of ["b1", "b2", "b3"]) {
        await batches.beginBatch({ id, orgId: "org_a", keyId: "k", model: null, nowMs: T0, expiresAtMs: T0 + DAY });
        await batches.addLines(id, lines(2), T0);
        await batches.openBatch({ batchId: id, total: 2, inputBytes: 1, nowMs: T0, idempotency: null });
      }
      const claimed = await batches.claimRequests({ instanceId: "i", nowMs: T0 + 1, leaseUntilMs: T0 + 9, limit: 4, perOrgLimit: 5 });
      for (const c of claimed) await batches.finishRequest({ ...c, status: 200, body: "{}", costMicrousd: 0, nowMs: T0 + 2 });
      const page = await batches.listBatches("org_a", { limit: 1 });
      await batches.listBatches("org_a", { limit: 1, cursor: page.nextCursor! });
      await batches.results("org_a", "b1", { afterPosition: -1, limit: 5 });
      await batches.expireBatches(T0 + DAY);
      await batches.purgeBatches({ endedBeforeMs: T0 + DAY, untouchedBeforeMs: T0 + DAY, limit: 5 });
      const planOf = (pattern: RegExp) => {
        const found = [...statements].filter((sql) => pattern.test(sql));
        assert.equal(found.length, 1, `one statement matches ${pattern}: ${JSON.stringify(found)}`);
        const params = Array((found[0]!.match(/\?/g) ?? []).length).fill(1);
        return queryPlan(store, found[0]!, ...params);
      };
      const expect = (pattern: RegExp, index: RegExp) => {
        const plan = planOf(pattern);
        assert.match(plan, index, plan);
        assert.doesNotMatch(plan, /SCAN batch_requests\b(?! USING)|SCAN batches\b(?! USING)|TEMP B-TREE FOR ORDER BY/, plan);
      };
      const claimedRows = /SEARCH batch_requests USING INDEX batch_requests_open \(batch_id=\?\)/;
      expect(/^UPDATE batch_requests AS r SET state = 'claimed'/, claimedRows);
      expect(
        /^UPDATE batch_requests AS r SET state = 'claimed'/,
        /SEARCH r USING INDEX sqlite_autoindex_batch_requests_1 \(batch_id=\? AND position=\?\)/,
      );
      expect(/FROM batches WHERE status IN \('queued', 'running', 'cancelling'\)\s+ORDER BY/, /SCAN batches USING INDEX batches_active/);
      expect(/FROM batch_requests r JOIN batches b/, /SCAN r USING INDEX batch_requests_claimed/);
      expect(
        /^SELECT position, custom_id, request_id, result_status/,
        /SEARCH batch_requests USING INDEX sqlite_autoindex_batch_requests_1 \(batch_id=\? AND position>\?\)/,
      );
      expect(/WHERE org_id = \? AND status <> 'validating' ORDER BY/, /SEARCH batches USING INDEX batches_by_org \(org_id=\?\)/);
      expect(
        /WHERE org_id = \? AND status <> 'validating' AND \(created_at_ms, id\) </,
        /SEARCH batches USING INDEX batches_by_org \(org_id=\?/,
      );
      expect(/AND \(status = 'cancelling' OR expires_at_ms <= \?\)/, /SCAN batches USING INDEX batches_active/);
      expect(/^UPDATE batch_requests SET state = 'done', result_status = \?, result_body = \?, cost_microusd = 0/, claimedRows);
      expect(
        /^SELECT id FROM batches WHERE ended_at_ms IS NOT NULL AND ended_at_ms < \? ORDER BY/,
        /SEARCH batches USING INDEX batches_by_end \(ended_at_ms>\? AND ended_at_ms<\?\)/,
      );
      expect(
        /^SELECT id FROM batches WHERE status = 'validating' AND touched_at_ms < \? ORDER BY/,
        /SEARCH batches USING INDEX batches_validating \(touched_at_ms<\?\)/,
      );
      expect(
        /^DELETE FROM batch_requests WHERE batch_id = \?/,
        /SEARCH batch_requests USING COVERING INDEX sqlite_autoindex_batch_requests_1 \(batch_id=\? AND position>\?\)/,
      );
    }));
});

describe("batches on PostgreSQL", { skip: SKIP_POSTGRES }, () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let store: PostgresStore;
  const opened: PostgresStore[] = [];

  before(async () => {
    database = await createTestDatabase("tds_batches");
    store = await openPostgresStore(database.url);
    opened.push(store);
  });
  after(async () => {
    for (const s of opened) await s.close().catch(() => undefined);
    await database?.drop();
  });

  /** The test database emptied of organizations and batches. */
  async function emptied(): Promise<PostgresStore> {
    await store.pool.query("TRUNCATE batch_requests, batches, organizations CASCADE");
    return store;
  }

  const countRequests = async (batchId: string) =>
    (await store.pool.query<{ n: number }>("SELECT count(*) AS n FROM batch_requests WHERE batch_id = $1", [batchId])).rows[0]!.n;

  describeBatchStoreContract("postgres", async (): Promise<BatchStoreFixture> => {
    const s = await emptied();
    return {
      batches: s.batches,
      createOrganization: async (id) => void (await s.createOrganization({ id, name: `name of ${id}`, nowMs: T0 })),
      countRequests,
      close: async () => undefined,
    };
  });

  it("instances claiming at the same moment never claim one request, and concurrent finishes count each once", async () => {
    await emptied();
    const other = await openPostgresStore(database.url);
    opened.push(other);
    for (const org of ["org_a", "org_b"]) await store.createOrganization({ id: org, name: org, nowMs: T0 });
    const instances = [store.batches, other.batches];
    const sizes = { batch_1: 200, batch_2: 150, batch_3: 100 };
    for (const [i, [id, count]] of Object.entries(sizes).entries()) {
      await instances[0]!.beginBatch({
        id,
        orgId: i === 1 ? "org_b" : "org_a",
        keyId: "k",
        model: null,
        nowMs: T0 + i,
        expiresAtMs: T0 + DAY,
      });
      await instances[0]!.addLines(id, lines(count), T0 + i);
      await instances[0]!.openBatch({ batchId: id, total: count, inputBytes: count, nowMs: T0 + i, idempotency: null });
    }
    const claimedBy = new Map<string, string>();
    const claims: ClaimedRequest[] = [];
    const claimer = async (n: number) => {
      const instanceId = `i${n}`;
      for (;;) {
        const got = await instances[n % 2]!.claimRequests({ instanceId, nowMs: T0 + 1000, leaseUntilMs: T0 + 60_000, limit: 3 });
        if (got.length === 0) return;
        for (const c of got) {
          const key = `${c.batchId}:${c.position}`;
          assert.equal(claimedBy.get(key), undefined, `${key} claimed by ${claimedBy.get(key)} and ${instanceId}`);
          claimedBy.set(key, instanceId);
          claims.push(c);
        }
      }
    };
    await Promise.all(Array.from({ length: 16 }, (_, n) => claimer(n)));
    assert.equal(claimedBy.size, 450, "every request claimed once");
    const { rows } = await store.pool.query<{ key: string; claimed_by: string }>(
      "SELECT batch_id || ':' || position AS key, claimed_by FROM batch_requests WHERE state = 'claimed'",
    );
    assert.equal(rows.length, 450);
    for (const row of rows) assert.equal(row.claimed_by, claimedBy.get(row.key), row.key);

    const finished = await Promise.all(
      claims.map((c, i) =>
        instances[i % 2]!.finishRequest({
          batchId: c.batchId,
          position: c.position,
          requestId: c.requestId,
          status: c.position % 2 === 0 ? 200 : 502,
          body: "{}",
          costMicrousd: c.position,
          nowMs: T0 + 2000,
        }),
      ),
    );
    assert.ok(finished.every(Boolean));
    for (const [id, count] of Object.entries(sizes)) {
      const batch = await instances[1]!.getBatch(id === "batch_2" ? "org_b" : "org_a", id);
      assert.deepEqual(
        [batch?.status, batch?.succeeded, batch?.failed, batch?.costMicrousd],
        ["completed", Math.ceil(count / 2), Math.floor(count / 2), (count * (count - 1)) / 2],
        id,
      );
    }
  });

  it("claimers at the same moment never hold more than perOrgLimit live claims of an organization", async () => {
    await emptied();
    const other = await openPostgresStore(database.url);
    opened.push(other);
    const instances = [store.batches, other.batches];
    for (const [i, org] of ["org_a", "org_b"].entries()) {
      await store.createOrganization({ id: org, name: org, nowMs: T0 });
      for (const n of [1, 2]) {
        const id = `${org}_batch_${n}`;
        await instances[0]!.beginBatch({ id, orgId: org, keyId: "k", model: null, nowMs: T0 + i, expiresAtMs: T0 + DAY });
        await instances[0]!.addLines(id, lines(40), T0 + i);
        await instances[0]!.openBatch({ batchId: id, total: 40, inputBytes: 40, nowMs: T0 + i, idempotency: null });
      }
    }
    const perOrgLimit = 5;
    const claimer = async (n: number) => {
      for (let round = 0; round < 4; round++) {
        await instances[n % 2]!.claimRequests({ instanceId: `i${n}`, nowMs: T0 + 1000, leaseUntilMs: T0 + 60_000, limit: 2, perOrgLimit });
      }
    };
    await Promise.all(Array.from({ length: 16 }, (_, n) => claimer(n)));
    const { rows } = await store.pool.query<{ org_id: string; n: number }>(
      `SELECT b.org_id, count(*)::int AS n FROM batch_requests r JOIN batches b ON b.id = r.batch_id
       WHERE r.state = 'claimed' GROUP BY b.org_id ORDER BY b.org_id`,
    );
    assert.deepEqual(
      rows.map((r) => [r.org_id, r.n]),
      [
        ["org_a", perOrgLimit],
        ["org_b", perOrgLimit],
      ],
    );
  });

  it("migration 011 applies to a database at 010; the checks and keys refuse inconsistent rows", async () => {
    const fresh = await createTestDatabase("tds_batches_mig");
    try {
      const old = await openPostgresStore(fresh.url, { migrationsDir: migrationsBefore(POSTGRES_MIGRATIONS_DIR, 11) });
      await old.createOrganization({ id: "org_a", name: "Acme", nowMs: T0 });
      assert.equal((await old.pool.query("SELECT to_regclass('batches') AS t")).rows[0].t, null);
      await old.close();
      const migrated = await openPostgresStore(fresh.url);
      try {
        assert.deepEqual(migrated.migrations.applied[0], { version: 11, name: "batches" }, "011 first, then any later one");
        assert.equal((await migrated.findOrganization("org_a"))?.name, "Acme");
        await seedRefusable(migrated.batches);
        for (const sql of REFUSED) await assert.rejects(migrated.pool.query(sql), /violates/, sql);
      } finally {
        await migrated.close();
      }
    } finally {
      await fresh.drop();
    }
  });
});
