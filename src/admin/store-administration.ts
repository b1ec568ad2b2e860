import { createHash } from "node:crypto";
import { MAX_GRACE_SECONDS } from "../contract/admin.ts";
import { generateApiKey, newOrganizationId } from "../domain/api-keys.ts";
import type { AuditActor } from "../domain/audit.ts";
import { type ApiKeyRecord, NO_KEY_SETTINGS, type Organization } from "../domain/organizations.ts";
import { previewUse } from "../gateway/preview-use.ts";
import { usageSummary } from "../gateway/usage-summary.ts";
import type { Store, UsageQuery } from "../store/store.ts";
import { StoreConflictError } from "../store/store-errors.ts";
import { AdminError } from "./admin-error.ts";
import { type KeyRules, type KeySettingsRequest, keySettingsOf } from "./key-settings.ts";
import { keyStatus, keyWorks } from "./key-status.ts";
import { checkName, looksLikeOrganizationId } from "./names.ts";
import {
  type AdminOperations,
  type ApiKeyInfo,
  DEFAULT_GRACE_SECONDS,
  type KeyUpdate,
  type NamedAuditPage,
  type OrganizationStatus,
  type UsageSummary,
} from "./operations.ts";

export interface StoreAdministrationDeps {
  store: Store;
  /** Today's preview limit per organization (shown with its use). */
  previewRequestLimit: number;
  nowMs(): number;
  /** Who is acting: recorded with every change. */
  actor: AuditActor;
  /** What a key's settings are checked against (the organization's limit, the models served); absent: only their shape. */
  keyRules?: KeyRules;
}

const keyNotFound = (keyId: string) => new AdminError("not_found", `No API key with id ${JSON.stringify(keyId)}.`);

function keyInfo(key: ApiKeyRecord): ApiKeyInfo {
  const { hash: _hash, lineageId: _lineageId, ...info } = key;
  return info;
}

/** A name from a request, or an `invalid` AdminError naming the field. */
export function validName(field: string, label: string, raw: string): string {
  const checked = checkName(raw);
  if ("problem" in checked) throw new AdminError("invalid", `${label} ${checked.problem}`, field, checked.problem);
  return checked.name;
}

/** Administration on the database: each change and its audit entry commit together. */
export class StoreAdministration implements AdminOperations {
  constructor(private readonly deps: StoreAdministrationDeps) {}

  private get store(): Store {
    return this.deps.store;
  }

  private async find(ref: string): Promise<Organization> {
    const org = await this.store.findOrganization(ref);
    if (!org) throw new AdminError("not_found", `No organization with id or name ${JSON.stringify(ref)}.`);
    return org;
  }

  async createOrganization(rawName: string): Promise<Organization> {
    const name = validName("name", "The organization name", rawName);
    if (looksLikeOrganizationId(name)) {
      throw new AdminError(
        "invalid",
        "The organization name must not look like an organization id (org_ and 12 characters)",
        "name",
        "must not look like an organization id (org_ and 12 characters)",
      );
    }
    try {
      return await this.store.createOrganization({ id: newOrganizationId(), name, nowMs: this.deps.nowMs(), audit: this.deps.actor });
    } catch (err) {
      // The store's message names the organization that has the name (names are unique regardless of case).
      if (err instanceof StoreConflictError) throw new AdminError("name_taken", `${err.message}.`);
      throw err;
    }
  }

  async listOrganizations(page: { cursor?: string; limit: number }) {
    return this.store.listOrganizationsPage(page);
  }

  async organization(ref: string): Promise<OrganizationStatus> {
    return this.status(await this.find(ref));
  }

  /** Credits, today's preview use and key counts of one organization. */
  async status(org: Organization): Promise<OrganizationStatus> {
    const [balance, preview, keys] = await Promise.all([
      this.store.getBalance(org.id),
      previewUse(this.store, { orgId: org.id, limit: this.deps.previewRequestLimit, nowMs: this.deps.nowMs() }),
      this.store.listApiKeys(org.id),
    ]);
    const nowMs = this.deps.nowMs();
    const statuses = keys.map((k) => keyStatus(k, nowMs));
    const active = statuses.filter(keyWorks).length;
    const revoked = statuses.filter((s) => s === "revoked").length;
    return { org, balance, preview, keys: { active, revoked } };
  }

