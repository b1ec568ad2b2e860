import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { KeyUseRecorder } from "../../src/gateway/key-use.ts";
import { FixedClock } from "../support/fixed-clock.ts";

type Uses = { keyId: string; atMs: number }[];

function recorder(options: { fail?: () => boolean; intervalMs?: number } = {}) {
  const clock = new FixedClock(Date.UTC(2026, 10, 28, 9));
  const writes: Uses[] = [];
  const errors: unknown[] = [];
  const keyUse = new KeyUseRecorder({
    clock,
    ...(options.intervalMs !== undefined ? { intervalMs: options.intervalMs } : {}),
    record: async (uses) => {
      if (options.fail?.()) throw new Error("storage unavailable");
      writes.push(uses);
    },
    onError: (err) => errors.push(err),
  });
  return { clock, keyUse, writes, errors };
}

const byKey = (uses: Uses) => Object.fromEntries(uses.map((u) => [u.keyId, u.atMs]));

describe("KeyUseRecorder", () => {
  test("one write per flush with each key's latest use; nothing written when nothing was used", async () => {
    const { clock, keyUse, writes } = recorder();
    const t0 = clock.nowMs();
    keyUse.note("a");
    clock.advance(1000);
    keyUse.note("b");
    clock.advance(1000);
    keyUse.note("a");
    assert.deepEqual(writes, [], "no write per request");
    assert.equal(keyUse.pending, 2);
    await keyUse.flush();
    assert.equal(writes.length, 1);
    assert.deepEqual(byKey(writes[0]!), { a: t0 + 2000, b: t0 + 1000 });
    assert.equal(keyUse.pending, 0);
    await keyUse.flush();
    assert.equal(writes.length, 1, "an empty flush writes nothing");
    keyUse.note("b");
    await keyUse.flush();
    assert.deepEqual(writes[1], [{ keyId: "b", atMs: t0 + 2000 }], "only the keys used since the last write");
  });

  test("a failed write keeps its uses for the next one, a newer use of a key replacing the kept one", async () => {
    let failing = true;
    const { clock, keyUse, writes, errors } = recorder({ fail: () => failing });
    const t0 = clock.nowMs();
    keyUse.note("a");
    keyUse.note("b");
    await keyUse.flush();
    assert.equal(errors.length, 1);
    assert.deepEqual(writes, []);
    clock.advance(5000);
    keyUse.note("b");
    failing = false;
    await keyUse.flush();
    assert.deepEqual(byKey(writes[0]!), { a: t0, b: t0 + 5000 });
  });

  test("a use noted while a write runs goes into the next write", async () => {
    const clock = new FixedClock(Date.UTC(2026, 10, 28, 9));
    const writes: Uses[] = [];
    let release = () => {};
    let writing = () => {};
    const started = new Promise<void>((r) => {
      writing = r;
    });
    const keyUse = new KeyUseRecorder({
      clock,
      record: async (uses) => {
        writes.push(uses);
        writing();
        if (writes.length === 1) await new Promise<void>((r) => (release = r));
      },
    });
    keyUse.note("a");
    const first = keyUse.flush();
    await started;
    clock.advance(10);
    keyUse.note("a");
    const second = keyUse.flush();
    release();
    await Promise.all([first, second]);
    assert.deepEqual(
      writes.map((w) => w.map((u) => u.atMs - clock.nowMs())),
      [[-10], [0]],
    );
  });

  test("the timer writes at its interval; close() stops it and writes what is left", async () => {
    const { keyUse, writes } = recorder({ intervalMs: 20 });
    keyUse.start();
    keyUse.note("a");
    const until = Date.now() + 10_000;
    while (writes.length === 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
    assert.equal(writes.length, 1, "written by the timer");
    keyUse.note("b");
    await keyUse.close();
    assert.deepEqual(
      writes.slice(1).flatMap((w) => w.map((u) => u.keyId)),
      ["b"],
    );
    const count = writes.length;
    keyUse.note("c");
    await new Promise((r) => setTimeout(r, 60));
    assert.equal(writes.length, count, "no timer after close()");
  });
});
