import type Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
import {
  AUDIT_COLUMNS,
  AUDIT_INSERT,
  AUDIT_PARAM_COUNT,
  type AuditRecord,
  type AuditRow,
  auditParams,
  audits,
  checkAudit,
  checkPageLimit,
  checkPauseAudit,
  decodeAuditCursor,
  decodeOrganizationCursor,
  encodeAuditCursor,
  encodeOrganizationCursor,
  pageOf,
  toAuditEntry,
} from "../admin-rows.ts";
import type { AuditActor, AuditPage, AuditQuery, OrganizationPage } from "../administration.ts";
import type { AccountsPart } from "../compose-store.ts";
import { nameKey, nameTakenMessage } from "../organization-names.ts";
import { perTurnLookup } from "../per-turn-lookup.ts";
import { type ApiKeyRecord, type Organization, StoreConflictError } from "../store.ts";
import { StoreInputError } from "../store-errors.ts";
import { isConstraint, UNIQUE_CODES } from "./sqlite-errors.ts";

interface OrgRow {
  id: string;
  name: string;
  paused: number;
  created_at_ms: number;
}

interface KeyRow {
  id: string;
  org_id: string;
  name: string | null;
  hash: string;
  created_at_ms: number;
  revoked_at_ms: number | null;
}

interface KeyWithOrgRow extends KeyRow {
  org_name: string;
  org_paused: number;
  org_created_at_ms: number;
}

const ORG_COLUMNS = "id, name, paused, created_at_ms";
const KEY_COLUMNS = "id, org_id, name, hash, created_at_ms, revoked_at_ms";

function toOrganization(row: OrgRow): Organization {
  return { id: row.id, name: row.name, paused: row.paused === 1, createdAtMs: row.created_at_ms };
}

function toApiKey(row: KeyRow): ApiKeyRecord {
  return { id: row.id, orgId: row.org_id, name: row.name, hash: row.hash, createdAtMs: row.created_at_ms, revokedAtMs: row.revoked_at_ms };
}

/**
 * Organizations, API keys and the audit log in SQLite. Each write is one BEGIN IMMEDIATE transaction (the change and
 * its audit entry, when audited); `write` runs it (the store passes a wrapper that waits asynchronously while another
 * process holds the write lock).
 */
export class SqliteAccounts implements AccountsPart {
  readonly #db: Database.Database;
  readonly #insertOrg: Statement<[string, string, number]>;
  readonly #orgById: Statement<[string], OrgRow>;
  readonly #orgByName: Statement<[string], OrgRow>;
  readonly #nameClashCandidates: Statement<[string], { name: string }>;
  readonly #listOrgs: Statement<[], OrgRow>;
  readonly #orgsFirst: Statement<[number], OrgRow>;
  readonly #orgsAfter: Statement<[number, string, number], OrgRow>;
  readonly #countOrgs: Statement<[], { n: number }>;
  readonly #setPaused: Statement<[number, string, number]>;
  readonly #insertKey: Statement<[string, string, string | null, string, number]>;
  readonly #keyWithOrg: Statement<[string], KeyWithOrgRow>;
  readonly #listKeys: Statement<[string], KeyRow>;
  readonly #revokeKey: Statement<[number, string], { org_id: string; name: string | null }>;
  readonly #insertAudit: Statement<unknown[]>;
  /** The audit pages: [all, one organization] × [first page, after a cursor]. */
  readonly #auditAll: Statement<[number], AuditRow>;
  readonly #auditAllAfter: Statement<[number, number], AuditRow>;
  readonly #auditOrg: Statement<[string, number], AuditRow>;
  readonly #auditOrgAfter: Statement<[string, number, number], AuditRow>;

