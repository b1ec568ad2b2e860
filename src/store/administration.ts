import type { AuditActor, AuditEntry } from "../domain/audit.ts";
import type { Balance } from "../domain/credits.ts";
import type { Organization } from "../domain/organizations.ts";
import type { UsageTotals } from "../domain/usage-records.ts";

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
