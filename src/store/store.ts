import type { ServiceMode } from "../contract/decision.ts";

export interface Organization {
  id: string;
  name: string;
  /** Paused pending billing review: every decision request gets 403. */
  paused: boolean;
  createdAtMs: number;
}

export interface ApiKeyRecord {
  id: string;
  orgId: string;
  name: string | null;
  /** sha256 of the whole raw key, lowercase hex. The raw key is never stored. */
  hash: string;
  createdAtMs: number;
  revokedAtMs: number | null;
}

export type UsageSource = "api" | "playground";
export type UsageOutcome = "succeeded" | "model_error" | "context_rejected" | "reservation_expired";

/** One record per accepted decision request. */
export interface UsageRecord {
  requestId: string;
  orgId: string;
  keyId: string;
  createdAtMs: number;
  source: UsageSource;
  model: string;
  mode: ServiceMode;
  outcome: UsageOutcome;
  httpStatus: number;
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
}

export interface UsageQuery {
  /** Inclusive lower bound of createdAtMs. */
  fromMs?: number;
  /** Exclusive upper bound of createdAtMs. */
  toMs?: number;
  outcome?: UsageOutcome;
  /** Opaque cursor from a previous page. */
  cursor?: string;
  /** 1 to 200. */
  limit: number;
}

export interface UsagePage {
  records: UsageRecord[];
  /** Present when more records follow (newest first). */
  nextCursor: string | null;
}

/** Credits of one organization in integer microUSD. Invariant: granted − spent = available + reserved. */
export interface Balance {
  available: number;
  reserved: number;
  /** Sum of settled costs. */
  spent: number;
  granted: number;
}

export type ReservationStatus = "pending" | "settled" | "released" | "expired";

export interface Reservation {
  id: string;
  orgId: string;
  requestId: string;
  amountMicrousd: number;
  status: ReservationStatus;
  /** Charged amount once settled (≤ amountMicrousd); null otherwise. */
  costMicrousd: number | null;
  createdAtMs: number;
  expiresAtMs: number;
  resolvedAtMs: number | null;
}

export type LedgerKind = "grant" | "reserve" | "settle" | "release" | "expire";

export interface LedgerEntry {
  id: number;
  orgId: string;
  kind: LedgerKind;
  reservationId: string | null;
  availableDelta: number;
  reservedDelta: number;
  spentDelta: number;
  grantedDelta: number;
  createdAtMs: number;
  note: string | null;
}

export type PreviewQuotaResult = "ok" | "org_exhausted" | "global_exhausted";

/** A response kept for an Idempotency-Key: replayed as is. */
export interface StoredResponse {
  status: number;
  /** The JSON body text exactly as first sent. */
  body: string;
  requestId: string;
}

export type IdempotencyClaim =
  | { kind: "claimed" }
  | { kind: "in_progress" }
  | { kind: "mismatch" }
  | { kind: "replay"; response: StoredResponse };

export class StoreConflictError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StoreConflictError";
  }
}

/** Everything the service keeps. One interface, one adapter per database. All times are epoch milliseconds. */
export interface Store {
  readonly dialect: "sqlite" | "postgres";
  close(): Promise<void>;
  /** Connection pool figures, for metrics (adapters with a pool). */
  connectionStats?(): { total: number; idle: number; waiting: number };

  /** Throws StoreConflictError when the name is taken. */
  createOrganization(input: { id: string; name: string; nowMs: number }): Promise<Organization>;
  /** Finds by id or by unique name. */
  findOrganization(idOrName: string): Promise<Organization | null>;
  listOrganizations(): Promise<Organization[]>;
  countOrganizations(): Promise<number>;
  /** Returns false when no such organization exists. */
  setOrganizationPaused(orgId: string, paused: boolean): Promise<boolean>;

  createApiKey(input: { id: string; orgId: string; name: string | null; hash: string; nowMs: number }): Promise<ApiKeyRecord>;
  /** The key and its organization, revoked or not (the caller decides). */
  findApiKey(keyId: string): Promise<{ key: ApiKeyRecord; org: Organization } | null>;
  listApiKeys(orgId: string): Promise<ApiKeyRecord[]>;
  /** Returns false when no such key exists or it was already revoked. */
  revokeApiKey(keyId: string, nowMs: number): Promise<boolean>;

