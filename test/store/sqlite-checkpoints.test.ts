import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { openSqliteStore, SERVING_SQLITE } from "../../src/store/sqlite/sqlite-store.ts";

describe("SQLite checkpoints of a serving store", () => {
  test("commits never checkpoint on the serving connection; the worker thread copies the WAL into the database file", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-ckpt-"));
    const file = join(dir, "tds.sqlite");
    const errors: string[] = [];
    const store = openSqliteStore(file, { ...SERVING_SQLITE, checkpointIntervalMs: 200, onCheckpointError: (m) => errors.push(m) });
    try {
      assert.equal(store.db.pragma("wal_autocheckpoint", { simple: true }), 0);
      assert.equal(store.db.pragma("busy_timeout", { simple: true }), 0, "no sleeping busy handler on the serving connection");
      const marker = `checkpoint-marker-${Date.now()}`;
      // More than SQLite's default autocheckpoint (1000 pages) of commits: none of them may checkpoint.
      for (let i = 0; i < 1500; i++)
        await store.createOrganization({ id: `org_${i}`, name: i === 0 ? marker : `org ${i} ${"x".repeat(300)}`, nowMs: 1 });
      const inFile = () => readFileSync(file).includes(marker);
      const walBytes = () => readFileSync(`${file}-wal`).length;
      if (inFile()) assert.fail("a commit checkpointed on the serving connection");
      assert.ok(walBytes() > 1000 * 4096, `the WAL holds every commit: ${walBytes()} bytes`);
      const deadline = Date.now() + 3000;
      while (!inFile() && Date.now() < deadline) await sleep(20);
      assert.ok(inFile(), "checkpointed by the worker thread");
      assert.deepEqual(errors, []);
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("under steady writes the WAL is started over again and again instead of growing without end", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-ckpt-"));
    const file = join(dir, "tds.sqlite");
    const store = openSqliteStore(file, { ...SERVING_SQLITE, checkpointIntervalMs: 50, walRestartPages: 1000 });
    try {
      const walBytes = () => statSync(`${file}-wal`, { throwIfNoEntry: false })?.size ?? 0;
      let written = 0;
      const until = performance.now() + 2000;
      for (let i = 0; performance.now() < until; i++) {
        // Each commit appends at least two 4 KB pages (a row of 2 KB and its index entries); about a thousand commits a
        // second (several times what 300 req/s give): writes never pause long enough for a PASSIVE checkpoint to catch up.
        await store.createOrganization({ id: `org_${i}`, name: `${i} ${"x".repeat(2000)}`, nowMs: 1 });
        await sleep(1);
        written++;
      }
      const appended = written * 2 * 4096;
      assert.ok(appended > 8 * 1024 * 1024, `steady writes: ${written}`);
      // Started over at 1000 pages (4 MB), the file (reused, not shrunk) stays far below what was appended.
      assert.ok(walBytes() < appended / 2, `the WAL file is ${walBytes()} bytes after ${appended} appended`);
      assert.equal(await store.countOrganizations(), written, "no write lost while the checkpoint held the lock");
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("close stops the worker: the process holds no other connection to the file afterwards", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-ckpt-"));
    const file = join(dir, "tds.sqlite");
    const store = openSqliteStore(file, { ...SERVING_SQLITE, checkpointIntervalMs: 20 });
    await store.createOrganization({ id: "org_a", name: "a", nowMs: 1 });
    await sleep(60);
    await store.close();
    // The last connection to close removes the WAL file; a worker still holding one would leave it.
    assert.throws(() => readFileSync(`${file}-wal`), /ENOENT/);
    rmSync(dir, { recursive: true, force: true });
  });
});
