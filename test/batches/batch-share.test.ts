/**
 * BatchShare, one tick at a time with the event loop's utilization given: halved (never below 1) when interactive
 * requests started while the loop was busy, grown by one when they started and it was not, and by a quarter of the
 * most (at least one, never above the most) when none started.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BatchShare } from "../../src/batches/batch-share.ts";

/** A share of at most `most` and the interactive-start counter it reads. */
function shareOf(most: number) {
  let starts = 0;
  const share = new BatchShare(most, () => starts);
  return {
    share,
    /** One tick in which `interactive` requests started, at `utilization`; the share after it. */
    tick(utilization: number, interactive = 0): number {
      starts += interactive;
      share.adjust(utilization);
      return share.share;
    },
  };
}

describe("BatchShare", () => {
  it("starts at the most", () => {
    assert.equal(new BatchShare(12, () => 40).share, 12);
  });

  it("interactive starts on a busy loop halve the share, never below 1", () => {
    const { tick } = shareOf(16);
    assert.deepEqual([tick(0.9, 1), tick(0.76, 3), tick(1, 1), tick(0.8, 1), tick(0.8, 1), tick(0.99, 7)], [8, 4, 2, 1, 1, 1]);
    const odd = shareOf(7);
    assert.deepEqual([odd.tick(0.9, 1), odd.tick(0.9, 1)], [3, 1], "rounded down");
  });

  it("interactive starts on a loop at most 0.75 busy grow the share by one, never above the most", () => {
    const { tick } = shareOf(8);
    assert.deepEqual([tick(0.9, 1), tick(0.9, 1), tick(0.9, 1)], [4, 2, 1]);
    assert.deepEqual(
      [tick(0.75, 1), tick(0.5, 2), tick(0, 1), tick(0.75, 1), tick(0.1, 1), tick(0.2, 1), tick(0.3, 1), tick(0.4, 1)],
      [2, 3, 4, 5, 6, 7, 8, 8],
    );
  });

  it("with no interactive start the share grows by a quarter of the most (at least one), however busy the loop", () => {
    const eight = shareOf(8);
    assert.deepEqual([eight.tick(0.9, 1), eight.tick(0.9, 1), eight.tick(0.9, 1)], [4, 2, 1]);
    assert.deepEqual([eight.tick(1), eight.tick(0.9), eight.tick(0), eight.tick(0.5), eight.tick(1)], [3, 5, 7, 8, 8]);
    const three = shareOf(3);
    assert.deepEqual([three.tick(0.9, 1), three.tick(1), three.tick(1), three.tick(1)], [1, 2, 3, 3], "floor(3 / 4) is 0: grows by 1");
  });

  it("what counts is whether the counter changed since the last tick, not by how much", () => {
    const { tick } = shareOf(8);
    assert.deepEqual([tick(0.9, 100), tick(0.9), tick(0.9, 1), tick(0.5, 1000), tick(0.5)], [4, 6, 3, 4, 6]);
  });
});
