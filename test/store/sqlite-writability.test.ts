/**
 * The SQLite write check on its own: a connection opened read-only reads fine but is found out; another connection
 * holding the write lock is no failure (the database takes writes) and the check does not wait for it; nothing is
 * ever committed; a closed store is unavailable.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import Database from "better-sqlite3";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { probeWrite, sqliteWritability } from "../../src/store/sqlite/sqlite-writability.ts";

describe("the SQLite write check", () => {
  test("read-only connection → read_only; writable → ok; a lock held elsewhere → ok at once; nothing committed", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-probe-"));
    const file = join(dir, "tds.sqlite");
    const store = openSqliteStore(file);
    try {
      await store.createOrganization({ id: "org_a", name: "a", nowMs: 1 });
      assert.deepEqual(await store.checkWritable!(), { state: "ok" });
      const changes = () => store.db.prepare("SELECT total_changes() AS n").get() as { n: number };
      const before = changes().n;

      const reader = new Database(file, { readonly: true });
      try {
        assert.equal((reader.prepare("SELECT count(*) AS n FROM organizations").get() as { n: number }).n, 1, "it reads");
        const check = probeWrite(reader);
        assert.equal(check.state, "read_only");
        assert.match(check.reason!, /^SQLITE_READONLY/);
      } finally {
        reader.close();
      }

      const holder = new Database(file);
      try {
        holder.exec("BEGIN IMMEDIATE");
        assert.equal(store.db.pragma("busy_timeout", { simple: true }), 5000);
        assert.deepEqual(await store.checkWritable!(), { state: "ok" }, "another writer: the database takes writes");
        assert.equal(store.db.pragma("busy_timeout", { simple: true }), 5000, "the busy timeout is put back");
        holder.exec("ROLLBACK");
      } finally {
        holder.close();
      }
      assert.equal(changes().n, before, "the checks changed no row");
      assert.equal(store.db.inTransaction, false);
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
    assert.deepEqual(await store.checkWritable!(), { state: "unavailable", reason: "The database connection is not open" });
  });

  test("SQLite's errors as write states", () => {
    const err = (code: string) => new Database.SqliteError("x", code);
    assert.equal(sqliteWritability(err("SQLITE_READONLY")), "read_only");
    assert.equal(sqliteWritability(err("SQLITE_READONLY_DBMOVED")), "read_only");
    assert.equal(sqliteWritability(err("SQLITE_FULL")), "disk_full");
    assert.equal(sqliteWritability(err("SQLITE_IOERR_WRITE")), "cannot_write");
    assert.equal(sqliteWritability(err("SQLITE_CANTOPEN")), "cannot_write");
    assert.equal(sqliteWritability(new TypeError("The database connection is not open")), "unavailable");
    assert.equal(sqliteWritability(err("SQLITE_CONSTRAINT_UNIQUE")), null);
    assert.equal(sqliteWritability(new Error("a bug")), null);
  });
});
