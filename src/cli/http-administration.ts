import { AdminError } from "../admin/admin-error.ts";
import type { KeySettingsRequest } from "../admin/key-settings.ts";
import type { AdminOperations, ApiKeyInfo, KeyUpdate, NamedAuditPage, OrganizationStatus, UsageSummary } from "../admin/operations.ts";
import {
  AdminApiKey,
  AdminApiKeyList,
  AdminBalance,
  AdminOrganization,
  AdminOrganizationPage,
  AdminUsageSummary,
  AuditPageJson,
  CreatedApiKey,
  RotatedApiKey,
} from "../contract/admin.ts";
import { UsagePageJson, UsageRecordJson } from "../contract/usage.ts";
import type { AuditEntry } from "../domain/audit.ts";
import type { Balance } from "../domain/credits.ts";
import { formatUsd, parseUsd } from "../domain/money.ts";
import type { KeySettings, Organization } from "../domain/organizations.ts";
import { MAX_PAGE_LIMIT } from "../domain/paging.ts";
import type { UsageRecord } from "../domain/usage-records.ts";
import type { UsagePage, UsageQuery } from "../store/store.ts";
import { AdminHttpClient, type AdminHttpClientOptions } from "./admin-http-client.ts";

/** The longest organization reference or key id the admin API takes in a path. */
const MAX_PATH_PARAM = 200;

const ms = (iso: string) => Date.parse(iso);
const segment = (text: string) => encodeURIComponent(text);

function organizationOf(json: { id: string; name: string; paused: boolean; created_at: string }): Organization {
  return { id: json.id, name: json.name, paused: json.paused, createdAtMs: ms(json.created_at) };
}

function balanceOf(json: AdminBalance): Balance {
  return {
    available: json.available_microusd,
    reserved: json.reserved_microusd,
    spent: json.spent_microusd,
    granted: json.granted_microusd,
  };
}

function statusOf(json: AdminOrganization): OrganizationStatus {
  return {
    org: organizationOf(json),
    balance: balanceOf(json.balance),
    preview: { day: json.preview.date, used: json.preview.used, limit: json.preview.limit, resetsAtMs: ms(json.preview.resets_at) },
    keys: { active: json.keys.active, revoked: json.keys.revoked },
  };
}

const msOrNull = (iso: string | null) => (iso === null ? null : ms(iso));

function keySettingsOf(json: Pick<AdminApiKey, "expires_at" | "models" | "requests_per_minute" | "budget">): KeySettings {
  return {
    expiresAtMs: msOrNull(json.expires_at),
    models: json.models,
    requestsPerMinute: json.requests_per_minute,
    budget: json.budget === null ? null : { limitMicrousd: Number(parseUsd(json.budget.usd) ?? 0n), period: json.budget.period },
  };
}

function keyOf(json: AdminApiKey): ApiKeyInfo {
  return {
    id: json.id,
    orgId: json.org_id,
    name: json.name,
    createdAtMs: ms(json.created_at),
    revokedAtMs: msOrNull(json.revoked_at),
    ...keySettingsOf(json),
    replacedBy: json.replaced_by,
    retiresAtMs: msOrNull(json.retires_at),
    lastUsedAtMs: msOrNull(json.last_used_at),
  };
}

/** A key just made, as the answer shows it (not yet used, not rotated). */
function createdKeyOf(json: CreatedApiKey): ApiKeyInfo {
  return {
    id: json.id,
    orgId: json.org_id,
    name: json.name,
    createdAtMs: ms(json.created_at),
    revokedAtMs: null,
    ...keySettingsOf(json),
    replacedBy: null,
    retiresAtMs: null,
    lastUsedAtMs: null,
  };
}

function usageRecordOf(orgId: string, json: UsageRecordJson): UsageRecord {
  return {
    requestId: json.request_id,
    orgId,
    keyId: json.key_id,
    createdAtMs: ms(json.created_at),
    completedAtMs: json.completed_at === null ? null : ms(json.completed_at),
    source: json.source,
    model: json.model,
    mode: json.service_mode,
    outcome: json.outcome,
    httpStatus: json.http_status,
    inputTokens: json.input_tokens,
    outputTokens: json.output_tokens,
    costMicrousd: json.cost_microusd,
    latencyMs: json.latency_ms,
    gatewayLatencyMs: json.gateway_latency_ms,
    errorDetail: json.error,
    overReservation: json.over_reservation,
    deployment: json.deployment,
    attempts: json.attempts,
  };
}

function auditEntryOf(json: AuditPageJson["data"][number]): NamedAuditPage["entries"][number] {
  return {
    id: json.id,
    orgName: json.org_name,
    atMs: ms(json.at),
    action: json.action as AuditEntry["action"],
    orgId: json.org_id,
    targetId: json.target,
    source: json.source,
    client: json.client,
    remoteAddress: json.remote_address,
    details: json.details,
  };
}

function organizationNotFound(ref: string): AdminError {
  return new AdminError("not_found", `No organization with id or name ${JSON.stringify(ref)}.`);
}

