/**
 * FinishGroup: finishes of one event-loop turn, and those arriving while a write is in flight, go into one write of
 * at most MAX_FINISHES_PER_CALL, in order; each finish settles with its own answer once its write settled.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { FinishGroup } from "../../src/batches/finish-group.ts";
import { type FinishInput, MAX_FINISHES_PER_CALL } from "../../src/store/batches.ts";
import { eventually } from "../support/timer-race.ts";

interface WriteCall {
  positions: number[];
  answer: (written: boolean[]) => void;
  fail: (err: Error) => void;
}

/** A `write` whose every call waits until the test answers or fails it. */
function controlledWrite() {
  const calls: WriteCall[] = [];
  const write = (inputs: readonly FinishInput[]): Promise<boolean[]> =>
    new Promise((resolve, reject) => {
      calls.push({ positions: inputs.map((i) => i.position), answer: resolve, fail: reject });
    });
  /** The `n`th call (from 0), once made. */
  const call = (n: number) => eventually(`write call ${n}`, () => calls[n], 10_000, 1);
  return { calls, write, call };
}

const input = (position: number): FinishInput => ({
  batchId: "batch_1",
  position,
  requestId: `req_${position}`,
  status: 200,
  body: "{}",
  costMicrousd: position,
  nowMs: 1_767_225_600_000,
});

/** Several event-loop turns: a write the group scheduled (it schedules with setImmediate) has been made by then. */
async function turns(count = 5): Promise<void> {
  for (let i = 0; i < count; i++) await new Promise((resolve) => setImmediate(resolve));
}

describe("FinishGroup", () => {
  it("finishes of one event-loop turn go in one write, each answered with the write's answer at its index", async () => {
    const { calls, write, call } = controlledWrite();
    const group = new FinishGroup(write);
    const first = group.finish(input(0));
    const second = group.finish(input(1));
    await Promise.resolve();
    const third = group.finish(input(2));
    (await call(0)).answer([true, false, true]);
    assert.deepEqual(await Promise.all([first, second, third]), [true, false, true]);
    assert.deepEqual(calls[0]!.positions, [0, 1, 2]);
    await turns();
    assert.equal(calls.length, 1, "nothing was left to write");
  });

  it("finishes arriving while a write is in flight go in the next write together, after it committed", async () => {
    const { calls, write, call } = controlledWrite();
    const group = new FinishGroup(write);
    const first = group.finish(input(0));
    const inFlight = await call(0);
    const later: Promise<boolean>[] = [];
    for (const position of [1, 2, 3]) {
      later.push(group.finish(input(position)));
      await turns();
    }
    assert.equal(calls.length, 1, "no second write while the first is in flight");
    let laterSettled = false;
    void Promise.all(later).then(() => {
      laterSettled = true;
    });
    inFlight.answer([true]);
    assert.equal(await first, true);
    const next = await call(1);
    assert.deepEqual(next.positions, [1, 2, 3]);
    await turns();
    assert.equal(laterSettled, false, "answered only once their own write committed");
    next.answer([false, true, true]);
    assert.deepEqual(await Promise.all(later), [false, true, true]);
    await turns();
    assert.equal(calls.length, 2);
  });

  it("more than MAX_FINISHES_PER_CALL finishes are split across writes in order", async () => {
    const { calls, write, call } = controlledWrite();
    const group = new FinishGroup(write);
    const count = 2 * MAX_FINISHES_PER_CALL + 5;
    const finishes = Array.from({ length: count }, (_, position) => group.finish(input(position)));
    const positions = (from: number, length: number) => Array.from({ length }, (_, i) => from + i);
    const answerOf = (position: number) => position % 3 !== 0;
    const sizes = [MAX_FINISHES_PER_CALL, MAX_FINISHES_PER_CALL, 5];
    let from = 0;
    for (const [n, size] of sizes.entries()) {
      const made = await call(n);
      assert.equal(calls.length, n + 1, "one write at a time");
      assert.deepEqual(made.positions, positions(from, size), `write ${n}`);
      made.answer(made.positions.map(answerOf));
      from += size;
    }
    assert.deepEqual(await Promise.all(finishes), positions(0, count).map(answerOf));
    await turns();
    assert.equal(calls.length, 3);
  });

  it("a failed write rejects exactly its group's finishes, and the next group is still written", async () => {
    const { calls, write, call } = controlledWrite();
    const group = new FinishGroup(write);
    const failing = [group.finish(input(0)), group.finish(input(1))];
    const failed = await call(0);
    const next = [group.finish(input(2)), group.finish(input(3))];
    const outcomes = Promise.allSettled([...failing, ...next]);
    const diskFull = new Error("disk full");
    failed.fail(diskFull);
    const written = await call(1);
    assert.deepEqual(written.positions, [2, 3]);
    written.answer([true, false]);
    const settled = await outcomes;
    assert.deepEqual(settled, [
      { status: "rejected", reason: diskFull },
      { status: "rejected", reason: diskFull },
      { status: "fulfilled", value: true },
      { status: "fulfilled", value: false },
    ]);
    const afterFailure = group.finish(input(4));
    (await call(2)).answer([true]);
    assert.equal(await afterFailure, true, "the group keeps writing after a failure");
    assert.equal(calls.length, 3);
  });
});
