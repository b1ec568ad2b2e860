import type { FinalOutcome, ServiceMode, UsageRecord, UsageSource } from "./usage-records.ts";

/** A response kept for an Idempotency-Key: replayed as is. */
export interface StoredResponse {
  status: number;
  /** The JSON body text exactly as first sent. */
  body: string;
  requestId: string;
}

/** What one sweep pass did. */
export interface SweepResult {
  /** In-flight requests past their deadline, completed as `gateway_error` (their reservations expired). */
  abandoned: number;
}

/** What one purge pass deleted. */
export interface PurgeResult {
  /** Idempotency entries of decision requests and of admin credit grants. */
  idempotencyKeys: number;
  previewCounters: number;
}

/**
 * The two durable steps of an accepted request, as commands to the books. Both are committed in batches
 * (store.commitBatch), each command decided on its own.
 */

/** Responses larger than this (UTF-8 bytes) are not kept for Idempotency-Key replays. */
export const MAX_KEPT_RESPONSE_BYTES = 65_536;

/** Admission: idempotency claim, then preview quotas or the credit reservation, then the in-flight usage record. */
export interface AdmitCommand {
  requestId: string;
  orgId: string;
  keyId: string;
  source: UsageSource;
  model: string;
  mode: ServiceMode;
  nowMs: number;
  /** The gateway process (instance) admitting it, recorded on the usage record; its work is released if it dies. */
  instanceId?: string | null;
  idempotency: { key: string; requestHash: string; lockUntilMs: number; expiresAtMs: number } | null;
  /**
   * Preview: the day counters to count this request in. `globalBlock`: how many units of the service-wide counter this
   * process adds to it at once when it holds none (see SharedBlock); absent, 1: every request counted on it.
   */
  quota: { day: string; orgLimit: number; globalLimit: number; globalBlock?: number } | null;
  /** Paid: the credits to set aside; the reservation's id is the request id. */
  reservation: { amountMicrousd: number; expiresAtMs: number } | null;
  /**
   * Paid, by a key with a budget: the reservation is also set aside in the spend of `keyId` (the key's lineage id,
   * shared with the keys it replaced by rotation) in `period` (its UTC day "YYYY-MM-DD" or month "YYYY-MM" at
   * admission), refused when spent + reserved there would pass `limitMicrousd`.
   */
  keyBudget?: { keyId: string; period: string; limitMicrousd: number } | null;
}

export type AdmitResult =
  | { kind: "admitted" }
  /** The key's first request succeeded: its stored response, replayed as it was. */
  | { kind: "replay"; response: StoredResponse }
  /** The key's first request (requestId) succeeded, but its response was too large to keep. */
  | { kind: "replay_not_kept"; requestId: string }
  | { kind: "idempotency_mismatch" }
  /**
   * The key's claim is held by a request in flight. `ownerLeaseUntilMs`: the lease end of the gateway process running
   * it, when known: by then it has finished, or its process is known to be gone.
   */
  | { kind: "idempotency_in_progress"; ownerLeaseUntilMs?: number }
  /**
   * The key's claim is held by a request in flight whose gateway process is gone (its lease ended): releasing the
   * process's work (store.releaseOrphans) completes that request, and then the key can be claimed.
   */
  | { kind: "idempotency_abandoned"; requestId: string }
  | { kind: "quota_exhausted"; scope: "org" | "global" }
  | { kind: "insufficient_credits"; availableMicrousd: number }
  /** The key's budget of the period cannot cover the reservation: `remainingMicrousd` is what is left of it (≥ 0). */
  | { kind: "key_budget_exhausted"; remainingMicrousd: number };

/** Completion: the final usage record with its reservation settled or released (one ledger entry), and the idempotency entry. */
export interface CompleteCommand
  extends Pick<
    UsageRecord,
    | "requestId"
    | "orgId"
    | "inputTokens"
    | "outputTokens"
    | "latencyMs"
    | "gatewayLatencyMs"
    | "errorDetail"
    | "overReservation"
    | "deployment"
    | "attempts"
  > {
  nowMs: number;
  outcome: Exclude<FinalOutcome, "reservation_expired">;
  httpStatus: number;
  /** What to charge on success (≤ the reservation); 0 otherwise. */
  costMicrousd: number;
  /**
   * The admission reserved credits (the reservation its usage record holds): settled on success, released otherwise.
   * Its organization's balance is locked for it; a completion of a request holding a reservation must say so.
   */
  reserved: boolean;
  /**
   * The admission's reservation also counted in this key spend (AdmitCommand.keyBudget: the lineage id and the
   * period): moved from reserved to spent (the cost) or released there too. A completion of such a request must name it.
   */
  keyBudget?: { keyId: string; period: string } | null;
  /** The request's Idempotency-Key: a success keeps `response` for replays, anything else drops the claim. */
  idempotency: { key: string; response: StoredResponse | null } | null;
}

export type CompleteResult =
  | { kind: "completed" }
  /** A success whose reservation had expired: recorded as reservation_expired (409), nothing charged. */
  | { kind: "reservation_expired" }
  /** The request was no longer in flight (completed before, e.g. by the sweep): nothing changed. */
  | { kind: "not_in_flight" };