function keyNotFound(keyId: string): AdminError {
  return new AdminError("not_found", `No API key with id ${JSON.stringify(keyId)}.`);
}

/**
 * Administration through a gateway's admin API (/admin/v1), for `tds --url`: the same operations as on the database,
 * recorded in the audit log by the server (source "http", client "cli:OPERATOR"). Failures are AdminErrors with the server's detail.
 */
export class HttpAdministration implements AdminOperations {
  private readonly http: AdminHttpClient;
  /** Organizations looked up by reference during this run, for operations called page by page (usage). */
  private readonly known = new Map<string, Promise<Organization>>();

  constructor(options: AdminHttpClientOptions) {
    this.http = new AdminHttpClient(options);
  }

  async createOrganization(name: string): Promise<Organization> {
    const { body } = await this.http.call<AdminOrganization>({ method: "POST", path: "/organizations", body: { name } }, AdminOrganization);
    return organizationOf(body);
  }

  async listOrganizations(page: { cursor?: string; limit: number }) {
    const { organizations, nextCursor } = await this.organizationPage(page);
    return { organizations: organizations.map((s) => s.org), nextCursor };
  }

  async organization(ref: string): Promise<OrganizationStatus> {
    if (ref === "" || [...ref].length > MAX_PATH_PARAM) throw organizationNotFound(ref);
    if (ref === "." || ref === "..") {
      // A URL path cannot carry these as a segment (they are dot segments even when percent-encoded): find the name in the list.
      for await (const status of this.allOrganizations()) if (status.org.name === ref) return status;
      throw organizationNotFound(ref);
    }
    const { body } = await this.http.call<AdminOrganization>({ method: "GET", path: `/organizations/${segment(ref)}` }, AdminOrganization);
    return statusOf(body);
  }

  async setPaused(ref: string, paused: boolean) {
    const { org } = await this.organization(ref);
    // As on the database: nothing is changed (or recorded) when it already is in that state.
    if (org.paused === paused) return { org, changed: false };
    const { body } = await this.http.call<AdminOrganization>(
      { method: "PATCH", path: `/organizations/${segment(org.id)}`, body: { paused } },
      AdminOrganization,
    );
    return { org: organizationOf(body), changed: true };
  }

  async createKey(ref: string, name: string | null, settings: KeySettingsRequest = {}) {
    const { org } = await this.organization(ref);
    const { body } = await this.http.call<CreatedApiKey>(
      { method: "POST", path: `/organizations/${segment(org.id)}/keys`, body: { ...(name === null ? {} : { name }), ...settings } },
      CreatedApiKey,
    );
    return { org, key: createdKeyOf(body), raw: body.key };
  }

  async updateKey(keyId: string, changes: KeyUpdate) {
    if (keyId === "" || [...keyId].length > MAX_PATH_PARAM) throw keyNotFound(keyId);
    const { body } = await this.http.call<AdminApiKey>({ method: "PATCH", path: `/keys/${segment(keyId)}`, body: changes }, AdminApiKey);
    return { org: (await this.organization(body.org_id)).org, key: keyOf(body) };
  }

  async rotateKey(keyId: string, graceSeconds?: number) {
    if (keyId === "" || [...keyId].length > MAX_PATH_PARAM) throw keyNotFound(keyId);
    const { body } = await this.http.call<RotatedApiKey>(
      { method: "POST", path: `/keys/${segment(keyId)}/rotate`, body: graceSeconds === undefined ? {} : { grace_seconds: graceSeconds } },
      RotatedApiKey,
    );
    const { org, key: old } = await this.key(body.replaces);
    return { org, old, key: createdKeyOf(body), raw: body.key };
  }

  async listKeys(ref: string) {
    const { org } = await this.organization(ref);
    return { org, keys: await this.keysOf(org.id) };
  }

  async key(keyId: string): Promise<{ org: Organization; key: ApiKeyInfo }> {
    if (keyId === "" || [...keyId].length > MAX_PATH_PARAM) throw keyNotFound(keyId);
    const { body } = await this.http.call<AdminApiKey>({ method: "GET", path: `/keys/${segment(keyId)}` }, AdminApiKey);
    return { org: (await this.organization(body.org_id)).org, key: keyOf(body) };
  }

  async revokeKey(keyId: string) {
    const found = await this.key(keyId);
    if (found.key.revokedAtMs !== null) return { ...found, revoked: false };
    await this.http.call<null>({ method: "DELETE", path: `/keys/${segment(keyId)}` }, null);
    const after = (await this.keysOf(found.org.id)).find((k) => k.id === keyId) ?? found.key;
    return { org: found.org, key: after, revoked: true };
  }

