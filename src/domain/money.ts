/**
 * Exact money arithmetic. Amounts are integer microUSD (1 USD = 1,000,000 microUSD); prices are
 * decimal USD strings per million tokens, held as integer microUSD per million tokens, so a price
 * has at most 6 decimal places. No binary floating point anywhere.
 */

const DECIMAL_USD = /^(0|[1-9][0-9]{0,8})(\.[0-9]{1,6})?$/;

/** Parses a decimal USD string such as "0.5" or "12.50" into integer microUSD; null if malformed. */
export function parseUsd(text: string): bigint | null {
  const match = DECIMAL_USD.exec(text.trim());
  if (!match) return null;
  const whole = BigInt(match[1]!);
  const fraction = (match[2] ?? ".").slice(1).padEnd(6, "0");
  return whole * 1_000_000n + BigInt(fraction === "" ? "0" : fraction);
}

/** Formats integer microUSD as an exact decimal USD string without trailing zeros: 1500000 → "1.5", 0 → "0". */
export function formatUsd(microusd: bigint | number): string {
  const value = BigInt(microusd);
  const negative = value < 0n;
  const abs = negative ? -value : value;
  const whole = abs / 1_000_000n;
  const fraction = (abs % 1_000_000n).toString().padStart(6, "0").replace(/0+$/, "");
  return `${negative ? "-" : ""}${whole}${fraction ? `.${fraction}` : ""}`;
}

export interface Price {
  /** microUSD per million input tokens. */
  inputPerMillion: bigint;
  /** microUSD per million output tokens (0 when output is not billed). */
  outputPerMillion: bigint;
}

/**
 * Cost of a token count in integer microUSD, rounded up to the next whole microUSD.
 * Monotonic in both counts, so a cost for counts within a reservation never exceeds it.
 */
export function tokenCost(price: Price, inputTokens: number, outputTokens: number): number {
  const scaled = BigInt(inputTokens) * price.inputPerMillion + BigInt(outputTokens) * price.outputPerMillion;
  const cost = (scaled + 999_999n) / 1_000_000n;
  if (cost > BigInt(Number.MAX_SAFE_INTEGER)) throw new RangeError("cost exceeds the safe integer range");
  return Number(cost);
}

/**
 * What a request is charged: the cost of its tokens, but never more than `cap` (its reservation), exact for any
 * token counts (a count too large for tokenCost is simply charged the cap).
 */
export function cappedTokenCost(price: Price, inputTokens: number, outputTokens: number, cap: number): { cost: number; capped: boolean } {
  const scaled = BigInt(inputTokens) * price.inputPerMillion + BigInt(outputTokens) * price.outputPerMillion;
  const cost = (scaled + 999_999n) / 1_000_000n;
  return cost > BigInt(cap) ? { cost: cap, capped: true } : { cost: Number(cost), capped: false };
}

/** A price times a factor given in millionths (batch_price_factor), each part rounded up to a whole microUSD per million tokens. */
export function scaledPrice(price: Price, factorMillionths: bigint): Price {
  const scale = (perMillion: bigint) => (perMillion * factorMillionths + 999_999n) / 1_000_000n;
  return { inputPerMillion: scale(price.inputPerMillion), outputPerMillion: scale(price.outputPerMillion) };
}