  async setPaused(ref: string, paused: boolean) {
    const org = await this.find(ref);
    if (org.paused === paused) return { org, changed: false };
    if (!(await this.store.setOrganizationPaused(org.id, paused, { actor: this.deps.actor, nowMs: this.deps.nowMs() }))) {
      throw new AdminError("not_found", `No organization with id or name ${JSON.stringify(ref)}.`);
    }
    return { org: { ...org, paused }, changed: true };
  }

  async createKey(ref: string, rawName: string | null, request: KeySettingsRequest = {}) {
    const name = rawName === null ? null : validName("name", "The key name", rawName);
    const settings = await keySettingsOf(request, this.deps.keyRules, this.deps.nowMs());
    const org = await this.find(ref);
    // Only the hash is stored; the raw key exists in this process until it is answered or printed.
    const generated = generateApiKey();
    const key = await this.store.createApiKey({
      id: generated.id,
      orgId: org.id,
      name,
      hash: generated.hash,
      nowMs: this.deps.nowMs(),
      settings: { ...NO_KEY_SETTINGS, ...settings },
      audit: this.deps.actor,
    });
    return { org, key: keyInfo(key), raw: generated.raw };
  }

  async updateKey(keyId: string, update: KeyUpdate) {
    const { name: rawName, ...request } = update;
    const name = rawName === undefined || rawName === null ? rawName : validName("name", "The key name", rawName);
    const settings = await keySettingsOf(request, this.deps.keyRules, this.deps.nowMs());
    const changes = { ...settings, ...(name === undefined ? {} : { name }) };
    if (Object.keys(changes).length === 0)
      throw new AdminError("invalid", "Nothing to change: give a name or a setting", "(body)", "must change a name or a setting");
    let updated: ApiKeyRecord | null;
    try {
      updated = await this.store.updateApiKey({ keyId, changes, nowMs: this.deps.nowMs(), audit: this.deps.actor });
    } catch (err) {
      if (!(err instanceof StoreConflictError)) throw err;
      const found = (await this.store.findApiKey(keyId))?.key;
      if (found?.revokedAtMs == null && found?.replacedBy != null)
        throw new AdminError(
          "conflict",
          `The API key ${JSON.stringify(keyId)} was rotated (replaced by ${found.replacedBy}); it cannot be changed: change ${found.replacedBy} instead.`,
        );
      throw new AdminError("conflict", `The API key ${JSON.stringify(keyId)} is revoked; it cannot be changed.`);
    }
    if (!updated) throw keyNotFound(keyId);
    const org = await this.store.findOrganization(updated.orgId);
    if (!org) throw keyNotFound(keyId);
    return { org, key: keyInfo(updated) };
  }

  async rotateKey(keyId: string, graceSeconds = DEFAULT_GRACE_SECONDS) {
    if (!Number.isSafeInteger(graceSeconds) || graceSeconds < 0 || graceSeconds > MAX_GRACE_SECONDS)
      throw new AdminError(
        "invalid",
        `The grace period must be a whole number of seconds from 0 to ${MAX_GRACE_SECONDS} (30 days)`,
        "grace_seconds",
        `must be a whole number of seconds from 0 to ${MAX_GRACE_SECONDS} (30 days)`,
      );
    const generated = generateApiKey();
    const nowMs = this.deps.nowMs();
    let rotated: Awaited<ReturnType<Store["rotateApiKey"]>>;
    try {
      rotated = await this.store.rotateApiKey({
        keyId,
        newId: generated.id,
        hash: generated.hash,
        nowMs,
        retiresAtMs: nowMs + graceSeconds * 1000,
        audit: this.deps.actor,
      });
    } catch (err) {
      const found = err instanceof StoreConflictError ? (await this.store.findApiKey(keyId))?.key : undefined;
      if (found?.revokedAtMs != null)
        throw new AdminError("conflict", `The API key ${JSON.stringify(keyId)} is revoked; it cannot be rotated.`);
      if (found?.replacedBy != null)
        throw new AdminError(
          "conflict",
          `The API key ${JSON.stringify(keyId)} was already rotated: it is replaced by ${found.replacedBy}.`,
        );
      if (found?.expiresAtMs != null && found.expiresAtMs <= nowMs)
        throw new AdminError(
          "conflict",
          `The API key ${JSON.stringify(keyId)} has expired; it cannot be rotated (create a new key, or extend its expiry first).`,
        );
      // Else the new key's id was taken (very unlikely).
      throw err;
    }
    if (!rotated) throw keyNotFound(keyId);
    const org = await this.store.findOrganization(rotated.old.orgId);
    if (!org) throw keyNotFound(keyId);
    return { org, old: keyInfo(rotated.old), key: keyInfo(rotated.created), raw: generated.raw };
  }

