/** The console's formatting and parsing helpers that need no browser (web/format.js). */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
// @ts-expect-error: a browser module without type declarations
import { microusdToUsd, parseAmount } from "../../web/format.js";

describe("console formatting", () => {
  test("microUSD as exact USD strings", () => {
    const cases: Array<[number, string]> = [
      [0, "0"],
      [1, "0.000001"],
      [12_500_000, "12.5"],
      [25_499_684, "25.499684"],
      [100_000_000, "100"],
      [-1_500_000, "-1.5"],
    ];
    for (const [micro, usd] of cases) assert.equal(microusdToUsd(micro), usd, String(micro));
    assert.equal(microusdToUsd(null), "–");
    assert.equal(microusdToUsd(1.5), "–");
  });

  test("an amount as typed becomes the exact string the admin API takes, or a problem to show", () => {
    const ok: Array<[string, string]> = [
      ["12.50", "12.50"],
      [" 25 ", "25"],
      ["012.5", "12.5"],
      ["0.000001", "0.000001"],
      ["$ 3", "3"],
      ["7 USD", "7"],
      ["999999999.999999", "999999999.999999"],
    ];
    for (const [typed, amount] of ok) assert.deepEqual(parseAmount(typed), { amount }, typed);
    // Every accepted amount matches the API's pattern.
    for (const [, amount] of ok) assert.match(amount, /^(0|[1-9][0-9]{0,8})(\.[0-9]{1,6})?$/);
    const bad: Array<[string, RegExp]> = [
      ["", /Enter an amount/],
      ["12,50", /dot for decimals/],
      ["1e3", /digits and at most one dot/],
      ["-1", /digits and at most one dot/],
      ["1.1234567", /at most 6 decimals/],
      ["1000000000", /too large/],
      ["0", /more than 0/],
      ["0.000000", /more than 0/],
    ];
    for (const [typed, problem] of bad) assert.match(parseAmount(typed).problem ?? "", problem, typed);
  });
});
