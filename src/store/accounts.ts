import type { AuditActor } from "../domain/audit.ts";
import type { ApiKeyRecord, BudgetPeriod, KeySettings, Organization } from "../domain/organizations.ts";
import { NO_KEY_SETTINGS } from "../domain/organizations.ts";
import {
  AUDIT_STATEMENTS,
  auditPage,
  audits,
  checkAudit,
  checkPauseAudit,
  decodeCursor,
  encodeCursor,
  keysetPage,
  recordAudit,
  withLimit,
} from "./admin-rows.ts";
import type { AuditPage, AuditQuery, OrganizationPage } from "./administration.ts";
import type { AccountsPart } from "./compose-store.ts";
import { checkEpochMs, checkKeySettings, checkPageLimit, checkText } from "./input-checks.ts";
import { KeyLookupCache } from "./key-lookup-cache.ts";
import { NAME_CANDIDATES, nameHolder, nameKey, nameTakenMessage } from "./organization-names.ts";
import { perTurnLookup } from "./per-turn-lookup.ts";
import { bigint, boolean, type DbRow, int, sqlite, Table, text } from "./schema/table.ts";
import { execute, query, type SqlProgram, type SqlRunner } from "./sql-program.ts";
import type { AccountStore } from "./store.ts";
import { StoreConflictError, StoreInputError } from "./store-errors.ts";
import { badCursor } from "./usage-cursor.ts";

/** An organizations row: the organization and the key its name is unique under (see organization-names.ts). */
type OrganizationRow = Organization & { nameKey: string | null };

const organizations = new Table<OrganizationRow>("organizations", {
  id: text("id"),
  name: text("name"),
  nameKey: text("name_key"),
  paused: boolean("paused"),
  createdAtMs: bigint("created_at_ms"),
});

/** An api_keys row: a key with its models as JSON array text, its budget in two columns, its lineage null when its own id. */
type ApiKeyRow = Omit<ApiKeyRecord, "models" | "budget" | "lineageId"> & {
  lineageId: string | null;
  models: string | null;
  budgetMicrousd: number | null;
  budgetPeriod: BudgetPeriod | null;
};

const apiKeys = new Table<ApiKeyRow>("api_keys", {
  id: text("id"),
  orgId: text("org_id"),
  name: text("name"),
  hash: text("hash"),
  createdAtMs: bigint("created_at_ms"),
  revokedAtMs: bigint("revoked_at_ms"),
  expiresAtMs: bigint("expires_at_ms"),
  models: text("models"),
  requestsPerMinute: int("requests_per_minute"),
  budgetMicrousd: bigint("budget_microusd"),
  budgetPeriod: text("budget_period"),
  replacedBy: text("replaced_by"),
  retiresAtMs: bigint("retires_at_ms"),
  lineageId: text("lineage_id"),
  lastUsedAtMs: bigint("last_used_at_ms"),
});

/** Field by field: every request reads its key, and a rest-and-spread copy takes V8 a slow path (microseconds). */
function toKey(row: DbRow): ApiKeyRecord {
  const k = apiKeys.fromRow(row);
  return {
    id: k.id,
    orgId: k.orgId,
    name: k.name,
    hash: k.hash,
    createdAtMs: k.createdAtMs,
    revokedAtMs: k.revokedAtMs,
    expiresAtMs: k.expiresAtMs,
    requestsPerMinute: k.requestsPerMinute,
    replacedBy: k.replacedBy,
    retiresAtMs: k.retiresAtMs,
    lastUsedAtMs: k.lastUsedAtMs,
    lineageId: k.lineageId ?? k.id,
    models: k.models === null ? null : (JSON.parse(k.models) as string[]),
    budget: k.budgetMicrousd === null || k.budgetPeriod === null ? null : { limitMicrousd: k.budgetMicrousd, period: k.budgetPeriod },
  };
}

