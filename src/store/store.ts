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
}
