import type { Balance, Organization } from "./store.ts";

/** What an administrative change did; one audit entry each, written in the change's own transaction. */
export type AuditAction =
  | "organization.created"
  | "organization.paused"
  | "organization.resumed"
  | "key.created"
  | "key.revoked"
  | "credits.granted";
export const AUDIT_ACTIONS: readonly AuditAction[] = [
  "organization.created",
  "organization.paused",
  "organization.resumed",
  "key.created",
  "key.revoked",
  "credits.granted",
];

/** Who made a change: the `tds` CLI on the database, or the admin API (`client`: the caller's own label, such as "console" or "cli"). */
export interface AuditActor {
  source: "cli" | "http";
  client: string | null;
  remoteAddress: string | null;
}

export interface AuditEntry extends AuditActor {
  /** Increasing: newer entries have larger ids. */
  id: number;
  atMs: number;
  action: AuditAction;
  orgId: string;
  /** The organization's id, or the key's id for key actions. */
  targetId: string;
  /**
   * Action-specific facts, never a secret: `{name}` of the organization or key (null for a key without one),
   * `{amount_microusd, note}` of a grant (note null when none), nothing (`{}`) for a pause or resume.
   */
  details: Record<string, string | number | boolean | null>;
}

export interface AuditQuery {
  orgId?: string;
  /** Opaque cursor from a previous page. */
  cursor?: string;
  /** 1 to 200. */
  limit: number;
}

export interface AuditPage {
  /** Newest first. */
  entries: AuditEntry[];
  nextCursor: string | null;
}

export interface OrganizationPage {
  /** Oldest first (createdAtMs, then id). */
  organizations: Organization[];
  nextCursor: string | null;
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

export type GrantOnceResult =
  | { kind: "granted"; balance: Balance }
  /** The key was used before with the same request: the balance the first grant answered, nothing granted again. */
  | { kind: "replayed"; balance: Balance }
  /** The key was used before with another request. */
  | { kind: "mismatch" };

/**
 * What administration reads and writes besides the account and credit methods (which take an optional audit actor,
 * so each change and its audit entry commit together).
 */
export interface AdministrationStore {
  /** A malformed cursor or a limit outside 1 to 200 is a StoreInputError (field `cursor` or `limit`). */
  listOrganizationsPage(query: { cursor?: string; limit: number }): Promise<OrganizationPage>;
  /**
   * Grants credits at most once per idempotency key (kept 24 hours): the grant, its audit entry and the key's
   * stored answer in one transaction. `requestHash` identifies the request; a key used with another one is a mismatch.
   * Concurrent calls with one key are serialized: one grants, the others wait for it and replay its answer (or
   * mismatch). An expired key is as if never used. A failed grant (unknown organization, …) stores nothing for the key.
   */
  grantCreditsOnce(input: {
    orgId: string;
    amountMicrousd: number;
    nowMs: number;
    note?: string;
    audit: AuditActor;
    idempotency: { key: string; requestHash: string };
  }): Promise<GrantOnceResult>;
  /** A malformed cursor or a limit outside 1 to 200 is a StoreInputError (field `cursor` or `limit`). */
  listAudit(query: AuditQuery): Promise<AuditPage>;
  /** Every outcome counts, in flight too. fromMs ≤ toMs, both UTC midnights (whole days), else StoreInputError. */
  usageTotals(query: { fromMs: number; toMs: number; orgId?: string }): Promise<UsageTotals>;
}

/** How long an admin idempotency key is kept. */
export const ADMIN_IDEMPOTENCY_TTL_MS = 24 * 60 * 60 * 1000;
