import type { AdminApiKey, AdminBalance, AdminOrganization, AuditEntryJson } from "../contract/admin.ts";
import type { AuditEntry } from "../domain/audit.ts";
import type { Balance } from "../domain/credits.ts";
import { formatUsd } from "../domain/money.ts";
import { creditsJson, previewQuotaJson } from "../presentation/organization-json.ts";
import type { ApiKeyInfo, OrganizationStatus } from "./operations.ts";

const iso = (ms: number) => new Date(ms).toISOString();

/** Credits as the admin API and `tds credits … --json` show them: each amount in integer microUSD and as a decimal USD string. */
export function balanceJson(orgId: string, balance: Balance): AdminBalance {
  return {
    org_id: orgId,
    ...creditsJson(balance),
    granted_microusd: balance.granted,
    granted_usd: formatUsd(balance.granted),
  };
}

/** A key as listed: never the hash, never the key. */
export function apiKeyJson(key: ApiKeyInfo): AdminApiKey {
  return {
    id: key.id,
    org_id: key.orgId,
    name: key.name,
    created_at: iso(key.createdAtMs),
    revoked_at: key.revokedAtMs === null ? null : iso(key.revokedAtMs),
  };
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