/** The columns of a key's settings, for an INSERT or an UPDATE. */
function settingsColumns(s: Partial<KeySettings>): Partial<ApiKeyRow> {
  const row: Partial<ApiKeyRow> = {};
  if (s.expiresAtMs !== undefined) row.expiresAtMs = s.expiresAtMs;
  if (s.models !== undefined) row.models = s.models === null ? null : JSON.stringify(s.models);
  if (s.requestsPerMinute !== undefined) row.requestsPerMinute = s.requestsPerMinute;
  if (s.budget !== undefined) {
    row.budgetMicrousd = s.budget?.limitMicrousd ?? null;
    row.budgetPeriod = s.budget?.period ?? null;
  }
  return row;
}

function rowOf(key: ApiKeyRecord): ApiKeyRow {
  const { models: _models, budget: _budget, lineageId, ...rest } = key;
  return {
    ...rest,
    lineageId: lineageId === key.id ? null : lineageId,
    models: null,
    budgetMicrousd: null,
    budgetPeriod: null,
    ...settingsColumns(key),
  };
}

/** The settings of a key, copied (a rotation gives the new key the same). */
function settingsOf(key: KeySettings): KeySettings {
  return {
    expiresAtMs: key.expiresAtMs,
    models: key.models === null ? null : [...key.models],
    requestsPerMinute: key.requestsPerMinute,
    budget: key.budget === null ? null : { ...key.budget },
  };
}

type KeyChanges = Partial<KeySettings> & { name?: string | null };
const CHANGEABLE = ["name", "expiresAtMs", "models", "requestsPerMinute", "budget"] as const;

function sameValue(a: unknown, b: unknown): boolean {
  if (a === null || b === null || typeof a !== "object" || typeof b !== "object") return a === b;
  if (Array.isArray(a) || Array.isArray(b))
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => x === b[i]);
  const [x, y] = [a as Record<string, unknown>, b as Record<string, unknown>];
  return x.limitMicrousd === y.limitMicrousd && x.period === y.period;
}

/** The changes that differ from the key's values (an update that changes nothing writes nothing). */
function differences(key: ApiKeyRecord, changes: KeyChanges): KeyChanges {
  const changed: Record<string, unknown> = {};
  for (const field of CHANGEABLE) {
    const value = changes[field];
    if (value !== undefined && !sameValue(value, key[field])) changed[field] = value;
  }
  return changed as KeyChanges;
}

/** The columns an update writes (all of them, the merged values). */
const UPDATED_COLUMNS = ["name", "expiresAtMs", "models", "requestsPerMinute", "budgetMicrousd", "budgetPeriod"] as const;

const ORGANIZATION = organizations.fieldsExcept("nameKey");
const ORGANIZATION_COLUMNS = organizations.names(ORGANIZATION);
const SELECT_ORGANIZATIONS = `SELECT ${organizations.list(ORGANIZATION)} FROM organizations`;
const toOrganization = (row: DbRow): Organization => organizations.fromRow(row, ORGANIZATION);

/** A key with its organization in one row: the organization's columns named `o_<column>`. */
const SELECT_KEYS_WITH_ORGANIZATION = `SELECT ${apiKeys.list(apiKeys.fields, "k.")}, ${ORGANIZATION_COLUMNS.map((c) => `o.${c} AS o_${c}`).join(", ")} FROM api_keys k JOIN organizations o ON o.id = k.org_id`;
const organizationOfKey = (row: DbRow): Organization =>
  toOrganization(Object.fromEntries(ORGANIZATION_COLUMNS.map((c) => [c, row[`o_${c}`]])));

