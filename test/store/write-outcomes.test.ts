/** What the write check remembers: failed writes until a success or 10 s, and its own last result for a second. */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { WriteCheck } from "../../src/store/store.ts";
import { SharedCheck, WRITE_FAILURE_MEMORY_MS, WriteOutcomes } from "../../src/store/write-outcomes.ts";

describe("WriteOutcomes", () => {
  test("a failure is remembered until a write succeeds, or for 10 s", () => {
    let now = 1_000_000;
    const outcomes = new WriteOutcomes(() => now);
    assert.equal(outcomes.latest(), null);
    outcomes.failed({ state: "disk_full", reason: "SQLITE_FULL" });
    assert.deepEqual(outcomes.latest(), { state: "disk_full", reason: "SQLITE_FULL" });
    outcomes.succeeded();
    assert.equal(outcomes.latest(), null);
    outcomes.failed({ state: "read_only" });
    now += WRITE_FAILURE_MEMORY_MS;
    assert.deepEqual(outcomes.latest(), { state: "read_only" });
    now += 1;
    assert.equal(outcomes.latest(), null, "forgotten: a gateway out of rotation gets no writes to succeed");
  });
});

describe("SharedCheck", () => {
  test("shared while it runs and for a second after; run anew after that, or at once after invalidate", async () => {
    let now = 0;
    let runs = 0;
    let state: WriteCheck["state"] = "ok";
    const shared = new SharedCheck(
      async () => {
        runs++;
        return { state };
      },
      () => now,
    );
    const first = await Promise.all(Array.from({ length: 10 }, () => shared.check()));
    assert.equal(runs, 1);
    assert.deepEqual(new Set(first.map((c) => c.state)), new Set(["ok"]));
    state = "read_only";
    now += 999;
    assert.deepEqual(await shared.check(), { state: "ok" }, "within the second: the last result");
    now += 1;
    assert.deepEqual(await shared.check(), { state: "read_only" });
    assert.equal(runs, 2);
    state = "ok";
    shared.invalidate();
    assert.deepEqual(await shared.check(), { state: "ok" }, "invalidated: run at once");
    assert.equal(runs, 3);
  });

  test("a check that throws is not kept", async () => {
    let fail = true;
    const shared = new SharedCheck(async () => {
      if (fail) throw new Error("boom");
      return { state: "ok" };
    });
    await assert.rejects(shared.check(), /boom/);
    fail = false;
    assert.deepEqual(await shared.check(), { state: "ok" });
  });
});