  async listKeys(ref: string) {
    const org = await this.find(ref);
    return { org, keys: (await this.store.listApiKeys(org.id)).map(keyInfo) };
  }

  async key(keyId: string) {
    const found = await this.store.findApiKey(keyId);
    if (!found) throw keyNotFound(keyId);
    return { org: found.org, key: keyInfo(found.key) };
  }

  async revokeKey(keyId: string) {
    const found = await this.store.findApiKey(keyId);
    if (!found) throw keyNotFound(keyId);
    const revoked = await this.store.revokeApiKey(found.key.id, this.deps.nowMs(), this.deps.actor);
    const after = (await this.store.findApiKey(found.key.id))?.key ?? found.key;
    return { org: found.org, key: keyInfo(after), revoked };
  }

  async grantCredits(ref: string, grant: { amountMicrousd: number; note?: string; idempotencyKey?: string }) {
    if (!Number.isSafeInteger(grant.amountMicrousd) || grant.amountMicrousd <= 0) {
      throw new AdminError("invalid", "The amount must be more than 0", "amount_usd", "must be more than 0");
    }
    const note = grant.note === undefined ? undefined : validName("note", "The note", grant.note);
    const org = await this.find(ref);
    const input = {
      orgId: org.id,
      amountMicrousd: grant.amountMicrousd,
      nowMs: this.deps.nowMs(),
      audit: this.deps.actor,
      ...(note === undefined ? {} : { note }),
    };
    if (grant.idempotencyKey === undefined) return { org, balance: await this.store.grantCredits(input), replayed: false };
    // The request a key stands for: the organization, the amount and the note.
    const requestHash = createHash("sha256")
      .update(JSON.stringify([org.id, grant.amountMicrousd, note ?? null]))
      .digest("hex");
    const result = await this.store.grantCreditsOnce({ ...input, idempotency: { key: grant.idempotencyKey, requestHash } });
    if (result.kind === "mismatch") {
      throw new AdminError(
        "idempotency_key_reused",
        "This Idempotency-Key was already used with a different grant (organization, amount or note).",
      );
    }
    return { org, balance: result.balance, replayed: result.kind === "replayed" };
  }

  async usage(ref: string, query: UsageQuery) {
    const org = await this.find(ref);
    return { org, page: await this.store.listUsage(org.id, query) };
  }

  async usageRecord(ref: string, requestId: string) {
    const org = await this.find(ref);
    return { org, record: await this.store.getUsage(org.id, requestId) };
  }

  /** The summary of GET /admin/v1/usage/summary, without the days that had no requests. */
  async usageSummary(days: number): Promise<UsageSummary> {
    const summary = await usageSummary(this.store, { nowMs: this.deps.nowMs(), days });
    return { ...summary, days: summary.days.filter((d) => d.requests > 0).map(({ date: _date, ...day }) => day) };
  }

  async audit(query: { org?: string; cursor?: string; limit: number }): Promise<NamedAuditPage> {
    const orgId = query.org === undefined ? undefined : (await this.find(query.org)).id;
    const page = await this.store.listAudit({
      limit: query.limit,
      ...(orgId ? { orgId } : {}),
      ...(query.cursor ? { cursor: query.cursor } : {}),
    });
    const names = new Map<string, string | null>();
    for (const id of new Set(page.entries.map((e) => e.orgId))) names.set(id, (await this.store.findOrganization(id))?.name ?? null);
    return { entries: page.entries.map((e) => ({ ...e, orgName: names.get(e.orgId) ?? null })), nextCursor: page.nextCursor };
  }
}
