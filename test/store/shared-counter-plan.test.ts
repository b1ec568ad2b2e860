/**
 * The service-wide preview counter in the bookkeeping program (dialect-neutral): read without a lock, added to within
 * a limit, and read locked in a second read when the batch runs again after the addition failed.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { AdmitCommand } from "../../src/domain/bookkeeping.ts";
import { batchProgram, batchQuery, planBatch } from "../../src/store/bookkeeping/programs.ts";
import { type SnapshotQuery, snapshotOf } from "../../src/store/bookkeeping/rows.ts";
import { BlockUse, SharedBlock } from "../../src/store/bookkeeping/shared-blocks.ts";
import { admission } from "./store-contract.ts";

const DAY = "2026-01-01";
const preview = (requestId: string, orgId: string, globalLimit: number, orgLimit = 100): AdmitCommand =>
  admission({ requestId, orgId, quota: { day: DAY, orgLimit, globalLimit } });
const counted = (scope: string, count: number) => ({ scope, day: DAY, count });

describe("the service-wide preview counter in a batch", () => {
  test("is read without a lock, apart from the organizations' counters, which are locked", () => {
    const q = batchQuery([preview("r1", "org_a", 10), preview("r2", "org_b", 10)], []);
    assert.deepEqual(q.counters, [
      { scope: "org_a", day: DAY },
      { scope: "org_b", day: DAY },
    ]);
    assert.deepEqual(q.sharedCounters, [{ scope: "*", day: DAY }]);
  });

  test("is added to, not set: the batch's admissions, within the limit every one of them was decided against", () => {
    const snapshot = snapshotOf({ counters: [counted("org_a", 0)], sharedCounters: [counted("*", 5)] });
    const same = planBatch([preview("r1", "org_a", 10), preview("r2", "org_a", 10), preview("r3", "org_a", 10)], [], snapshot);
    assert.deepEqual(same.writes.counterIncrements, [{ scope: "*", day: DAY, count: 3, limit: 10 }]);
    assert.deepEqual(same.writes.counters, [{ scope: "org_a", day: DAY, count: 3 }]);
    // Limits that differ (two configurations): the second was counted at 5 + 1 < 7, so the counter may hold at most
    // 5 before the write, 7 after it.
    const mixed = planBatch([preview("r1", "org_a", 10), preview("r2", "org_a", 7)], [], snapshot);
    assert.deepEqual(mixed.writes.counterIncrements, [{ scope: "*", day: DAY, count: 2, limit: 7 }]);
  });

  test("refused admissions add nothing; a batch without admissions counted writes no addition", () => {
    const snapshot = snapshotOf({ counters: [counted("org_a", 0)], sharedCounters: [counted("*", 10)] });
    const plan = planBatch([preview("r1", "org_a", 10)], [], snapshot);
    assert.deepEqual(plan.results.admissions, [{ kind: "quota_exhausted", scope: "global" }]);
    assert.deepEqual(plan.writes.counterIncrements, []);
  });

  test("run again with lockShared: the first read leaves it out, a second read locks it, the decisions use that count", () => {
    const reads: (SnapshotQuery | undefined)[] = [];
    const program = batchProgram([preview("r1", "org_a", 3)], [], new BlockUse(new SharedBlock()), true);
    let step = program.next(undefined);
    reads.push(step.done ? undefined : step.value.read);
    step = program.next(snapshotOf({ counters: [counted("org_a", 0)] }));
    reads.push(step.done ? undefined : step.value.read);
    step = program.next(snapshotOf({ counters: [counted("*", 3)] }));
    assert.deepEqual(step.done ? undefined : step.value.write?.counterIncrements, []);
    const done = program.next(undefined);
    assert.deepEqual(done.value, { admissions: [{ kind: "quota_exhausted", scope: "global" }], completions: [] });
    const [first, second] = reads;
    assert.equal(first?.sharedCounters, undefined);
    assert.deepEqual(first?.counters, [{ scope: "org_a", day: DAY }]);
    assert.deepEqual(second, { counters: [{ scope: "*", day: DAY }] });
  });

  describe("in blocks (quota.globalBlock)", () => {
    const inBlocks = (requestId: string, orgId: string, globalLimit: number, globalBlock: number, orgLimit = 100): AdmitCommand =>
      admission({ requestId, orgId, quota: { day: DAY, orgLimit, globalLimit, globalBlock } });
    /** Runs batchProgram to its write against `counters`; returns what it read and wrote, and its results. */
    const run = (admissions: AdmitCommand[], units: BlockUse, counters: { scope: string; day: string; count: number }[]) => {
      const program = batchProgram(admissions, [], units);
      const first = program.next(undefined);
      const read = first.done ? undefined : first.value.read;
      const write = program.next(
        snapshotOf({ counters: counters.filter((c) => c.scope !== "*"), sharedCounters: counters.filter((c) => c.scope === "*") }),
      );
      const writes = write.done ? undefined : write.value.write;
      const done = program.next(undefined);
      return { read, writes, results: done.done ? done.value : undefined };
    };

    test("a batch that holds no units adds a block to the counter; the next batches use it without reading the counter", () => {
      const block = new SharedBlock();
      const first = new BlockUse(block);
      const a = run([inBlocks("r1", "org_a", 1000, 16), inBlocks("r2", "org_b", 1000, 16)], first, [counted("*", 0)]);
      assert.deepEqual(a.read?.sharedCounters, [{ scope: "*", day: DAY }]);
      assert.deepEqual(a.writes?.counterIncrements, [{ scope: "*", day: DAY, count: 16, limit: 1000 }], "one block of 16 for both");
      assert.equal(block.take(DAY, 100), 0, "the units are not the process's before the transaction commits");
      first.committed();
      const second = new BlockUse(block);
      const b = run([inBlocks("r3", "org_a", 1000, 16)], second, [counted("*", 16)]);
      assert.deepEqual(b.read?.sharedCounters, [], "covered by the block: the counter is not read");
      assert.deepEqual(b.writes?.counterIncrements, []);
      assert.deepEqual(b.writes?.counters, [{ scope: "org_a", day: DAY, count: 1 }], "the organization's counter still counts each");
      assert.deepEqual(b.results?.admissions, [{ kind: "admitted" }]);
      second.committed();
      assert.deepEqual(block.drain(), { day: DAY, count: 13 }, "16 added, 3 used");
    });

    test("never more than an eighth of what is left below the limit, and at least one: the last units go one at a time", () => {
      const sizes = [0, 7, 8, 64, 100, 127, 128, 129, 10_000].map(
        (count) =>
          run([inBlocks("r1", "org_a", 1000 + count, 16)], new BlockUse(new SharedBlock()), [counted("*", 1000)]).writes
            ?.counterIncrements[0]?.count,
      );
      // left below the limit: 0 (refused), 7, 8, 64, 100, 127, 128, 129, 10000
      assert.deepEqual(sizes, [undefined, 1, 1, 8, 12, 15, 16, 16, 16]);
    });

    test("units that a refused admission did not use go back to the block at once", () => {
      const block = new SharedBlock();
      block.give(DAY, 5);
      const units = new BlockUse(block);
      const r = run(
        [inBlocks("r1", "org_a", 1000, 16, 1), inBlocks("r2", "org_a", 1000, 16, 1), inBlocks("r3", "org_a", 1000, 16, 1)],
        units,
        [counted("org_a", 0)],
      );
      assert.deepEqual(
        r.results?.admissions.map((x) => x.kind),
        ["admitted", "quota_exhausted", "quota_exhausted"],
      );
      assert.deepEqual(r.read?.sharedCounters, [], "three taken from the five held: the counter is not read");
      assert.equal(block.take(DAY, 100), 4, "two back at once (before the write); the one used is gone");
    });

    test("a transaction that surely rolled back frees the units it used; one that failed otherwise keeps nothing", () => {
      const block = new SharedBlock();
      block.give(DAY, 2);
      const rolledBack = new BlockUse(block);
      run([inBlocks("r1", "org_a", 1000, 16), inBlocks("r2", "org_a", 1000, 16), inBlocks("r3", "org_a", 1000, 16)], rolledBack, [
        counted("*", 990),
      ]);
      rolledBack.rolledBack();
      assert.equal(block.take(DAY, 100), 2, "both taken units back; the block it added was never committed");
      block.give(DAY, 2);
      run([inBlocks("r4", "org_a", 1000, 16)], new BlockUse(block), []);
      assert.equal(block.take(DAY, 100), 1, "the unit used by a transaction of unknown outcome is lost, never counted twice");
    });

    test("a day's units are that day's: a later day's replace them, an earlier day's are dropped", () => {
      const block = new SharedBlock();
      block.give("2026-01-01", 3);
      block.give("2025-12-31", 4);
      assert.equal(block.take("2025-12-31", 10), 0);
      block.give("2026-01-02", 2);
      assert.equal(block.take("2026-01-01", 10), 0);
      assert.deepEqual(block.drain(), { day: "2026-01-02", count: 2 });
      assert.equal(block.drain(), null);
    });
  });
});