  constructor(
    db: Database.Database,
    private readonly write: <T>(fn: () => T) => Promise<T>,
  ) {
    this.#db = db;
    this.#insertOrg = db.prepare("INSERT INTO organizations (id, name, paused, created_at_ms) VALUES (?, ?, 0, ?)");
    this.#orgById = db.prepare(`SELECT ${ORG_COLUMNS} FROM organizations WHERE id = ?`);
    this.#orgByName = db.prepare(`SELECT ${ORG_COLUMNS} FROM organizations WHERE name = ?`);
    // Names whose nameKey may equal a key: printable ASCII ones by their (ASCII) lower case, every other one.
    this.#nameClashCandidates = db.prepare("SELECT name FROM organizations WHERE lower(name) = ? OR name GLOB '*[^ -~]*'");
    this.#listOrgs = db.prepare(`SELECT ${ORG_COLUMNS} FROM organizations ORDER BY created_at_ms, id`);
    this.#orgsFirst = db.prepare(`SELECT ${ORG_COLUMNS} FROM organizations ORDER BY created_at_ms, id LIMIT ?`);
    this.#orgsAfter = db.prepare(
      `SELECT ${ORG_COLUMNS} FROM organizations WHERE (created_at_ms, id) > (?, ?) ORDER BY created_at_ms, id LIMIT ?`,
    );
    this.#countOrgs = db.prepare("SELECT count(*) AS n FROM organizations");
    // Only a change of state counts (and is audited).
    this.#setPaused = db.prepare("UPDATE organizations SET paused = ? WHERE id = ? AND paused <> ?");
    this.#insertKey = db.prepare(
      `INSERT INTO api_keys (id, org_id, name, hash, created_at_ms, revoked_at_ms) VALUES (?, ?, ?, ?, ?, NULL)`,
    );
    this.#keyWithOrg = db.prepare(
      "SELECT k.id, k.org_id, k.name, k.hash, k.created_at_ms, k.revoked_at_ms, " +
        "o.name AS org_name, o.paused AS org_paused, o.created_at_ms AS org_created_at_ms " +
        "FROM api_keys k JOIN organizations o ON o.id = k.org_id WHERE k.id = ?",
    );
    this.#listKeys = db.prepare(`SELECT ${KEY_COLUMNS} FROM api_keys WHERE org_id = ? ORDER BY created_at_ms, id`);
    this.#revokeKey = db.prepare("UPDATE api_keys SET revoked_at_ms = ? WHERE id = ? AND revoked_at_ms IS NULL RETURNING org_id, name");
    this.#insertAudit = db.prepare(`${AUDIT_INSERT} VALUES (${Array(AUDIT_PARAM_COUNT).fill("?").join(", ")})`);
    const audit = <P extends unknown[]>(where: string) =>
      db.prepare<P, AuditRow>(`SELECT ${AUDIT_COLUMNS} FROM admin_audit ${where} ORDER BY id DESC LIMIT ?`);
    this.#auditAll = audit("");
    this.#auditAllAfter = audit("WHERE id < ?");
    this.#auditOrg = audit("WHERE org_id = ?");
    this.#auditOrgAfter = audit("WHERE org_id = ? AND id < ?");
  }

  /** `fn` in one BEGIN IMMEDIATE transaction, through `write`. */
  #transaction<T>(fn: () => T): Promise<T> {
    return this.write(() => this.#db.transaction(fn).immediate());
  }

  #record(entry: AuditRecord): void {
    this.#insertAudit.run(...auditParams(entry));
  }

  async createOrganization(input: { id: string; name: string; nowMs: number; audit?: AuditActor }): Promise<Organization> {
    const { audit } = input;
    checkAudit(audit);
    try {
      await this.#transaction(() => {
        const key = nameKey(input.name);
        const clash = this.#nameClashCandidates.all(key).find((row) => nameKey(row.name) === key);
        if (clash) throw new StoreConflictError(nameTakenMessage(clash.name, input.name));
        this.#insertOrg.run(input.id, input.name, input.nowMs);
        if (audit) this.#record(audits.organizationCreated(input, audit, input.nowMs));
      });
    } catch (err) {
      if (isConstraint(err, "SQLITE_CONSTRAINT_UNIQUE") && err.message.includes("organizations.name")) {
        throw new StoreConflictError(`An organization named ${JSON.stringify(input.name)} already exists`);
      }
      if (isConstraint(err, ...UNIQUE_CODES))
        throw new StoreConflictError(`An organization with id ${JSON.stringify(input.id)} already exists`);
      throw err;
    }
    return { id: input.id, name: input.name, paused: false, createdAtMs: input.nowMs };
  }

  async findOrganization(idOrName: string): Promise<Organization | null> {
    const row = this.#orgById.get(idOrName) ?? this.#orgByName.get(idOrName);
    return row ? toOrganization(row) : null;
  }

  async listOrganizations(): Promise<Organization[]> {
    return this.#listOrgs.all().map(toOrganization);
  }

  async countOrganizations(): Promise<number> {
    return this.#countOrgs.get()?.n ?? 0;
  }

  /** True when the organization exists, whether or not its state changed; audited only when it changed. */
  async setOrganizationPaused(orgId: string, paused: boolean, audit?: { actor: AuditActor; nowMs: number }): Promise<boolean> {
    checkPauseAudit(audit);
    const flag = paused ? 1 : 0;
    return this.#transaction(() => {
      if (this.#setPaused.run(flag, orgId, flag).changes === 0) return this.#orgById.get(orgId) !== undefined;
      if (audit) this.#record(audits.pauseChanged(orgId, paused, audit.actor, audit.nowMs));
      return true;
    });
  }

  async createApiKey(input: {
    id: string;
    orgId: string;
    name: string | null;
    hash: string;
    nowMs: number;
    audit?: AuditActor;
  }): Promise<ApiKeyRecord> {
    const { audit } = input;
    checkAudit(audit);
    try {
      await this.#transaction(() => {
        this.#insertKey.run(input.id, input.orgId, input.name ?? null, input.hash, input.nowMs);
        if (audit) this.#record(audits.keyCreated({ id: input.id, orgId: input.orgId, name: input.name ?? null }, audit, input.nowMs));
      });
    } catch (err) {
      if (isConstraint(err, "SQLITE_CONSTRAINT_FOREIGNKEY")) {
        throw new StoreInputError(`No organization with id ${JSON.stringify(input.orgId)}`, "orgId");
      }
      if (isConstraint(err, ...UNIQUE_CODES)) {
        // Never include the hash in a message.
        const what = err.message.includes("api_keys.hash") ? "with this hash" : `with id ${JSON.stringify(input.id)}`;
        throw new StoreConflictError(`An API key ${what} already exists`);
      }
      throw err;
    }
    return { id: input.id, orgId: input.orgId, name: input.name ?? null, hash: input.hash, createdAtMs: input.nowMs, revokedAtMs: null };
  }

  /** Every request looks its key up: the requests of one event-loop turn with the same key share one lookup. */
  readonly #keys = perTurnLookup(async (keyIds: string[]) => {
    const rows = new Map<string, KeyWithOrgRow>();
    for (const id of keyIds) {
      const row = this.#keyWithOrg.get(id);
      if (row) rows.set(id, row);
    }
    return rows;
  });

  async findApiKey(keyId: string): Promise<{ key: ApiKeyRecord; org: Organization } | null> {
    const row = await this.#keys(keyId);
    if (!row) return null;
    return {
      key: toApiKey(row),
      org: { id: row.org_id, name: row.org_name, paused: row.org_paused === 1, createdAtMs: row.org_created_at_ms },
    };
  }

  async listApiKeys(orgId: string): Promise<ApiKeyRecord[]> {
    return this.#listKeys.all(orgId).map(toApiKey);
  }

  async revokeApiKey(keyId: string, nowMs: number, audit?: AuditActor): Promise<boolean> {
    checkAudit(audit);
    return this.#transaction(() => {
      const revoked = this.#revokeKey.get(nowMs, keyId);
      if (!revoked) return false;
      if (audit) this.#record(audits.keyRevoked({ id: keyId, orgId: revoked.org_id, name: revoked.name }, audit, nowMs));
      return true;
    });
  }

  async listOrganizationsPage(query: { cursor?: string; limit: number }): Promise<OrganizationPage> {
    checkPageLimit(query.limit);
    const after = query.cursor === undefined ? undefined : decodeOrganizationCursor(query.cursor);
    const rows = after ? this.#orgsAfter.all(after.createdAtMs, after.id, query.limit + 1) : this.#orgsFirst.all(query.limit + 1);
    const page = pageOf(rows, query.limit, toOrganization, encodeOrganizationCursor);
    return { organizations: page.items, nextCursor: page.nextCursor };
  }

  async listAudit(query: AuditQuery): Promise<AuditPage> {
    checkPageLimit(query.limit);
    const before = query.cursor === undefined ? undefined : decodeAuditCursor(query.cursor);
    const n = query.limit + 1;
    const { orgId } = query;
    const rows =
      orgId === undefined
        ? before === undefined
          ? this.#auditAll.all(n)
          : this.#auditAllAfter.all(before, n)
        : before === undefined
          ? this.#auditOrg.all(orgId, n)
          : this.#auditOrgAfter.all(orgId, before, n);
    const page = pageOf(rows, query.limit, toAuditEntry, (last) => encodeAuditCursor(last.id));
    return { entries: page.items, nextCursor: page.nextCursor };
  }
}