const SQL = {
  insertOrganization: sqlite.insert(organizations),
  // An id match first, then a name match (a name may equal another organization's id).
  findOrganization: `${SELECT_ORGANIZATIONS} WHERE id = ? OR name = ? ORDER BY (id = ?) DESC LIMIT 1`,
  listOrganizations: `${SELECT_ORGANIZATIONS} ORDER BY created_at_ms, id`,
  countOrganizations: "SELECT count(*) AS n FROM organizations",
  // Only a change of state counts (and is audited).
  setPaused: "UPDATE organizations SET paused = ? WHERE id = ? AND paused <> ?",
  organizationExists: "SELECT 1 AS found FROM organizations WHERE id = ?",
  insertKey: sqlite.insert(apiKeys),
  listKeys: `SELECT ${apiKeys.list()} FROM api_keys WHERE org_id = ? ORDER BY created_at_ms, id`,
  revokeKey: "UPDATE api_keys SET revoked_at_ms = ? WHERE id = ? AND revoked_at_ms IS NULL RETURNING org_id, name",
  // Changes nothing: locks the key (PostgreSQL: until the transaction ends) and answers it as it is then.
  lockKey: `UPDATE api_keys SET revoked_at_ms = revoked_at_ms WHERE id = ? RETURNING ${apiKeys.list()}`,
  // Only a key neither revoked, already rotated nor expired is rotated, once.
  retireKey: `UPDATE api_keys SET replaced_by = ?, retires_at_ms = ? WHERE id = ? AND revoked_at_ms IS NULL AND replaced_by IS NULL AND (expires_at_ms IS NULL OR expires_at_ms > ?) RETURNING ${apiKeys.list()}`,
  findKey: `SELECT ${apiKeys.list()} FROM api_keys WHERE id = ?`,
  updateKey: `UPDATE api_keys SET ${apiKeys.assign(UPDATED_COLUMNS, () => "?")} WHERE id = ? RETURNING ${apiKeys.list()}`,
  // Never back: another instance may have written a later use.
  keyUsed: "UPDATE api_keys SET last_used_at_ms = ? WHERE id = ? AND (last_used_at_ms IS NULL OR last_used_at_ms < ?)",
};

/** The organizations after a page's last one (keysetPage adds the limit). */
const ORGANIZATIONS_AFTER = `${SELECT_ORGANIZATIONS} WHERE (created_at_ms, id) > (?, ?) ORDER BY created_at_ms, id`;

/** The key lookups of one event-loop turn, by at most 256 ids, padded to a power of two: 9 statement texts. */
const LOOKUP_BATCH = 256;
const KEY_LOOKUPS = Array.from({ length: 9 }, (_, i) => `${SELECT_KEYS_WITH_ORGANIZATION} WHERE k.id IN (${sqlite.placeholders(2 ** i)})`);

/** Every statement of the accounts (a store may prepare them on opening). */
export const ACCOUNT_STATEMENTS: readonly string[] = [
  ...Object.values(SQL),
  withLimit(SQL.listOrganizations),
  withLimit(ORGANIZATIONS_AFTER),
  NAME_CANDIDATES,
  ...KEY_LOOKUPS,
  ...AUDIT_STATEMENTS,
];

const conflicts = {
  organizationId: (id: string) => `An organization with id ${JSON.stringify(id)} already exists`,
  keyId: (id: string) => `An API key with id ${JSON.stringify(id)} already exists`,
  // Never the hash itself.
  keyHash: "An API key with this hash already exists",
};

/** Keys with their organizations by key id. */
function* keysWithOrganization(ids: string[]): SqlProgram<Map<string, DbRow>> {
  const found = new Map<string, DbRow>();
  for (let i = 0; i < ids.length; i += LOOKUP_BATCH) {
    const batch = ids.slice(i, i + LOOKUP_BATCH);
    const power = Math.ceil(Math.log2(batch.length));
    const rows = yield* query(KEY_LOOKUPS[power]!, ...batch, ...Array(2 ** power - batch.length).fill(batch[0]));
    for (const row of rows) found.set(row.id as string, row);
  }
  return found;
}

const valuesOf = <T>(table: Table<T>, row: T): unknown[] => table.fields.map((f) => row[f] ?? null);

/**
 * Organizations, API keys and the audit log, written once for both databases: the checks, the conflicts, each change
 * with its audit entry in one transaction, and the pages. An adapter supplies only the SqlRunner.
 */
export class Accounts implements AccountsPart {
  /**
   * `found`: the keys findApiKeyForRequest keeps (off until cacheKeyLookups), every change below drops them; one per
   * store, shared by the Accounts of a connection opened again.
   */
  constructor(
    private readonly db: SqlRunner,
    private readonly found = new KeyLookupCache<DbRow>(),
  ) {}

  cacheKeyLookups(ttlMs: number): void {
    this.found.setTtl(ttlMs);
  }

