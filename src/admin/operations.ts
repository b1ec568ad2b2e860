import type { AuditEntry } from "../domain/audit.ts";
import type { Balance } from "../domain/credits.ts";
import type { ApiKeyRecord, Organization } from "../domain/organizations.ts";
import type { UsageRecord, UsageSums, UsageTotals } from "../domain/usage-records.ts";
import type { PreviewUse } from "../gateway/preview-use.ts";
import type { UsagePage, UsageQuery } from "../store/store.ts";
import type { KeySettingsRequest } from "./key-settings.ts";

/** An API key as administration shows it: never the hash, never the key (nor its lineage, an internal of the books). */
export type ApiKeyInfo = Omit<ApiKeyRecord, "hash" | "lineageId">;

/** An organization with where it stands: credits, today's preview use, keys. */
export interface OrganizationStatus {
  org: Organization;
  balance: Balance;
  preview: PreviewUse;
  /** active: the keys that work now (active, or rotated within their grace); expired and retired keys are in neither. */
  keys: { active: number; revoked: number };
}

/**
 * What an operator can do: the admin API serves it over HTTP, and the `tds` CLI runs it either on the database
 * (`StoreAdministration`) or through the admin API. Organizations are named by `ref`: an id (org_…) or the unique
 * name. Failures the caller can act on are AdminErrors.
 */
export interface AdminOperations {
  createOrganization(name: string): Promise<Organization>;
  listOrganizations(page: { cursor?: string; limit: number }): Promise<{ organizations: Organization[]; nextCursor: string | null }>;
  organization(ref: string): Promise<OrganizationStatus>;
  /** `changed` is false when it already was in that state (nothing recorded). */
  setPaused(ref: string, paused: boolean): Promise<{ org: Organization; changed: boolean }>;
  /** `raw` is the key itself, to be shown once. `settings`: its own limits (absent: none). */
  createKey(ref: string, name: string | null, settings?: KeySettingsRequest): Promise<{ org: Organization; key: ApiKeyInfo; raw: string }>;
  /** Changes a key's name or settings (absent: kept; null: cleared); `conflict` for a revoked or rotated key. */
  updateKey(keyId: string, changes: KeyUpdate): Promise<{ org: Organization; key: ApiKeyInfo }>;
  /**
   * A new key (`raw`, shown once) with the old one's organization, name and settings; the old one keeps working for
   * `graceSeconds` (default DEFAULT_GRACE_SECONDS). `conflict` for a revoked key, one already rotated or an expired one.
   */
  rotateKey(keyId: string, graceSeconds?: number): Promise<{ org: Organization; old: ApiKeyInfo; key: ApiKeyInfo; raw: string }>;
  listKeys(ref: string): Promise<{ org: Organization; keys: ApiKeyInfo[] }>;
  key(keyId: string): Promise<{ org: Organization; key: ApiKeyInfo }>;
  /** `revoked` is false when it already was revoked (nothing recorded). */
  revokeKey(keyId: string): Promise<{ org: Organization; key: ApiKeyInfo; revoked: boolean }>;
  /** With an idempotency key, a retry of the same grant is applied once (`replayed`: this call granted nothing). */
  grantCredits(
    ref: string,
    grant: { amountMicrousd: number; note?: string; idempotencyKey?: string },
  ): Promise<{ org: Organization; balance: Balance; replayed: boolean }>;
  usage(ref: string, query: UsageQuery): Promise<{ org: Organization; page: UsagePage }>;
  usageRecord(ref: string, requestId: string): Promise<{ org: Organization; record: UsageRecord | null }>;
  /** Totals of the last `days` UTC days (today included), every organization. */
  usageSummary(days: number): Promise<UsageSummary>;
  /** Newest first; each entry with its organization's current name (null if it cannot be found). */
  audit(query: { org?: string; cursor?: string; limit: number }): Promise<NamedAuditPage>;
}

/** The changes of a key update: its name (null clears it) and settings, as the admin API's PATCH body. */
export type KeyUpdate = KeySettingsRequest & { name?: string | null };

/** How long a rotated key keeps working by default: one day. */
export const DEFAULT_GRACE_SECONDS = 86_400;

export interface NamedAuditPage {
  entries: Array<AuditEntry & { orgName: string | null }>;
  nextCursor: string | null;
}

/** Usage of every organization over [fromMs, toMs): per UTC day with requests and per organization (with its name). */
export interface UsageSummary {
  fromMs: number;
  toMs: number;
  days: UsageTotals["days"];
  organizations: Array<{ orgId: string; name: string } & UsageSums>;
}
