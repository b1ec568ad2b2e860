import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import { hashApiKey } from "../../src/gateway/api-keys.ts";
import { openStore, sqlitePathOf } from "../../src/store/open-store.ts";
import { applyMigrations, readMigrations, SQLITE_MIGRATIONS_DIR } from "../../src/store/sqlite/migrations.ts";
import { DUE_RESERVATIONS_SQL } from "../../src/store/sqlite/sqlite-credits.ts";
import { openSqliteStore, usageListQuery } from "../../src/store/sqlite/sqlite-store.ts";
import type { UsageQuery } from "../../src/store/store.ts";
import { decodeUsageCursor, encodeUsageCursor } from "../../src/store/usage-cursor.ts";
import { describeStoreContract, usageRecord } from "./store-contract.ts";

const root = mkdtempSync(join(tmpdir(), "tds-store-test-"));
after(() => rmSync(root, { recursive: true, force: true }));
let fileCount = 0;
const tempFile = (name = "tds") => join(root, `${name}-${++fileCount}.sqlite`);
const tempDir = (name: string) => mkdtempSync(join(root, `${name}-`));

describeStoreContract("sqlite (temp file)", async () => openSqliteStore(tempFile()));

const MIGRATION_COUNT = readMigrations().length;
const SQLITE_STORE_MODULE = fileURLToPath(new URL("../../src/store/sqlite/sqlite-store.ts", import.meta.url));

/** Runs openSqliteStore in `count` separate processes that all start at the same moment. */
async function openInProcesses(count: number, path: string, migrationsDir: string): Promise<{ code: number | null; stderr: string }[]> {
  const startAt = Date.now() + 1500;
  const code = `
    const { openSqliteStore } = await import(${JSON.stringify(SQLITE_STORE_MODULE)});
    while (Date.now() < ${startAt}) await new Promise((r) => setTimeout(r, 1));
    const store = openSqliteStore(${JSON.stringify(path)}, { migrationsDir: ${JSON.stringify(migrationsDir)} });
    await store.close();
  `;
  return Promise.all(
    Array.from(
      { length: count },
      () =>
        new Promise<{ code: number | null; stderr: string }>((resolve) => {
          const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", code], { stdio: ["ignore", "ignore", "pipe"] });
          let stderr = "";
          child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
          child.on("close", (exitCode) => resolve({ code: exitCode, stderr }));
        }),
    ),
  );
}

/** Runs `count` processes that each try `attempts` reservations of `amount` from org_1, all starting at one moment. */
async function reserveInProcesses(count: number, path: string, attempts: number, amount: number): Promise<number[]> {
  const startAt = Date.now() + 1500;
  const code = (worker: number) => `
    const { openSqliteStore } = await import(${JSON.stringify(SQLITE_STORE_MODULE)});
    const store = openSqliteStore(${JSON.stringify(path)});
    while (Date.now() < ${startAt}) await new Promise((r) => setTimeout(r, 1));
    let reserved = 0;
    for (let i = 0; i < ${attempts}; i++) {
      const id = "w${worker}_" + i;
      const now = Date.now();
      const result = await store.reserveCredits({ reservationId: id, orgId: "org_1", requestId: id, amountMicrousd: ${amount}, nowMs: now, expiresAtMs: now + 3600000 });
      if (result === "reserved") reserved++;
      // A pause now and then lets the other processes take the lock in between.
      if (i % 10 === 9) await new Promise((r) => setTimeout(r, 1));
    }
    await store.close();
    process.stdout.write(JSON.stringify({ reserved }));
  `;
  const runs = await Promise.all(
    Array.from(
      { length: count },
      (_, worker) =>
        new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
          const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", code(worker)], { stdio: ["ignore", "pipe", "pipe"] });
          let stdout = "";
          let stderr = "";
          child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
          child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
          child.on("close", (exitCode) => resolve({ code: exitCode, stdout, stderr }));
        }),
    ),
  );
  return runs.map((run) => {
    assert.equal(run.code, 0, run.stderr);
    return (JSON.parse(run.stdout) as { reserved: number }).reserved;
  });
}

