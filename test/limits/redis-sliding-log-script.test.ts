import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { isRedisOutage } from "../../src/limits/redis-sliding-log-limiter.ts";
import { parseSlidingLogReply } from "../../src/limits/redis-sliding-log-script.ts";

// Pure parts of the Redis limiter: no Redis needed. The script itself runs in redis-rate-limiter.test.ts.
describe("the sliding-log script's reply", () => {
  test("an allowed check: {1, 0, remaining}", () => {
    assert.deepEqual(parseSlidingLogReply([1, 0, 4]), { allowed: true, retryAfterMs: 0, remaining: 4 });
    assert.deepEqual(parseSlidingLogReply([1, 0, 0]), { allowed: true, retryAfterMs: 0, remaining: 0 });
  });

  test("a refused check: {0, retryAfterMs, 0}", () => {
    assert.deepEqual(parseSlidingLogReply([0, 59_999, 0]), { allowed: false, retryAfterMs: 59_999, remaining: 0 });
  });

  test("integers as strings are read as numbers", () => {
    assert.deepEqual(parseSlidingLogReply(["0", "17", "0"]), { allowed: false, retryAfterMs: 17, remaining: 0 });
  });

  test("a reply of another shape is an Error (an outage to the composition), not a RangeError", () => {
    for (const reply of [null, undefined, "OK", 1, [], [1, 0], [1, 0, 2, 3], { 0: 1, 1: 0, 2: 2, length: 3 }]) {
      assert.throws(
        () => parseSlidingLogReply(reply),
        (err: unknown) => err instanceof Error && !(err instanceof RangeError) && /Unexpected rate-limit script reply/.test(err.message),
        JSON.stringify(reply),
      );
      assert.throws(
        () => parseSlidingLogReply(reply),
        (err: unknown) => isRedisOutage(err),
      );
    }
  });
});

describe("isRedisOutage", () => {
  test("a connection or reply failure is an outage; a RangeError (invalid limit) is not", () => {
    assert.equal(isRedisOutage(new Error("Redis did not answer within 200 ms")), true);
    assert.equal(isRedisOutage(new Error("Redis connection not ready (reconnecting)")), true);
    assert.equal(isRedisOutage(new RangeError("limit must be a positive integer, got 0")), false);
  });
});
