import type pg from "pg";
import {
  AUDIT_COLUMNS,
  type AuditRow,
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
import { badCursor } from "../usage-cursor.ts";
import { insertAudit } from "./postgres-audit.ts";
import { type Client, FOREIGN_KEY_VIOLATION, hasNul, isUniqueViolation, pgCode, transaction, withClient } from "./postgres-connection.ts";

interface OrgRow {
  id: string;
  name: string;
  paused: boolean;
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
  org_paused: boolean;
  org_created_at_ms: number;
}

const ORG_COLUMNS = "id, name, paused, created_at_ms";
const KEY_COLUMNS = "id, org_id, name, hash, created_at_ms, revoked_at_ms";

function toOrganization(row: OrgRow): Organization {
  return { id: row.id, name: row.name, paused: row.paused, createdAtMs: row.created_at_ms };
}

function toApiKey(row: KeyRow): ApiKeyRecord {
  return { id: row.id, orgId: row.org_id, name: row.name, hash: row.hash, createdAtMs: row.created_at_ms, revokedAtMs: row.revoked_at_ms };
}

/** Serializes organization creations (until commit or rollback), so that two names with one nameKey cannot both pass. */
const ORGANIZATION_NAMES_LOCK = "SELECT pg_advisory_xact_lock(hashtext('organization-names'))";
/** Names whose nameKey may equal a key: printable ASCII ones by their ASCII lower case, every other one. */
const NAME_CLASH_CANDIDATES = `SELECT name FROM organizations WHERE lower(name COLLATE "C") = $1 OR name COLLATE "C" ~ '[^ -~]'`;

/**
 * Organizations, API keys and the audit log in PostgreSQL: one autocommit statement each, or, for a change with its
 * audit entry, one transaction.
 */
export class PostgresAccounts implements AccountsPart {
  constructor(private readonly pool: pg.Pool) {}

  #query<R extends pg.QueryResultRow>(sql: string, params: unknown[]): Promise<pg.QueryResult<R>> {
    return withClient(this.pool, (c) => c.query<R>(sql, params));
  }

  /** `fn` in one transaction when the change is audited (both commit together), else with autocommit. */
  #write<T>(audited: boolean, fn: (c: Client) => Promise<T>): Promise<T> {
    return audited ? transaction(this.pool, fn) : withClient(this.pool, fn);
  }

  async createOrganization(input: { id: string; name: string; nowMs: number; audit?: AuditActor }): Promise<Organization> {
    const { audit } = input;
    checkAudit(audit);
    try {
      // Always a transaction: the clash check and the insert hold the lock that serializes organization creations.
      await transaction(this.pool, async (c) => {
        await c.query(ORGANIZATION_NAMES_LOCK);
        const key = nameKey(input.name);
        const candidates = await c.query<{ name: string }>(NAME_CLASH_CANDIDATES, [key]);
        const clash = candidates.rows.find((row) => nameKey(row.name) === key);
        if (clash) throw new StoreConflictError(nameTakenMessage(clash.name, input.name));
        await c.query("INSERT INTO organizations (id, name, paused, created_at_ms) VALUES ($1, $2, false, $3)", [
          input.id,
          input.name,
          input.nowMs,
        ]);
        if (audit) await insertAudit(c, audits.organizationCreated(input, audit, input.nowMs));
      });
    } catch (err) {
      if (err instanceof StoreConflictError) throw err;
      if (isUniqueViolation(err, "organizations_name_key")) {
        throw new StoreConflictError(`An organization named ${JSON.stringify(input.name)} already exists`);
      }
      if (isUniqueViolation(err)) throw new StoreConflictError(`An organization with id ${JSON.stringify(input.id)} already exists`);
      throw err;
    }
    return { id: input.id, name: input.name, paused: false, createdAtMs: input.nowMs };
  }

  async findOrganization(idOrName: string): Promise<Organization | null> {
    if (hasNul(idOrName)) return null;
    // An id match first, then a name match (a name may equal another organization's id).
    const row = (
      await this.#query<OrgRow>(`SELECT ${ORG_COLUMNS} FROM organizations WHERE id = $1 OR name = $1 ORDER BY (id = $1) DESC LIMIT 1`, [
        idOrName,
      ])
    ).rows[0];
    return row ? toOrganization(row) : null;
  }

  async listOrganizations(): Promise<Organization[]> {
    return (await this.#query<OrgRow>(`SELECT ${ORG_COLUMNS} FROM organizations ORDER BY created_at_ms, id`, [])).rows.map(toOrganization);
  }

  async countOrganizations(): Promise<number> {
    return (await this.#query<{ n: number }>("SELECT count(*) AS n FROM organizations", [])).rows[0]?.n ?? 0;
  }

  /**
   * True when the organization exists, whether or not its state changed; audited only when it changed. Concurrent
   * calls with one state change it once: the second UPDATE waits for the first's row lock, then finds nothing to change.
   */
  async setOrganizationPaused(orgId: string, paused: boolean, audit?: { actor: AuditActor; nowMs: number }): Promise<boolean> {
    checkPauseAudit(audit);
    if (hasNul(orgId)) return false;
    return this.#write(audit !== undefined, async (c) => {
      const changed =
        (await c.query("UPDATE organizations SET paused = $1 WHERE id = $2 AND paused <> $1", [paused, orgId])).rowCount === 1;
      if (!changed) return (await c.query("SELECT 1 FROM organizations WHERE id = $1", [orgId])).rowCount === 1;
      if (audit) await insertAudit(c, audits.pauseChanged(orgId, paused, audit.actor, audit.nowMs));
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
      await this.#write(audit !== undefined, async (c) => {
        await c.query("INSERT INTO api_keys (id, org_id, name, hash, created_at_ms, revoked_at_ms) VALUES ($1, $2, $3, $4, $5, NULL)", [
          input.id,
          input.orgId,
          input.name ?? null,
          input.hash,
          input.nowMs,
        ]);
        if (audit)
          await insertAudit(c, audits.keyCreated({ id: input.id, orgId: input.orgId, name: input.name ?? null }, audit, input.nowMs));
      });
    } catch (err) {
      if (pgCode(err) === FOREIGN_KEY_VIOLATION)
        throw new StoreInputError(`No organization with id ${JSON.stringify(input.orgId)}`, "orgId");
      if (isUniqueViolation(err)) {
        // Never include the hash in a message.
        const what = isUniqueViolation(err, "api_keys_hash_key") ? "with this hash" : `with id ${JSON.stringify(input.id)}`;
        throw new StoreConflictError(`An API key ${what} already exists`);
      }
      throw err;
    }
    return { id: input.id, orgId: input.orgId, name: input.name ?? null, hash: input.hash, createdAtMs: input.nowMs, revokedAtMs: null };
  }

  /** Every request looks its key up: the lookups of one event-loop turn share one query. */
  readonly #keys = perTurnLookup(async (keyIds: string[]) => {
    const rows = (
      await this.#query<KeyWithOrgRow>(
        "SELECT k.id, k.org_id, k.name, k.hash, k.created_at_ms, k.revoked_at_ms, " +
          "o.name AS org_name, o.paused AS org_paused, o.created_at_ms AS org_created_at_ms " +
          "FROM api_keys k JOIN organizations o ON o.id = k.org_id WHERE k.id = ANY($1::text[])",
        [keyIds],
      )
    ).rows;
    return new Map(rows.map((row) => [row.id, row]));
  });

  async findApiKey(keyId: string): Promise<{ key: ApiKeyRecord; org: Organization } | null> {
    if (hasNul(keyId)) return null;
    const row = await this.#keys(keyId);
    if (!row) return null;
    return { key: toApiKey(row), org: { id: row.org_id, name: row.org_name, paused: row.org_paused, createdAtMs: row.org_created_at_ms } };
  }

  async listApiKeys(orgId: string): Promise<ApiKeyRecord[]> {
    if (hasNul(orgId)) return [];
    return (
      await this.#query<KeyRow>(`SELECT ${KEY_COLUMNS} FROM api_keys WHERE org_id = $1 ORDER BY created_at_ms, id`, [orgId])
    ).rows.map(toApiKey);
  }

  async revokeApiKey(keyId: string, nowMs: number, audit?: AuditActor): Promise<boolean> {
    checkAudit(audit);
    if (hasNul(keyId)) return false;
    return this.#write(audit !== undefined, async (c) => {
      const revoked = (
        await c.query<{ org_id: string; name: string | null }>(
          "UPDATE api_keys SET revoked_at_ms = $1 WHERE id = $2 AND revoked_at_ms IS NULL RETURNING org_id, name",
          [nowMs, keyId],
        )
      ).rows[0];
      if (!revoked) return false;
      if (audit) await insertAudit(c, audits.keyRevoked({ id: keyId, orgId: revoked.org_id, name: revoked.name }, audit, nowMs));
      return true;
    });
  }

  async listOrganizationsPage(query: { cursor?: string; limit: number }): Promise<OrganizationPage> {
    checkPageLimit(query.limit);
    const after = query.cursor === undefined ? undefined : decodeOrganizationCursor(query.cursor);
    // No stored id holds U+0000, so no page of ours can end at one: not a cursor we gave out.
    if (after && hasNul(after.id)) throw badCursor();
    const rows = after
      ? await this.#query<OrgRow>(
          `SELECT ${ORG_COLUMNS} FROM organizations WHERE (created_at_ms, id) > ($1, $2) ORDER BY created_at_ms, id LIMIT $3`,
          [after.createdAtMs, after.id, query.limit + 1],
        )
      : await this.#query<OrgRow>(`SELECT ${ORG_COLUMNS} FROM organizations ORDER BY created_at_ms, id LIMIT $1`, [query.limit + 1]);
    const page = pageOf(rows.rows, query.limit, toOrganization, encodeOrganizationCursor);
    return { organizations: page.items, nextCursor: page.nextCursor };
  }

  async listAudit(query: AuditQuery): Promise<AuditPage> {
    checkPageLimit(query.limit);
    const before = query.cursor === undefined ? undefined : decodeAuditCursor(query.cursor);
    if (query.orgId !== undefined && hasNul(query.orgId)) return { entries: [], nextCursor: null };
    const params: unknown[] = [];
    const where: string[] = [];
    if (query.orgId !== undefined) where.push(`org_id = $${params.push(query.orgId)}`);
    if (before !== undefined) where.push(`id < $${params.push(before)}`);
    const limit = `$${params.push(query.limit + 1)}`;
    const sql = `SELECT ${AUDIT_COLUMNS} FROM admin_audit ${where.length > 0 ? `WHERE ${where.join(" AND ")} ` : ""}ORDER BY id DESC LIMIT ${limit}`;
    const page = pageOf((await this.#query<AuditRow>(sql, params)).rows, query.limit, toAuditEntry, (last) => encodeAuditCursor(last.id));
    return { entries: page.items, nextCursor: page.nextCursor };
  }
}