  async grantCredits(ref: string, grant: { amountMicrousd: number; note?: string; idempotencyKey?: string }) {
    const { org } = await this.organization(ref);
    const { body, headers } = await this.http.call<AdminBalance>(
      {
        method: "POST",
        path: `/organizations/${segment(org.id)}/credits`,
        body: { amount_usd: formatUsd(grant.amountMicrousd), ...(grant.note === undefined ? {} : { note: grant.note }) },
        ...(grant.idempotencyKey === undefined ? {} : { headers: { "idempotency-key": grant.idempotencyKey } }),
      },
      AdminBalance,
    );
    return { org, balance: balanceOf(body), replayed: headers.get("idempotent-replayed") === "true" };
  }

  async usage(ref: string, query: UsageQuery): Promise<{ org: Organization; page: UsagePage }> {
    const org = await this.remembered(ref);
    return { org, page: await this.usagePage(org, query) };
  }

  async usageRecord(ref: string, requestId: string) {
    const org = await this.remembered(ref);
    try {
      const { body } = await this.http.call<UsageRecordJson>(
        { method: "GET", path: `/organizations/${segment(org.id)}/usage/${segment(requestId)}` },
        UsageRecordJson,
      );
      return { org, record: usageRecordOf(org.id, body) };
    } catch (err) {
      // The organization exists (just looked up): a 404 is about the record.
      if (err instanceof AdminError && err.reason === "not_found") return { org, record: null };
      throw err;
    }
  }

  async usageSummary(days: number): Promise<UsageSummary> {
    const { body } = await this.http.call<AdminUsageSummary>({ method: "GET", path: "/usage/summary", query: { days } }, AdminUsageSummary);
    return {
      fromMs: ms(body.from),
      toMs: ms(body.to),
      // The API lists every day of the period; the operation, only days with requests.
      days: body.days
        .filter((d) => d.requests > 0)
        .map((d) => ({
          dayStartMs: ms(`${d.date}T00:00:00.000Z`),
          requests: d.requests,
          inputTokens: d.input_tokens,
          outputTokens: d.output_tokens,
          costMicrousd: d.cost_microusd,
        })),
      organizations: body.organizations.map((o) => ({
        orgId: o.id,
        name: o.name,
        requests: o.requests,
        inputTokens: o.input_tokens,
        outputTokens: o.output_tokens,
        costMicrousd: o.cost_microusd,
      })),
    };
  }

  async audit(query: { org?: string; cursor?: string; limit: number }): Promise<NamedAuditPage> {
    if (query.org !== undefined && (query.org === "" || [...query.org].length > MAX_PATH_PARAM)) throw organizationNotFound(query.org);
    const { body } = await this.http.call<AuditPageJson>(
      { method: "GET", path: "/audit", query: { org: query.org, cursor: query.cursor, limit: query.limit } },
      AuditPageJson,
    );
    return { entries: body.data.map(auditEntryOf), nextCursor: body.next_cursor };
  }

  private async organizationPage(page: {
    cursor?: string;
    limit: number;
  }): Promise<{ organizations: OrganizationStatus[]; nextCursor: string | null }> {
    const { body } = await this.http.call<AdminOrganizationPage>(
      { method: "GET", path: "/organizations", query: { limit: page.limit, cursor: page.cursor } },
      AdminOrganizationPage,
    );
    return { organizations: body.data.map(statusOf), nextCursor: body.next_cursor };
  }

  /** Every organization with its status, oldest first, page by page. */
  private async *allOrganizations(): AsyncGenerator<OrganizationStatus> {
    let cursor: string | undefined;
    do {
      const page = await this.organizationPage({ limit: MAX_PAGE_LIMIT, ...(cursor === undefined ? {} : { cursor }) });
      yield* page.organizations;
      cursor = page.nextCursor ?? undefined;
    } while (cursor !== undefined);
  }

  private async usagePage(org: Organization, query: UsageQuery): Promise<UsagePage> {
    const { body } = await this.http.call<UsagePageJson>(
      {
        method: "GET",
        path: `/organizations/${segment(org.id)}/usage`,
        query: {
          limit: query.limit,
          cursor: query.cursor,
          outcome: query.outcome,
          from: query.fromMs === undefined ? undefined : new Date(query.fromMs).toISOString(),
          to: query.toMs === undefined ? undefined : new Date(query.toMs).toISOString(),
        },
      },
      UsagePageJson,
    );
    return { records: body.data.map((r) => usageRecordOf(org.id, r)), nextCursor: body.next_cursor };
  }

  private async keysOf(orgId: string): Promise<ApiKeyInfo[]> {
    const { body } = await this.http.call<{ data: AdminApiKey[] }>(
      { method: "GET", path: `/organizations/${segment(orgId)}/keys` },
      AdminApiKeyList,
    );
    return body.data.map(keyOf);
  }

  private remembered(ref: string): Promise<Organization> {
    let org = this.known.get(ref);
    if (!org) {
      org = this.organization(ref).then((s) => {
        this.known.set(s.org.id, Promise.resolve(s.org));
        return s.org;
      });
      this.known.set(ref, org);
      // A failed lookup is not kept.
      org.catch(() => this.known.delete(ref));
    }
    return org;
  }
}
