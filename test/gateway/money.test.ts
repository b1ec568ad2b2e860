import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { formatUsd, parseUsd, tokenCost } from "../../src/domain/money.ts";
import { msUntilUtcMidnight, utcDay } from "../../src/domain/utc-day.ts";

describe("money", () => {
  test("decimal USD strings ↔ integer microUSD, exactly", () => {
    assert.equal(parseUsd("12.50"), 12_500_000n);
    assert.equal(parseUsd("0.000001"), 1n);
    assert.equal(parseUsd("0.1"), 100_000n);
    for (const bad of ["", "1.", ".5", "-1", "1e3", "0.0000001", "01", "1,5", "NaN"]) assert.equal(parseUsd(bad), null, bad);
    assert.equal(formatUsd(0), "0");
    assert.equal(formatUsd(1), "0.000001");
    assert.equal(formatUsd(1_500_000), "1.5");
    assert.equal(formatUsd(123_456_789n), "123.456789");
  });

  test("round trip for any amount", () => {
    fc.assert(fc.property(fc.bigInt({ min: 0n, max: 999_999_999_999_999n }), (micro) => parseUsd(formatUsd(micro)) === micro));
  });

  test("token cost rounds up to whole microUSD and never exceeds the cost of larger counts", () => {
    const price = { inputPerMillion: parseUsd("0.5")!, outputPerMillion: parseUsd("1.25")! };
    assert.equal(tokenCost(price, 1_000_000, 0), 500_000);
    assert.equal(tokenCost(price, 1, 0), 1, "half a microUSD is charged as one");
    assert.equal(tokenCost(price, 3, 2), 4, "1.5 + 2.5 = 4 exactly");
    assert.equal(tokenCost({ inputPerMillion: 0n, outputPerMillion: 0n }, 10_000, 10), 0);
    fc.assert(
      fc.property(fc.nat(1_000_000), fc.nat(1_000_000), fc.nat(10_000), fc.nat(10_000), (a, b, c, d) => {
        const [i1, i2] = a <= b ? [a, b] : [b, a];
        const [o1, o2] = c <= d ? [c, d] : [d, c];
        return tokenCost(price, i1, o1) <= tokenCost(price, i2, o2);
      }),
    );
  });
});

describe("UTC days", () => {
  test("the day key changes at 00:00:00.000 UTC and the wait ends there", () => {
    const before = Date.parse("2026-11-26T23:59:59.999Z");
    assert.equal(utcDay(before), "2026-11-26");
    assert.equal(utcDay(before + 1), "2026-11-27");
    assert.equal(msUntilUtcMidnight(before), 1);
    assert.equal(msUntilUtcMidnight(before + 1), 86_400_000);
  });

  test("the day of any instant, in any order (times going back too), is its ISO date", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 4_102_444_800_000 }), { minLength: 1, maxLength: 50 }), (times) => {
        for (const t of times) assert.equal(utcDay(t), new Date(t).toISOString().slice(0, 10));
      }),
    );
    const midnight = Date.parse("2026-11-27T00:00:00Z");
    assert.deepEqual([utcDay(midnight), utcDay(midnight - 1), utcDay(midnight)], ["2026-11-27", "2026-11-26", "2026-11-27"]);
  });
});
