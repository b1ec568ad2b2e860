import type { AdminApiKey, AdminBalance, AdminOrganization, AuditEntryJson, CreatedApiKey, RotatedApiKey } from "../contract/admin.ts";
import type { AuditEntry } from "../domain/audit.ts";
import type { Balance } from "../domain/credits.ts";
import { formatUsd } from "../domain/money.ts";
import type { KeySettings } from "../domain/organizations.ts";
import { creditsJson, previewQuotaJson } from "../presentation/organization-json.ts";
import type { ApiKeyInfo, OrganizationStatus } from "./operations.ts";

const iso = (ms: number) => new Date(ms).toISOString();
const isoOrNull = (ms: number | null) => (ms === null ? null : iso(ms));

/** Credits as the admin API and `tds credits … --json` show them: each amount in integer microUSD and as a decimal USD string. */
export function balanceJson(orgId: string, balance: Balance): AdminBalance {
  return {
    org_id: orgId,
    ...creditsJson(balance),
    granted_microusd: balance.granted,
    granted_usd: formatUsd(balance.granted),
  };
}

/** A key's own limits as the admin API shows them (null: none of its own). */
export function keySettingsJson(s: KeySettings): Pick<AdminApiKey, "expires_at" | "models" | "requests_per_minute" | "budget"> {
  return {
    expires_at: isoOrNull(s.expiresAtMs),
    models: s.models === null ? null : [...s.models],
    requests_per_minute: s.requestsPerMinute,
    budget: s.budget === null ? null : { usd: formatUsd(s.budget.limitMicrousd), period: s.budget.period },
  };
}

/** A key as listed: never the hash, never the key. */
export function apiKeyJson(key: ApiKeyInfo): AdminApiKey {
  return {
    id: key.id,
    org_id: key.orgId,
    name: key.name,
    created_at: iso(key.createdAtMs),
    revoked_at: isoOrNull(key.revokedAtMs),
    ...keySettingsJson(key),
    replaced_by: key.replacedBy,
    retires_at: isoOrNull(key.retiresAtMs),
    last_used_at: isoOrNull(key.lastUsedAtMs),
  };
}

/** A key just made, with the key itself: the only answer that holds it. */
export function createdApiKeyJson(key: ApiKeyInfo, raw: string): CreatedApiKey {
  return { id: key.id, org_id: key.orgId, name: key.name, key: raw, created_at: iso(key.createdAtMs), ...keySettingsJson(key) };
}

/** The key a rotation made (with the key itself), and when the key it replaces stops working. */
export function rotatedApiKeyJson(old: ApiKeyInfo, key: ApiKeyInfo, raw: string): RotatedApiKey {
  return { ...createdApiKeyJson(key, raw), replaces: old.id, old_key_retires_at: iso(old.retiresAtMs ?? old.createdAtMs) };
}

export function adminOrganizationJson(s: OrganizationStatus): AdminOrganization {
  return {
    id: s.org.id,
    name: s.org.name,
    paused: s.org.paused,
    created_at: iso(s.org.createdAtMs),
    balance: balanceJson(s.org.id, s.balance),
    preview: previewQuotaJson(s.preview),
    keys: { active: s.keys.active, revoked: s.keys.revoked },
  };
}

export function auditEntryJson(e: AuditEntry & { orgName: string | null }): AuditEntryJson {
  return {
    id: e.id,
    at: iso(e.atMs),
    action: e.action,
    org_id: e.orgId,
    org_name: e.orgName,
    target: e.targetId,
    source: e.source,
    client: e.client,
    remote_address: e.remoteAddress,
    details: e.details,
  };
}
