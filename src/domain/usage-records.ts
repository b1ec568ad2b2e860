/** Where a request came from and how it ended: one usage record per accepted decision request. */

/** The two ways a request is served: free with day quotas, or paid from credits. */
export type ServiceMode = "preview" | "paid";

/** api: a decision request; playground: one sent by the console's Playground; batch: a request of a batch. */
export type UsageSource = "api" | "playground" | "batch";
/** `in_flight` until the request's completion commits; every other outcome is final. */
export type UsageOutcome = "in_flight" | "succeeded" | "model_error" | "context_rejected" | "reservation_expired" | "gateway_error";
export type FinalOutcome = Exclude<UsageOutcome, "in_flight">;
export const USAGE_OUTCOMES: readonly UsageOutcome[] = [
  "in_flight",
  "succeeded",
  "model_error",
  "context_rejected",
  "reservation_expired",
  "gateway_error",
];

/** One record per accepted decision request, written in flight at admission and made final at completion. */
export interface UsageRecord {
  requestId: string;
  orgId: string;
  keyId: string;
  createdAtMs: number;
  /** When the final outcome was written; null while in flight. */
  completedAtMs: number | null;
  source: UsageSource;
  model: string;
  mode: ServiceMode;
  outcome: UsageOutcome;
  /** The status the client was answered with; null while in flight and when no answer is known (completed by the sweep). */
  httpStatus: number | null;
  inputTokens: number;
  outputTokens: number;
  costMicrousd: number;
  /** Model call time in ms, null when no model answer arrived. */
  latencyMs: number | null;
  gatewayLatencyMs: number;
  /** Short error text for failed outcomes, null on success. */
  errorDetail: string | null;
  /** The model reported more tokens than the gateway reserved for (charged the reservation). */
  overReservation: boolean;
  /** The deployment (model service) that answered, or the last one tried; null while in flight or when none was. */
  deployment: string | null;
  /** Model service attempts made (more than 1 after a failover); 0 while in flight. */
  attempts: number;
}

/**
 * Totals of usage records created on the UTC days of [fromMs, toMs): per day (every organization, or one) and per
 * organization. Read from the daily roll-up: the cost is one row per organization and day, whatever the number of records.
 */
export interface UsageTotals {
  /** Days with at least one record, oldest first; `dayStartMs` is the UTC midnight that starts the day. */
  days: Array<{ dayStartMs: number } & UsageSums>;
  /** Organizations with at least one record, by cost then requests, largest first; `name` is null for an organization not found. */
  organizations: Array<{ orgId: string; name: string | null } & UsageSums>;
}

export interface UsageSums {
  requests: number;
  inputTokens: number;
  outputTokens: number;
  costMicrousd: number;
}
