import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { perTurnLookup } from "../../src/store/per-turn-lookup.ts";

describe("perTurnLookup", () => {
  test("lookups of one event-loop turn share one load; each gets its own row, or undefined", async () => {
    const loads: string[][] = [];
    const lookup = perTurnLookup(async (keys) => {
      loads.push(keys);
      return new Map(keys.filter((k) => k !== "missing").map((k) => [k, `row of ${k}`]));
    });
    const first = await Promise.all([lookup("a"), lookup("b"), lookup("a"), lookup("missing")]);
    assert.deepEqual(first, ["row of a", "row of b", "row of a", undefined]);
    assert.deepEqual(await lookup("c"), "row of c");
    assert.deepEqual(loads, [["a", "b", "missing"], ["c"]]);
  });

  test("a failed load fails every lookup of its turn, and the next turn loads again", async () => {
    let fail = true;
    const lookup = perTurnLookup(async (keys) => {
      if (fail) throw new Error("connection lost");
      return new Map(keys.map((k) => [k, k]));
    });
    const results = await Promise.allSettled([lookup("a"), lookup("b")]);
    assert.deepEqual(
      results.map((r) => r.status),
      ["rejected", "rejected"],
    );
    fail = false;
    assert.equal(await lookup("a"), "a");
  });
});
