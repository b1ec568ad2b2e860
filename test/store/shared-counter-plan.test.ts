/**
 * The service-wide preview counter in the bookkeeping program (dialect-neutral): read without a lock, added to within
 * a limit, and read locked in a second read when the batch runs again after the addition failed.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { AdmitCommand } from "../../src/domain/bookkeeping.ts";
import { batchProgram, batchQuery, planBatch } from "../../src/store/bookkeeping/programs.ts";
import { type SnapshotQuery, snapshotOf } from "../../src/store/bookkeeping/rows.ts";
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
    const program = batchProgram([preview("r1", "org_a", 3)], [], true);
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
});