describe("SQLite store", () => {
  it("sets WAL, busy_timeout, foreign keys and synchronous=NORMAL", async () => {
    const store = openSqliteStore(tempFile());
    try {
      assert.equal(store.dialect, "sqlite");
      assert.equal(store.db.pragma("journal_mode", { simple: true }), "wal");
      assert.equal(store.db.pragma("busy_timeout", { simple: true }), 5000);
      assert.equal(store.db.pragma("foreign_keys", { simple: true }), 1);
      assert.equal(store.db.pragma("synchronous", { simple: true }), 1);
    } finally {
      await store.close();
    }
  });

  it("creates missing parent folders", async () => {
    const path = join(tempDir("nested"), "a", "b", "c", "tds.sqlite");
    const store = openSqliteStore(path);
    await store.close();
    assert.ok(existsSync(path));
  });

  it("records each migration once in schema_migrations", async () => {
    const store = openSqliteStore(tempFile());
    try {
      const rows = store.db.prepare("SELECT version, name, applied_at_ms FROM schema_migrations ORDER BY version").all() as {
        version: number;
        name: string;
        applied_at_ms: number;
      }[];
      assert.deepEqual(
        rows.map((r) => [r.version, r.name]),
        readMigrations().map((m) => [m.version, m.name]),
      );
      assert.equal(rows[0]?.version, 1);
      assert.equal(rows[0]?.name, "initial");
      assert.ok(rows.every((r) => Math.abs(r.applied_at_ms - Date.now()) < 60_000));
    } finally {
      await store.close();
    }
  });

  it("applies migrations once when two stores open the same file, and both see each other's writes", async () => {
    const path = tempFile();
    const a = openSqliteStore(path);
    const b = openSqliteStore(path);
    try {
      const count = b.db.prepare("SELECT count(*) AS n, count(DISTINCT version) AS d FROM schema_migrations").get() as { n: number; d: number };
      assert.deepEqual(count, { n: MIGRATION_COUNT, d: MIGRATION_COUNT });
      const org = await a.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
      assert.deepEqual(await b.findOrganization("Acme"), org);
      await b.setOrganizationPaused("org_1", true);
      assert.equal((await a.findOrganization("org_1"))?.paused, true);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("applies a slow migration exactly once when several processes open a new file at the same moment", async () => {
    const dir = tempDir("migrations-slow");
    for (const file of readdirSync(SQLITE_MIGRATIONS_DIR)) copyFileSync(join(SQLITE_MIGRATIONS_DIR, file), join(dir, file));
    // Not idempotent and slow (~0.1 s): a second run would fail with "table slow already exists".
    writeFileSync(
      join(dir, "900_slow.sql"),
      "CREATE TABLE slow AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) SELECT x FROM c;\n",
    );
    const path = tempFile("race");
    const results = await openInProcesses(4, path, dir);
    for (const r of results) assert.equal(r.code, 0, r.stderr);
    const db = new Database(path, { readonly: true });
    try {
      const versions = (db.prepare("SELECT version FROM schema_migrations ORDER BY version").all() as { version: number }[]).map((r) => r.version);
      assert.deepEqual(versions, [...readMigrations().map((m) => m.version), 900]);
      assert.deepEqual(db.prepare("SELECT count(*) AS n FROM slow").get(), { n: 300000 });
    } finally {
      db.close();
    }
  });

  it("processes reserving from one balance at the same moment never overdraw it", async () => {
    const path = tempFile("reserve-race");
    const setup = openSqliteStore(path);
    await setup.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
    await setup.grantCredits({ orgId: "org_1", amountMicrousd: 10_000, nowMs: 2 });
    await setup.close();
    // 4 × 500 attempts of 7 for 10,000: exactly floor(10000 / 7) = 1428 can succeed.
    const perProcess = await reserveInProcesses(4, path, 500, 7);
    assert.equal(perProcess.reduce((a, b) => a + b, 0), 1428, `reserved per process: ${perProcess.join(", ")}`);
    assert.ok(perProcess.filter((n) => n > 0).length >= 2, `the processes overlapped: ${perProcess.join(", ")}`);
    const store = openSqliteStore(path);
    try {
      assert.deepEqual(await store.getBalance("org_1"), { available: 10_000 - 1428 * 7, reserved: 1428 * 7, spent: 0, granted: 10_000 });
      assert.deepEqual(store.db.prepare("SELECT count(*) AS n, sum(amount_microusd) AS total FROM reservations WHERE status = 'pending'").get(), { n: 1428, total: 9996 });
      const order = store.db.prepare("SELECT id FROM reservations ORDER BY rowid").pluck().all() as string[];
      const switches = order.filter((id, i) => i > 0 && id.split("_")[0] !== order[i - 1]!.split("_")[0]).length;
      assert.ok(switches > 3, `the processes took turns, not one after another (${switches} switches)`);
      const sums = store.db
        .prepare("SELECT sum(available_delta) AS available, sum(reserved_delta) AS reserved, sum(spent_delta) AS spent, sum(granted_delta) AS granted FROM ledger_entries WHERE org_id = 'org_1'")
        .get();
      assert.deepEqual(sums, await store.getBalance("org_1"));
    } finally {
      await store.close();
    }
  });

  it("keeps data when reopened", async () => {
    const path = tempFile();
    const first = openSqliteStore(path);
    const org = await first.createOrganization({ id: "org_1", name: "Zürich ☕", nowMs: 10 });
    const key = await first.createApiKey({ id: "k1", orgId: "org_1", name: "ci", hash: hashApiKey("raw"), nowMs: 11 });
    const record = usageRecord({ requestId: "req_1", orgId: "org_1", keyId: "k1" });
    await first.insertUsage(record);
    await first.revokeApiKey("k1", 12);
    await first.close();

    const second = openSqliteStore(path);
    try {
      assert.deepEqual(await second.findOrganization("Zürich ☕"), org);
      assert.deepEqual(await second.findApiKey("k1"), { key: { ...key, revokedAtMs: 12 }, org });
      assert.deepEqual(await second.getUsage("org_1", "req_1"), record);
      const count = second.db.prepare("SELECT count(*) AS n FROM schema_migrations").get() as { n: number };
      assert.equal(count.n, MIGRATION_COUNT, "reopening applies nothing again");
    } finally {
      await second.close();
    }
  });

  it("refuses to store a raw key or anything else that is not a sha256 hex hash", async () => {
    const store = openSqliteStore(tempFile());
    try {
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
      const raw = "tds_abcdefghijkl_" + "A".repeat(43);
      for (const hash of [raw, hashApiKey("x").toUpperCase(), "abc", ""]) {
        await assert.rejects(store.createApiKey({ id: "k1", orgId: "org_1", name: null, hash, nowMs: 2 }));
      }
      await store.createApiKey({ id: "k1", orgId: "org_1", name: null, hash: hashApiKey(raw), nowMs: 2 });
    } finally {
      await store.close();
    }
  });

  it("pages usage with an index seek, not a scan of earlier pages", async () => {
    const store = openSqliteStore(":memory:");
    try {
      const cursor = encodeUsageCursor({ createdAtMs: 5000, requestId: "req_5" });
      const queries: UsageQuery[] = [
        { limit: 10 },
        { limit: 10, cursor },
        { limit: 10, cursor, fromMs: 0 },
        { limit: 10, cursor, fromMs: 0, toMs: 9000 },
        { limit: 10, cursor, fromMs: 0, toMs: 3000 },
        { limit: 10, cursor, toMs: 9000, outcome: "succeeded" },
      ];
      for (const query of queries) {
        const { sql, params } = usageListQuery("org", query);
        const plan = (store.db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...params) as { detail: string }[]).map((p) => p.detail).join("\n");
        assert.match(plan, /SEARCH usage_records USING INDEX usage_records_by_org_time \(org_id=\?/, JSON.stringify(query));
        assert.doesNotMatch(plan, /TEMP B-TREE/);
        if (query.cursor && !(query.toMs !== undefined && query.toMs <= 5000)) assert.match(plan, /\(created_at_ms,request_id\)<\(\?,\?\)/, JSON.stringify(query));
      }
    } finally {
      await store.close();
    }
  });

  it("the expiry sweep seeks the index of pending reservations by expiry time", async () => {
    const store = openSqliteStore(":memory:");
    try {
      const plan = (store.db.prepare(`EXPLAIN QUERY PLAN ${DUE_RESERVATIONS_SQL}`).all(1000, 10) as { detail: string }[]).map((p) => p.detail).join("\n");
      assert.match(plan, /SEARCH reservations USING INDEX reservations_by_status_expiry \(status=\? AND expires_at_ms<\?\)/);
      assert.doesNotMatch(plan, /TEMP B-TREE/);
    } finally {
      await store.close();
    }
  });

  it("the schema itself refuses balances, reservations and ledger entries that break the invariants", async () => {
    const store = openSqliteStore(":memory:");
    try {
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
      await store.grantCredits({ orgId: "org_1", amountMicrousd: 1000, nowMs: 2 });
      await store.reserveCredits({ reservationId: "r1", orgId: "org_1", requestId: "q1", amountMicrousd: 100, nowMs: 3, expiresAtMs: 10 });
      const db = store.db;
      const refused = [
        "UPDATE org_balances SET available = available + 1",
        "UPDATE org_balances SET available = -1, granted = granted - 901",
        "UPDATE org_balances SET reserved = reserved - 101, granted = granted - 101",
        "UPDATE reservations SET status = 'settled', cost_microusd = 101, resolved_at_ms = 4",
        "UPDATE reservations SET status = 'settled', resolved_at_ms = 4",
        "UPDATE reservations SET status = 'expired'",
        "UPDATE reservations SET status = 'cancelled', resolved_at_ms = 4",
        "INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms) VALUES ('org_1', 'grant', NULL, 5, 0, 0, 4, 5)",
        "INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms) VALUES ('org_1', 'settle', NULL, 0, 0, 0, 0, 5)",
        "INSERT INTO org_balances (org_id) VALUES ('org_missing')",
        "INSERT INTO preview_counters (scope, day, count) VALUES ('org_1', '2026-1-1', 1)",
        "INSERT INTO idempotency_keys (org_id, key, request_hash, request_id, state, lock_until_ms, expires_at_ms) VALUES ('org_1', 'k', 'h', 'q', 'completed', 1, 2)",
      ];
      for (const sql of refused) assert.throws(() => db.exec(sql), /constraint failed/, sql);
      assert.deepEqual(await store.getBalance("org_1"), { available: 900, reserved: 100, spent: 0, granted: 1000 });
    } finally {
      await store.close();
    }
  });

  it("in-memory stores are separate", async () => {
    const a = openSqliteStore(":memory:");
    const b = openSqliteStore(":memory:");
    await a.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
    assert.equal(await b.countOrganizations(), 0);
    await a.close();
    await b.close();
  });
});

describe("SQLite migrations", () => {
  function migrationDir(files: Record<string, string>): string {
    const dir = tempDir("migrations");
    for (const [name, sql] of Object.entries(files)) writeFileSync(join(dir, name), sql);
    return dir;
  }

  it("applies pending migrations in version order, once", () => {
    const dir = migrationDir({
      "010_third.sql": "INSERT INTO log VALUES ('010');",
      "001_first.sql": "CREATE TABLE log (v TEXT);",
      "002_second.sql": "INSERT INTO log VALUES ('002');",
      "README.md": "not a migration",
    });
    const db = new Database(":memory:");
    try {
      assert.deepEqual(applyMigrations(db, readMigrations(dir)), [1, 2, 10]);
      assert.deepEqual(applyMigrations(db, readMigrations(dir)), []);
      assert.deepEqual(db.prepare("SELECT v FROM log").pluck().all(), ["002", "010"]);
      writeFileSync(join(dir, "011_fourth.sql"), "INSERT INTO log VALUES ('011');");
      assert.deepEqual(applyMigrations(db, readMigrations(dir)), [11]);
      assert.deepEqual(db.prepare("SELECT version, name FROM schema_migrations ORDER BY version").all(), [
        { version: 1, name: "first" },
        { version: 2, name: "second" },
        { version: 10, name: "third" },
        { version: 11, name: "fourth" },
      ]);
    } finally {
      db.close();
    }
  });

  it("rolls back the whole run when a migration fails, naming the file", () => {
    const dir = migrationDir({
      "001_ok.sql": "CREATE TABLE a (x INTEGER);",
      "002_broken.sql": "CREATE TABLE b (x INTEGER); INSERT INTO nowhere VALUES (1);",
    });
    const db = new Database(":memory:");
    try {
      assert.throws(() => applyMigrations(db, readMigrations(dir)), /002_broken\.sql/);
      assert.equal(db.inTransaction, false);
      const tables = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").pluck().all();
      assert.deepEqual(tables, []);
    } finally {
      db.close();
    }
  });

  it("refuses a database that has a migration this version does not know", () => {
    const db = new Database(":memory:");
    try {
      applyMigrations(db, readMigrations(migrationDir({ "001_a.sql": "SELECT 1;", "002_b.sql": "SELECT 1;" })));
      assert.throws(() => applyMigrations(db, readMigrations(migrationDir({ "001_a.sql": "SELECT 1;" }))), /newer version/);
    } finally {
      db.close();
    }
  });

  it("refuses badly named or duplicate-version migration files", () => {
    assert.throws(() => readMigrations(migrationDir({ "1_short.sql": "" })), /NNN_name\.sql/);
    assert.throws(() => readMigrations(migrationDir({ "001-a.sql": "" })), /NNN_name\.sql/);
    assert.throws(() => readMigrations(migrationDir({ "001_a.sql": "", "0001_b.sql": "" })), /same version 1/);
  });

  it("the shipped folder starts at 001_initial", () => {
    const migrations = readMigrations();
    assert.equal(migrations[0]?.file, "001_initial.sql");
    assert.deepEqual(
      migrations.map((m) => m.version),
      migrations.map((_, i) => i + 1),
      "versions are consecutive",
    );
  });
});

describe("usage cursor", () => {
  it("round-trips any request id", () => {
    for (const requestId of ["req_1", "a:b:c", "請求 ✓", "__proto__"]) {
      const text = encodeUsageCursor({ createdAtMs: 1_767_225_600_123, requestId });
      assert.match(text, /^[A-Za-z0-9_-]+$/);
      assert.deepEqual(decodeUsageCursor(text), { createdAtMs: 1_767_225_600_123, requestId });
    }
  });
});

describe("openStore", () => {
  it("maps database URLs to SQLite paths", () => {
    assert.equal(sqlitePathOf("sqlite:./data/tds.sqlite"), "./data/tds.sqlite");
    assert.equal(sqlitePathOf("sqlite:data/x.db"), "data/x.db");
    assert.equal(sqlitePathOf("sqlite:/var/lib/tds/tds.sqlite"), "/var/lib/tds/tds.sqlite");
    assert.equal(sqlitePathOf("sqlite:///var/lib/tds.sqlite"), "/var/lib/tds.sqlite");
    assert.equal(sqlitePathOf("sqlite::memory:"), ":memory:");
    assert.equal(sqlitePathOf("file:./x.sqlite"), "./x.sqlite");
    assert.equal(sqlitePathOf("file:///tmp/a%20b.sqlite"), "/tmp/a b.sqlite");
    assert.equal(sqlitePathOf("./data/tds.sqlite"), "./data/tds.sqlite");
    assert.equal(sqlitePathOf("/abs/tds.db"), "/abs/tds.db");
    assert.equal(sqlitePathOf("mysql://host/db"), null);
    assert.equal(sqlitePathOf("http://host/x.sqlite"), null);
    assert.equal(sqlitePathOf("tds.json"), null);
    assert.throws(() => sqlitePathOf("sqlite:"), /no path/);
  });

  it("opens a SQLite file relative to the current directory, with migrations applied", async () => {
    const dir = tempDir("open");
    const store = await openStore(`sqlite:${join(dir, "sub", "tds.sqlite")}`);
    assert.equal(store.dialect, "sqlite");
    assert.equal(await store.countOrganizations(), 0);
    await store.close();
    assert.ok(existsSync(join(dir, "sub", "tds.sqlite")));
    const again = await openStore(join(dir, "sub", "tds.sqlite"));
    await again.close();
    const memory = await openStore("sqlite::memory:");
    await memory.createOrganization({ id: "o", name: "n", nowMs: 0 });
    await memory.close();
    mkdirSync(join(dir, "f"));
    const viaFile = await openStore(`file:${join(dir, "f", "x.db")}`);
    await viaFile.close();
    assert.ok(existsSync(join(dir, "f", "x.db")));
  });

  it("names the accepted forms for a URL it does not know", async () => {
    await assert.rejects(openStore("mysql://localhost/tds"), /accepted forms: sqlite:PATH/);
    await assert.rejects(openStore("tds.json"), /accepted forms/);
  });
});
