import assert from "node:assert/strict";
import { closeSync, mkdtempSync, openSync, readFileSync, readSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import type { AdmitCommand, CompleteCommand } from "../../src/domain/bookkeeping.ts";
import { utcDay } from "../../src/domain/utc-day.ts";
import { openSqliteStore, SERVING_SQLITE } from "../../src/store/sqlite/sqlite-store.ts";
import { eventually } from "../support/timer-race.ts";
import { admission, completion } from "./store-contract.ts";

/**
 * How many times the WAL was started over: its header's checkpoint sequence number (big-endian at byte 12),
 * which SQLite increments each time a writer starts the file again from the beginning.
 */
function walRestarts(file: string): number {
  const header = Buffer.alloc(32);
  let fd: number;
  try {
    fd = openSync(`${file}-wal`, "r");
  } catch {
    return 0;
  }
  try {
    return readSync(fd, header, 0, 32, 0) === 32 ? header.readUInt32BE(12) : 0;
  } finally {
    closeSync(fd);
  }
}

describe("SQLite checkpoints of a serving store", () => {
  test("commits never checkpoint on the serving connection; the worker thread copies the WAL into the database file", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-ckpt-"));
    const errors: string[] = [];
    const inFile = (file: string, marker: string) => readFileSync(file).includes(marker);
    try {
      // A store whose worker does not run during the test (its first checkpoint is an hour away): whatever reaches
      // the database file was checkpointed by a commit on the serving connection.
      const file = join(dir, "serving.sqlite");
      const serving = openSqliteStore(file, {
        ...SERVING_SQLITE,
        checkpointIntervalMs: 3_600_000,
        onCheckpointError: (m) => errors.push(m),
      });
      try {
        assert.equal(serving.db.pragma("wal_autocheckpoint", { simple: true }), 0);
        assert.equal(serving.db.pragma("busy_timeout", { simple: true }), 0, "no sleeping busy handler on the serving connection");
        const marker = `checkpoint-marker-${Date.now()}`;
        // More than SQLite's default autocheckpoint (1000 pages) of commits: none of them may checkpoint.
        for (let i = 0; i < 1500; i++)
          await serving.createOrganization({ id: `org_${i}`, name: i === 0 ? marker : `org ${i} ${"x".repeat(300)}`, nowMs: 1 });
        if (inFile(file, marker)) assert.fail("a commit checkpointed on the serving connection");
        const walBytes = readFileSync(`${file}-wal`).length;
        assert.ok(walBytes > 1000 * 4096, `the WAL holds every commit: ${walBytes} bytes`);
      } finally {
        await serving.close();
      }

      // A store whose worker runs: it, and only it, gets the commit into the database file.
      const other = join(dir, "worker.sqlite");
      const store = openSqliteStore(other, { ...SERVING_SQLITE, checkpointIntervalMs: 20, onCheckpointError: (m) => errors.push(m) });
      try {
        const marker = `worker-marker-${Date.now()}`;
        await store.createOrganization({ id: "org_marked", name: marker, nowMs: 1 });
        await eventually("the worker thread's checkpoint", () => (inFile(other, marker) ? true : undefined));
      } finally {
        await store.close();
      }
      assert.deepEqual(errors, []);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("under steady writes the WAL is started over again and again instead of growing without end", async (t) => {
    const dir = mkdtempSync(join(tmpdir(), "tds-ckpt-"));
    const file = join(dir, "tds.sqlite");
    const store = openSqliteStore(file, { ...SERVING_SQLITE, checkpointIntervalMs: 50, walRestartPages: 1000 });
    try {
      const walBytes = () => statSync(`${file}-wal`, { throwIfNoEntry: false })?.size ?? 0;
      // What one commit appends, measured while the WAL still only grows (before it is first started over).
      const growth: { written: number; bytes: number }[] = [];
      const perCommit = () => {
        const [first, last] = [growth[0], growth.at(-1)];
        // At least two 4 KB pages (a row of 2 KB and its index entries) when the first cycle was too short to measure.
        const measured = first && last && last.written > first.written ? (last.bytes - first.bytes) / (last.written - first.written) : 0;
        return Math.max(measured, 2 * 4096);
      };
      // Driven by what happens, not by the clock: write until the WAL has been started over a few times and what was
      // appended is more than twice its file, at most MAX_WRITES.
      const MAX_WRITES = 5000;
      let written = 0;
      while (written < MAX_WRITES && !(walRestarts(file) >= 3 && walBytes() < (written * perCommit()) / 2)) {
        // Writes never pause long enough for a PASSIVE checkpoint to catch up with them.
        await store.createOrganization({ id: `org_${written}`, name: `${written} ${"x".repeat(2000)}`, nowMs: 1 });
        written++;
        if (walRestarts(file) === 0) growth.push({ written, bytes: walBytes() });
        await sleep(1);
      }
      const restarts = walRestarts(file);
      const appended = Math.round(written * perCommit());
      t.diagnostic(`${written} writes, about ${appended} bytes appended, ${restarts} restarts, a WAL file of ${walBytes()} bytes`);
      assert.ok(restarts >= 3, `the WAL was started over ${restarts} times in ${written} writes`);
      // Started over at 1000 pages (4 MB), the file (reused, not shrunk) stays far below what was appended.
      assert.ok(walBytes() < appended / 2, `the WAL file is ${walBytes()} bytes after about ${appended} appended`);
      assert.equal(await store.countOrganizations(), written, "no write lost while the checkpoint held the lock");
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("the WAL is started over between two writes: under steady writes none finds the database busy", async (t) => {
    const dir = mkdtempSync(join(tmpdir(), "tds-ckpt-"));
    const file = join(dir, "tds.sqlite");
    // lockWaitMs 0: a write that finds the write lock taken (by a RESTART checkpoint) fails at once instead of waiting;
    // the books' batches always do.
    const store = openSqliteStore(file, { ...SERVING_SQLITE, lockWaitMs: 0, checkpointIntervalMs: 20, walRestartPages: 100 });
    try {
      await store.createOrganization({ id: "org_books", name: "books", nowMs: 1 });
      await store.createApiKey({ id: "key_books", orgId: "org_books", name: "k", hash: "0".repeat(64), nowMs: 1 });
      const next = (i: number): AdmitCommand =>
        admission({
          requestId: `req_${i}`,
          orgId: "org_books",
          keyId: "key_books",
          nowMs: Date.now(),
          quota: { day: utcDay(Date.now()), orgLimit: 1_000_000, globalLimit: 1_000_000 },
        });
      const completed = (a: AdmitCommand): CompleteCommand => completion({ requestId: a.requestId, orgId: a.orgId, nowMs: Date.now() });
      // Writes one after the other with no pause: an organization (through the store's write wait) and a batch of the
      // books completing the previous request and admitting the next (as the group commit runs it).
      const MAX_WRITES = 2000;
      let written = 0;
      let previous: AdmitCommand | null = null;
      while (written < MAX_WRITES && walRestarts(file) < 4) {
        await store.createOrganization({ id: `org_${written}`, name: `${written} ${"x".repeat(2000)}`, nowMs: 1 });
        const admitted = next(written);
        const result = await store.commitBatch({ admissions: [admitted], completions: previous ? [completed(previous)] : [] });
        assert.deepEqual(
          [...result.admissions, ...result.completions].map((r) => r.kind),
          previous ? ["admitted", "completed"] : ["admitted"],
        );
        previous = admitted;
        written++;
      }
      t.diagnostic(`${written} rounds of writes, ${walRestarts(file)} restarts`);
      assert.ok(walRestarts(file) >= 4, `the WAL was started over ${walRestarts(file)} times in ${written} rounds of writes`);
      assert.equal(await store.countOrganizations(), written + 1);
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
