/** What the pipeline reports as it runs (metrics implement it; tests may too). */
export interface DecisionObserver {
  decided(gatewayMs: number, modelMs: number): void;
  modelFailed(kind: string): void;
  reservation(outcome: "reserved" | "insufficient" | "settled" | "released" | "expired"): void;
  rejected(
    reason: "rate_limited" | "preview_quota_org" | "preview_quota_global" | "insufficient_credits" | "token_bound_over_reserve",
  ): void;
}

export const silentObserver: DecisionObserver = {
  decided: () => {},
  modelFailed: () => {},
  reservation: () => {},
  rejected: () => {},
};