  /** Throws StoreConflictError on a duplicate request id. */
  insertUsage(record: UsageRecord): Promise<void>;
  /** Scoped to the organization: another organization's record is null. */
  getUsage(orgId: string, requestId: string): Promise<UsageRecord | null>;
  /** Newest first (createdAtMs, then requestId, descending). */
  listUsage(orgId: string, query: UsageQuery): Promise<UsagePage>;

  // ── Credits. Every method is one short transaction; none is held across a model call. ──

  /** Adds credits (amount > 0) and a `grant` ledger entry; creates the balance when missing. */
  grantCredits(input: { orgId: string; amountMicrousd: number; nowMs: number; note?: string }): Promise<Balance>;
  /** All zeros for an organization that never had credits. */
  getBalance(orgId: string): Promise<Balance>;
  /**
   * Moves `amount` from available to reserved with one conditional update (available ≥ amount),
   * creates the pending reservation and a `reserve` ledger entry. "insufficient" changes nothing.
   */
  reserveCredits(input: {
    reservationId: string;
    orgId: string;
    requestId: string;
    amountMicrousd: number;
    nowMs: number;
    expiresAtMs: number;
  }): Promise<"reserved" | "insufficient">;
  /**
   * pending → settled: charges `cost` (0 ≤ cost ≤ amount; more throws RangeError), returns the rest to
   * available, appends a `settle` entry and inserts `usage`, all in one transaction. A reservation
   * whose expiresAtMs ≤ nowMs is expired instead (funds returned, `expire` entry, no usage written)
   * and "expired" is returned; one already resolved gives "not_pending" and changes nothing.
   */
  settleReservation(input: { reservationId: string; costMicrousd: number; nowMs: number; usage: UsageRecord }): Promise<"settled" | "expired" | "not_pending">;
  /**
   * pending → released: the whole amount back to available, `release` entry. `usage`, when given,
   * is inserted in the same transaction whatever the reservation's state.
   */
  releaseReservation(input: { reservationId: string; nowMs: number; usage: UsageRecord | null }): Promise<"released" | "not_pending">;
  /** pending reservations with expiresAtMs ≤ nowMs → expired, funds returned; at most `limit`; returns how many. */
  expireReservations(input: { nowMs: number; limit: number }): Promise<number>;
  getReservation(reservationId: string): Promise<Reservation | null>;
  /** Oldest first. */
  listLedger(orgId: string): Promise<LedgerEntry[]>;

  // ── Preview quotas: counters per UTC day ("YYYY-MM-DD"), so they reset at 00:00 UTC with no job. ──

  /**
   * Counts one request for the organization and for the whole service, atomically, only if both
   * stay within their limits; otherwise counts nothing and says which limit is reached.
   */
  consumePreviewQuota(input: { orgId: string; day: string; orgLimit: number; globalLimit: number }): Promise<PreviewQuotaResult>;
  previewUsage(orgId: string, day: string): Promise<{ org: number; global: number }>;

  // ── Idempotency keys, scoped to an organization. ──

  /**
   * Claims `key` for this request. An unexpired completed entry with the same requestHash → replay;
   * with another hash → mismatch; an entry in progress whose lock has not passed → in_progress
   * (a passed lock or an expired entry is taken over: claimed).
   */
  claimIdempotencyKey(input: {
    orgId: string;
    key: string;
    requestHash: string;
    requestId: string;
    nowMs: number;
    lockUntilMs: number;
    expiresAtMs: number;
  }): Promise<IdempotencyClaim>;
  /** Stores the response for replays, if the claim is still this request's. */
  completeIdempotencyKey(input: { orgId: string; key: string; requestId: string; response: StoredResponse }): Promise<void>;
  /** Drops the claim, if it is still this request's, so a retry runs anew. */
  releaseIdempotencyKey(input: { orgId: string; key: string; requestId: string }): Promise<void>;
}
