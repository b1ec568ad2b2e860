import type { Usage } from "../contract/decision.ts";
import { cappedTokenCost, formatUsd, type Price } from "../domain/money.ts";
import type { TokenBound } from "../models/model-service.ts";

/** The credits set aside for one paid request (the reservation's id is the request id): its token bound at the model's prices. */
export interface Reservation {
  amount: number;
  tokens: TokenBound;
}

/**
 * How one request is charged: the answer to "is this request paid?", given once when it is admitted
 * (AdmissionPolicy.admit) and carried to its admission command and usage record (`mode`), its completion
 * (`reserved`), its reply (`service_mode`, `usage`) and the observer's reservation events.
 */
export type Charging =
  /** Counted in the preview day quotas; nothing is charged. */
  | { mode: "preview" }
  /**
   * Its reservation set aside; charged the cost of the tokens it used at `price`, at most the reservation. `keyBudget`:
   * the reservation also counts in this key spend (the key has a budget: its lineage's id and the period), settled there too.
   */
  | { mode: "paid"; price: Price; priceInputUsd: string; reservation: Reservation; keyBudget: { keyId: string; period: string } | null };

/** What a request that succeeded is charged, as the reply's usage. */
export interface Charge {
  usage: Usage;
  /** It used more than it reserved and is charged the reservation. */
  capped: boolean;
}

export function chargeOf(charging: Charging, inputTokens: number, outputTokens: number): Charge {
  // Each usage written out whole: `{ ...tokens, more }` costs V8 a slow path on every request.
  if (charging.mode === "preview") {
    return {
      usage: { input_tokens: inputTokens, output_tokens: outputTokens, cost_microusd: 0, cost_usd: "0", price_per_million_input_usd: null },
      capped: false,
    };
  }
  const { cost, capped } = cappedTokenCost(charging.price, inputTokens, outputTokens, charging.reservation.amount);
  return {
    usage: {
      input_tokens: inputTokens,
      output_tokens: outputTokens,
      cost_microusd: cost,
      cost_usd: formatUsd(cost),
      price_per_million_input_usd: charging.priceInputUsd,
    },
    capped,
  };
}
