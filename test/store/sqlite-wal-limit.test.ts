/**
 * The SQLite WAL file is bounded on disk (TDS_SQLITE_WAL_LIMIT_MB): a transaction larger than the limit leaves a WAL
 * file larger than it, and the checkpoint thread's next checkpoint brings the file back within it; the serving
 * connection carries the limit as journal_size_limit.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { DEFAULT_WAL_LIMIT_BYTES } from "../../src/store/sqlite/checkpointer.ts";
import { openSqliteStore, SERVING_SQLITE } from "../../src/store/sqlite/sqlite-store.ts";
import { eventually } from "../support/timer-race.ts";

const MIB = 1024 * 1024;

describe("the SQLite WAL file's bound on disk", () => {
  test("after a burst of writes larger than the limit, the next checkpoint brings the -wal file within it", async (t) => {
    const dir = mkdtempSync(join(tmpdir(), "tds-wal-"));
    const file = join(dir, "tds.sqlite");
    const limit = 1 * MIB;
    const errors: string[] = [];
    const store = openSqliteStore(file, {
      ...SERVING_SQLITE,
      checkpointIntervalMs: 50,
      walLimitBytes: limit,
      onCheckpointError: (m) => errors.push(m),
    });
    try {
      assert.equal(store.db.pragma("journal_size_limit", { simple: true }), limit, "the serving connection's journal_size_limit");
      const walBytes = () => statSync(`${file}-wal`, { throwIfNoEntry: false })?.size ?? 0;
      // One transaction of about 6 MB: the WAL must hold all of it until it commits, whatever the checkpoints do.
      const insert = store.db.prepare("INSERT INTO organizations (id, name, paused, created_at_ms) VALUES (?, ?, 0, 1)");
      store.db.transaction(() => {
        for (let i = 0; i < 3000; i++) insert.run(`org_${i}`, `${i} ${"x".repeat(2000)}`);
      })();
      const burst = walBytes();
      assert.ok(burst > limit, `the burst left a WAL of ${burst} bytes, over the limit of ${limit}`);
      const after = await eventually("the WAL file within its limit", () => {
        const bytes = walBytes();
        return bytes <= limit ? bytes : undefined;
      });
      t.diagnostic(`WAL after the burst: ${burst} bytes; after the next checkpoints: ${after} bytes (limit ${limit})`);
      // Writes go on as before, and the file stays bounded.
      for (let i = 0; i < 300; i++) await store.grantCredits({ orgId: `org_${i}`, amountMicrousd: 1, nowMs: 1 });
      await eventually("the WAL file within its limit after more writes", () => (walBytes() <= limit ? true : undefined));
      assert.equal(await store.countOrganizations(), 3000);
      assert.equal((await store.getBalance("org_299")).granted, 1);
      assert.deepEqual(errors, []);
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("the default limit is 64 MiB, on the serving connection as on a tool's", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-wal-"));
    try {
      for (const options of [SERVING_SQLITE, {}]) {
        const store = openSqliteStore(join(dir, "tds.sqlite"), options);
        assert.equal(store.db.pragma("journal_size_limit", { simple: true }), DEFAULT_WAL_LIMIT_BYTES);
        assert.equal(DEFAULT_WAL_LIMIT_BYTES, 64 * MIB);
        await store.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
