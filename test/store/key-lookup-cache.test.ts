/**
 * KeyLookupCache on its own, with a clock of its own: what it keeps, for how long, and what a change drops.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { KeyLookupCache } from "../../src/store/key-lookup-cache.ts";

function counted<V>(value: V | undefined) {
  const reads: string[] = [];
  return {
    reads,
    read: (key: string) => () => {
      reads.push(key);
      return Promise.resolve(value);
    },
  };
}

describe("KeyLookupCache", () => {
  it("reads a found key once within its time, and again after it", async () => {
    let now = 1000;
    const cache = new KeyLookupCache<string>(500, () => now);
    const { reads, read } = counted("row");
    assert.equal(await cache.get("k", read("k")), "row");
    now += 499;
    assert.equal(await cache.get("k", read("k")), "row");
    assert.deepEqual(reads, ["k"], "kept for 500 ms");
    now += 1;
    assert.equal(await cache.get("k", read("k")), "row");
    assert.deepEqual(reads, ["k", "k"], "read again once its time is over");
  });

  it("keeps nothing with a time of 0, and keeps no key that was not found or could not be read", async () => {
    const off = new KeyLookupCache<string>(0);
    const found = counted("row");
    await off.get("k", found.read("k"));
    await off.get("k", found.read("k"));
    assert.equal(found.reads.length, 2);

    const cache = new KeyLookupCache<string>(60_000);
    const missing = counted<string>(undefined);
    assert.equal(await cache.get("unknown", missing.read("unknown")), undefined);
    assert.equal(await cache.get("unknown", missing.read("unknown")), undefined);
    assert.equal(missing.reads.length, 2, "an unknown key is read every time");

    await assert.rejects(
      cache.get("k", () => Promise.reject(new Error("database down"))),
      /database down/,
    );
    assert.equal(await cache.get("k", found.read("k")), "row", "a failed read is not kept");
  });

  it("a change drops what is kept, and a read that began before the change is not kept", async () => {
    const cache = new KeyLookupCache<string>(60_000);
    const { reads, read } = counted("row");
    await cache.get("k", read("k"));
    cache.changed();
    await cache.get("k", read("k"));
    assert.equal(reads.length, 2, "read again after a change");

    let finish!: (v: string) => void;
    const slow = cache.get("j", () => new Promise<string>((resolve) => (finish = resolve)));
    cache.changed();
    finish("before the change");
    assert.equal(await slow, "before the change", "its caller gets what it read");
    await new Promise((r) => setImmediate(r));
    const after = counted("after the change");
    assert.equal(await cache.get("j", after.read("j")), "after the change", "not kept: it may predate the change");
  });

  it("setTtl starts over and refuses a time that is not a whole number of 0 or more", async () => {
    const cache = new KeyLookupCache<string>(60_000);
    const { reads, read } = counted("row");
    await cache.get("k", read("k"));
    cache.setTtl(30_000);
    await cache.get("k", read("k"));
    assert.equal(reads.length, 2);
    assert.throws(() => cache.setTtl(-1), RangeError);
    assert.throws(() => cache.setTtl(1.5), RangeError);
  });
});