  /** Runs a write that changes keys or organizations; the kept key lookups are dropped once it has ended, however. */
  async #changing<T>(write: () => Promise<T>): Promise<T> {
    try {
      return await write();
    } finally {
      this.found.changed();
    }
  }

  async createOrganization(input: Parameters<AccountStore["createOrganization"]>[0]): Promise<Organization> {
    const { audit } = input;
    checkAudit(audit);
    const organization: Organization = { id: input.id, name: input.name, paused: false, createdAtMs: input.nowMs };
    const key = nameKey(input.name);
    try {
      await this.db.write(function* () {
        const holder = yield* nameHolder(key);
        if (holder !== undefined) throw new StoreConflictError(nameTakenMessage(holder, input.name));
        yield* execute(SQL.insertOrganization, ...valuesOf(organizations, { ...organization, nameKey: key }));
        if (audit) yield* recordAudit(audits.organizationCreated(input, audit, input.nowMs));
      });
    } catch (err) {
      const violation = this.db.violation(err);
      if (violation?.kind !== "unique") throw err;
      if (violation.key === "organizations.id") throw new StoreConflictError(conflicts.organizationId(input.id));
      // The name (or its key) was taken by a creation that committed after this one looked.
      throw new StoreConflictError(nameTakenMessage((await this.db.read(() => nameHolder(key))) ?? input.name, input.name));
    }
    return organization;
  }

  async findOrganization(idOrName: string): Promise<Organization | null> {
    if (!this.db.holds(idOrName)) return null;
    const [row] = await this.db.read(() => query(SQL.findOrganization, idOrName, idOrName, idOrName));
    return row ? toOrganization(row) : null;
  }

  async listOrganizations(): Promise<Organization[]> {
    return (await this.db.read(() => query(SQL.listOrganizations))).map(toOrganization);
  }

  async countOrganizations(): Promise<number> {
    const [row] = await this.db.read(() => query(SQL.countOrganizations));
    return (row?.n as number | undefined) ?? 0;
  }

  /**
   * True when the organization exists, whether or not its state changed; audited only when it changed. Concurrent
   * calls with one state change it once: the second UPDATE waits for the first's lock, then finds nothing to change.
   */
  async setOrganizationPaused(orgId: string, paused: boolean, audit?: { actor: AuditActor; nowMs: number }): Promise<boolean> {
    checkPauseAudit(audit);
    if (!this.db.holds(orgId)) return false;
    return this.#changing(() =>
      this.db.write(function* () {
        if ((yield* execute(SQL.setPaused, paused, orgId, paused)) === 0) return (yield* query(SQL.organizationExists, orgId)).length > 0;
        if (audit) yield* recordAudit(audits.pauseChanged(orgId, paused, audit.actor, audit.nowMs));
        return true;
      }),
    );
  }

  async createApiKey(input: Parameters<AccountStore["createApiKey"]>[0]): Promise<ApiKeyRecord> {
    const { audit } = input;
    checkAudit(audit);
    if (input.settings !== undefined) {
      checkKeySettings(input.settings, "settings");
      if (!this.db.holds(...(input.settings.models ?? [])))
        throw new StoreInputError("settings.models must not contain U+0000", "settings.models");
    }
    const key: ApiKeyRecord = {
      id: input.id,
      orgId: input.orgId,
      name: input.name ?? null,
      hash: input.hash,
      createdAtMs: input.nowMs,
      revokedAtMs: null,
      ...settingsOf(input.settings ?? NO_KEY_SETTINGS),
      lineageId: input.id,
      replacedBy: null,
      retiresAtMs: null,
      lastUsedAtMs: null,
    };
    try {
      await this.db.write(function* () {
        yield* execute(SQL.insertKey, ...valuesOf(apiKeys, rowOf(key)));
        if (audit) yield* recordAudit(audits.keyCreated(key, audit, input.nowMs));
      });
    } catch (err) {
      throw this.keyInsertFailure(err, input);
    }
    return key;
  }

  /** A failed INSERT of a key as the caller's error: an unknown organization, a taken id or hash. */
  private keyInsertFailure(err: unknown, input: { id: string; orgId: string }): unknown {
    const violation = this.db.violation(err);
    if (violation?.kind === "foreign_key") return new StoreInputError(`No organization with id ${JSON.stringify(input.orgId)}`, "orgId");
    if (violation?.kind === "unique")
      return new StoreConflictError(violation.key === "api_keys.hash" ? conflicts.keyHash : conflicts.keyId(input.id));
    return err;
  }

  async updateApiKey(input: Parameters<AccountStore["updateApiKey"]>[0]): Promise<ApiKeyRecord | null> {
    const { keyId, changes, nowMs, audit } = input;
    checkText(keyId, "keyId");
    checkKeySettings(changes, "changes", true);
    if (changes.name !== undefined && changes.name !== null) checkText(changes.name, "changes.name");
    checkEpochMs(nowMs, "nowMs");
    checkAudit(audit);
    if (!this.db.holds(keyId)) return null;
    if (!this.db.holds(...(typeof changes.name === "string" ? [changes.name] : []), ...(changes.models ?? [])))
      throw new StoreInputError("changes must not contain U+0000", "changes");
    return this.#changing(() =>
      this.db.write(function* () {
        const [row] = yield* query(SQL.lockKey, keyId);
        if (!row) return null;
        const key = toKey(row);
        if (key.revokedAtMs !== null) throw new StoreConflictError(`The API key ${JSON.stringify(keyId)} is revoked`);
        if (key.replacedBy !== null)
          throw new StoreConflictError(`The API key ${JSON.stringify(keyId)} was rotated (replaced by ${JSON.stringify(key.replacedBy)})`);
        const changed = differences(key, changes);
        if (Object.keys(changed).length === 0) return key;
        const merged = rowOf({ ...key, ...changed } as ApiKeyRecord);
        const [updated] = yield* query(SQL.updateKey, ...UPDATED_COLUMNS.map((f) => merged[f]), keyId);
        if (audit) yield* recordAudit(audits.keyUpdated(key, changed, audit, nowMs));
        return toKey(updated!);
      }),
    );
  }

  async rotateApiKey(input: Parameters<AccountStore["rotateApiKey"]>[0]): Promise<{ old: ApiKeyRecord; created: ApiKeyRecord } | null> {
    const { keyId, newId, hash, nowMs, retiresAtMs, audit } = input;
    for (const [field, value] of [
      ["keyId", keyId],
      ["newId", newId],
      ["hash", hash],
    ] as const)
      checkText(value, field);
    checkEpochMs(nowMs, "nowMs");
    checkEpochMs(retiresAtMs, "retiresAtMs");
    if (retiresAtMs < nowMs) throw new StoreInputError("retiresAtMs must not be before nowMs", "retiresAtMs");
    checkAudit(audit);
    if (!this.db.holds(keyId)) return null;
    try {
      return await this.#changing(() =>
        this.db.write(function* () {
          const [retired] = yield* query(SQL.retireKey, newId, retiresAtMs, keyId, nowMs);
          if (!retired) {
            const [row] = yield* query(SQL.findKey, keyId);
            if (!row) return null;
            const found = toKey(row);
            throw new StoreConflictError(
              found.revokedAtMs !== null
                ? `The API key ${JSON.stringify(keyId)} is revoked`
                : found.replacedBy !== null
                  ? `The API key ${JSON.stringify(keyId)} was already rotated (replaced by ${JSON.stringify(found.replacedBy)})`
                  : `The API key ${JSON.stringify(keyId)} has expired`,
            );
          }
          const old = toKey(retired);
          const created: ApiKeyRecord = {
            id: newId,
            orgId: old.orgId,
            name: old.name,
            hash,
            createdAtMs: nowMs,
            revokedAtMs: null,
            ...settingsOf(old),
            // One budget spend and one per-minute count for the key and the keys it replaces.
            lineageId: old.lineageId,
            replacedBy: null,
            retiresAtMs: null,
            lastUsedAtMs: null,
          };
          yield* execute(SQL.insertKey, ...valuesOf(apiKeys, rowOf(created)));
          if (audit) {
            yield* recordAudit(audits.keyCreated(created, audit, nowMs, old.id));
            yield* recordAudit(audits.keyRotated(old, newId, retiresAtMs, audit, nowMs));
          }
          return { old, created };
        }),
      );
    } catch (err) {
      throw this.keyInsertFailure(err, { id: newId, orgId: "" });
    }
  }

  /** One transaction; each key's row is written in id order, so that two instances' writes cannot deadlock. */
  async recordKeyUse(uses: readonly { keyId: string; atMs: number }[]): Promise<void> {
    if (!Array.isArray(uses)) throw new StoreInputError("uses must be an array", "uses");
    const latest = new Map<string, number>();
    for (const [i, use] of uses.entries()) {
      checkText(use?.keyId, `uses[${i}].keyId`);
      checkEpochMs(use.atMs, `uses[${i}].atMs`);
      if (use.atMs < 0) throw new StoreInputError(`uses[${i}].atMs must be 0 or more`, `uses[${i}].atMs`);
      if (this.db.holds(use.keyId)) latest.set(use.keyId, Math.max(use.atMs, latest.get(use.keyId) ?? 0));
    }
    if (latest.size === 0) return;
    const ordered = [...latest].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    await this.db.write(function* () {
      for (const [keyId, atMs] of ordered) yield* execute(SQL.keyUsed, atMs, keyId, atMs);
    });
  }

  /** Every request looks its key up (unless it is kept: cacheKeyLookups): the lookups of one event-loop turn share one query. */
  readonly #keys = perTurnLookup((ids: string[]) => this.db.read(() => keysWithOrganization(ids)));

  async findApiKey(keyId: string): Promise<{ key: ApiKeyRecord; org: Organization } | null> {
    if (!this.db.holds(keyId)) return null;
    const row = await this.#keys(keyId);
    return row ? { key: toKey(row), org: organizationOfKey(row) } : null;
  }

  async findApiKeyForRequest(keyId: string): Promise<{ key: ApiKeyRecord; org: Organization } | null> {
    if (!this.db.holds(keyId)) return null;
    const row = await this.found.get(keyId, () => this.#keys(keyId));
    return row ? { key: toKey(row), org: organizationOfKey(row) } : null;
  }

  async listApiKeys(orgId: string): Promise<ApiKeyRecord[]> {
    if (!this.db.holds(orgId)) return [];
    return (await this.db.read(() => query(SQL.listKeys, orgId))).map(toKey);
  }

  async revokeApiKey(keyId: string, nowMs: number, audit?: AuditActor): Promise<boolean> {
    checkAudit(audit);
    if (!this.db.holds(keyId)) return false;
    return this.#changing(() =>
      this.db.write(function* () {
        const [revoked] = yield* query(SQL.revokeKey, nowMs, keyId);
        if (!revoked) return false;
        const key = { id: keyId, orgId: revoked.org_id as string, name: revoked.name as string | null };
        if (audit) yield* recordAudit(audits.key("key.revoked", key, audit, nowMs));
        return true;
      }),
    );
  }

  async listOrganizationsPage(page: { cursor?: string; limit: number }): Promise<OrganizationPage> {
    checkPageLimit(page.limit);
    const after = page.cursor === undefined ? undefined : decodeCursor("org", page.cursor);
    // No stored id holds text the database cannot hold, so no page of ours ended at one: not a cursor we gave out.
    if (after && !this.db.holds(after.id)) throw badCursor();
    const [sql, params] = after ? [ORGANIZATIONS_AFTER, [after.position, after.id]] : [SQL.listOrganizations, []];
    const cursorOf = (last: Organization) => encodeCursor("org", last.createdAtMs, last.id);
    const { items, nextCursor } = await this.db.read(() => keysetPage(sql, params, page.limit, toOrganization, cursorOf));
    return { organizations: items, nextCursor };
  }

  async listAudit(page: AuditQuery): Promise<AuditPage> {
    checkPageLimit(page.limit);
    const before = page.cursor === undefined ? undefined : decodeCursor("audit", page.cursor).position;
    if (page.orgId !== undefined && !this.db.holds(page.orgId)) return { entries: [], nextCursor: null };
    const { items, nextCursor } = await this.db.read(() => auditPage(page.orgId, before, page.limit));
    return { entries: items, nextCursor };
  }
}
