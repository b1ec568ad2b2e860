import type { AuditActor } from "../domain/audit.ts";
import type { ApiKeyRecord, Organization } from "../domain/organizations.ts";
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
import { checkPageLimit } from "./input-checks.ts";
import { NAME_CANDIDATES, nameHolder, nameKey, nameTakenMessage } from "./organization-names.ts";
import { perTurnLookup } from "./per-turn-lookup.ts";
import { bigint, boolean, type DbRow, sqlite, Table, text } from "./schema/table.ts";
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

const apiKeys = new Table<ApiKeyRecord>("api_keys", {
  id: text("id"),
  orgId: text("org_id"),
  name: text("name"),
  hash: text("hash"),
  createdAtMs: bigint("created_at_ms"),
  revokedAtMs: bigint("revoked_at_ms"),
});

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

const valuesOf = <T>(table: Table<T>, row: T): unknown[] => table.fields.map((f) => row[f]);

/**
 * Organizations, API keys and the audit log, written once for both databases: the checks, the conflicts, each change
 * with its audit entry in one transaction, and the pages. An adapter supplies only the SqlRunner.
 */
export class Accounts implements AccountsPart {
  constructor(private readonly db: SqlRunner) {}

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
    return this.db.write(function* () {
      if ((yield* execute(SQL.setPaused, paused, orgId, paused)) === 0) return (yield* query(SQL.organizationExists, orgId)).length > 0;
      if (audit) yield* recordAudit(audits.pauseChanged(orgId, paused, audit.actor, audit.nowMs));
      return true;
    });
  }

  async createApiKey(input: Parameters<AccountStore["createApiKey"]>[0]): Promise<ApiKeyRecord> {
    const { audit } = input;
    checkAudit(audit);
    const key: ApiKeyRecord = {
      id: input.id,
      orgId: input.orgId,
      name: input.name ?? null,
      hash: input.hash,
      createdAtMs: input.nowMs,
      revokedAtMs: null,
    };
    try {
      await this.db.write(function* () {
        yield* execute(SQL.insertKey, ...valuesOf(apiKeys, key));
        if (audit) yield* recordAudit(audits.key("key.created", key, audit, input.nowMs));
      });
    } catch (err) {
      const violation = this.db.violation(err);
      if (violation?.kind === "foreign_key") throw new StoreInputError(`No organization with id ${JSON.stringify(input.orgId)}`, "orgId");
      if (violation?.kind === "unique")
        throw new StoreConflictError(violation.key === "api_keys.hash" ? conflicts.keyHash : conflicts.keyId(input.id));
      throw err;
    }
    return key;
  }

  /** Every request looks its key up: the lookups of one event-loop turn share one query. */
  readonly #keys = perTurnLookup((ids: string[]) => this.db.read(() => keysWithOrganization(ids)));

  async findApiKey(keyId: string): Promise<{ key: ApiKeyRecord; org: Organization } | null> {
    if (!this.db.holds(keyId)) return null;
    const row = await this.#keys(keyId);
    return row ? { key: apiKeys.fromRow(row), org: organizationOfKey(row) } : null;
  }

  async listApiKeys(orgId: string): Promise<ApiKeyRecord[]> {
    if (!this.db.holds(orgId)) return [];
    return (await this.db.read(() => query(SQL.listKeys, orgId))).map((row) => apiKeys.fromRow(row));
  }

  async revokeApiKey(keyId: string, nowMs: number, audit?: AuditActor): Promise<boolean> {
    checkAudit(audit);
    if (!this.db.holds(keyId)) return false;
    return this.db.write(function* () {
      const [revoked] = yield* query(SQL.revokeKey, nowMs, keyId);
      if (!revoked) return false;
      const key = { id: keyId, orgId: revoked.org_id as string, name: revoked.name as string | null };
      if (audit) yield* recordAudit(audits.key("key.revoked", key, audit, nowMs));
      return true;
    });
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
