/**
 * Request ids begin with their time (newRequestId), so that new usage records are added at the end of the primary
 * key's index: the format the API has always had, ids that sort in the order they were made, and fewer database
 * pages written per request than with random ids (counted from the SQLite WAL, which does not depend on load).
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { newRequestId, randomId } from "../../src/domain/api-keys.ts";
import type { AdmitCommand } from "../../src/domain/bookkeeping.ts";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { admission, completion } from "./store-contract.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe("request ids", () => {
  test("keep the API's format: req_ and 24 characters of [a-z0-9], none twice in 100,000", () => {
    const ids = Array.from({ length: 100_000 }, () => newRequestId());
    for (const id of ids.slice(0, 1000)) assert.match(id, /^req_[a-z0-9]{24}$/);
    assert.equal(new Set(ids).size, ids.length);
  });

  test("begin with the time they were made, in base-36 milliseconds, so that later ids sort after earlier ones", async () => {
    const before = Date.now();
    const first = Array.from({ length: 50 }, () => newRequestId());
    await sleep(3);
    const second = Array.from({ length: 50 }, () => newRequestId());
    const afterMs = Date.now();
    for (const id of [...first, ...second]) {
      const ms = Number.parseInt(id.slice(4, 13), 36);
      assert.ok(ms >= before && ms <= afterMs, `${id} holds ${ms}, not within ${before}..${afterMs}`);
    }
    const latestFirst = [...first].sort().at(-1)!;
    const earliestSecond = [...second].sort()[0]!;
    assert.ok(latestFirst < earliestSecond, `${latestFirst} sorts before ${earliestSecond}`);
  });

  test("write fewer SQLite pages per request than random ids do, on a table with history", async (t) => {
    const dir = mkdtempSync(join(tmpdir(), "tds-request-ids-"));
    after(() => rmSync(dir, { recursive: true, force: true }));
    const walBytesPerRequest = async (name: string, newId: () => string) => {
      const path = join(dir, `${name}.sqlite`);
      const store = openSqliteStore(path, { checkpointIntervalMs: 0 });
      try {
        store.db.pragma("wal_autocheckpoint = 0");
        const orgId = `org_${name}`;
        await store.createOrganization({ id: orgId, name, nowMs: Date.now() });
        let pending: AdmitCommand[] = [];
        const batch = async (size: number) => {
          const admissions = Array.from({ length: size }, () => admission({ requestId: newId(), orgId, nowMs: Date.now() }));
          await store.commitBatch({
            admissions,
            completions: pending.map((a) => completion({ requestId: a.requestId, orgId, nowMs: Date.now() })),
          });
          pending = admissions;
        };
        for (let i = 0; i < 40; i++) await batch(500); // 20,000 records of history
        store.db.pragma("wal_checkpoint(TRUNCATE)");
        const requests = 800;
        for (let i = 0; i < requests / 8; i++) await batch(8);
        return statSync(`${path}-wal`).size / requests;
      } finally {
        await store.close();
      }
    };
    // Random ids as they were made before: req_ and 24 random characters of [a-z0-9].
    const random = await walBytesPerRequest("random", () => `req_${randomId(24)}`);
    const timeFirst = await walBytesPerRequest("time-first", newRequestId);
    t.diagnostic(`WAL bytes per request: random ids ${random.toFixed(0)}, time-first ids ${timeFirst.toFixed(0)}`);
    assert.ok(timeFirst < 0.8 * random, `time-first ids wrote ${timeFirst.toFixed(0)} bytes per request, random ids ${random.toFixed(0)}`);
  });
});
