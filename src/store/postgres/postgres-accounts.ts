import type pg from "pg";
import { type AccountStore, type ApiKeyRecord, type Organization, StoreConflictError } from "../store.ts";
import { StoreInputError } from "../store-errors.ts";
import { FOREIGN_KEY_VIOLATION, hasNul, isUniqueViolation, pgCode, withClient } from "./postgres-connection.ts";
import { perTurnLookup } from "../per-turn-lookup.ts";

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


/** Organizations and API keys in PostgreSQL: one autocommit statement each. */
export class PostgresAccounts implements AccountStore {
  constructor(private readonly pool: pg.Pool) {}

  #query<R extends pg.QueryResultRow>(sql: string, params: unknown[]): Promise<pg.QueryResult<R>> {
    return withClient(this.pool, (c) => c.query<R>(sql, params));
  }

  async createOrganization(input: { id: string; name: string; nowMs: number }): Promise<Organization> {
    try {
      await this.#query("INSERT INTO organizations (id, name, paused, created_at_ms) VALUES ($1, $2, false, $3)", [input.id, input.name, input.nowMs]);
    } catch (err) {
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
      await this.#query<OrgRow>(`SELECT ${ORG_COLUMNS} FROM organizations WHERE id = $1 OR name = $1 ORDER BY (id = $1) DESC LIMIT 1`, [idOrName])
    ).rows[0];
    return row ? toOrganization(row) : null;
  }

  async listOrganizations(): Promise<Organization[]> {
    return (await this.#query<OrgRow>(`SELECT ${ORG_COLUMNS} FROM organizations ORDER BY created_at_ms, id`, [])).rows.map(toOrganization);
  }

  async countOrganizations(): Promise<number> {
    return (await this.#query<{ n: number }>("SELECT count(*) AS n FROM organizations", [])).rows[0]?.n ?? 0;
  }

  async setOrganizationPaused(orgId: string, paused: boolean): Promise<boolean> {
    if (hasNul(orgId)) return false;
    return (await this.#query("UPDATE organizations SET paused = $1 WHERE id = $2", [paused, orgId])).rowCount === 1;
  }

  async createApiKey(input: { id: string; orgId: string; name: string | null; hash: string; nowMs: number }): Promise<ApiKeyRecord> {
    try {
      await this.#query("INSERT INTO api_keys (id, org_id, name, hash, created_at_ms, revoked_at_ms) VALUES ($1, $2, $3, $4, $5, NULL)", [
        input.id,
        input.orgId,
        input.name ?? null,
        input.hash,
        input.nowMs,
      ]);
    } catch (err) {
      if (pgCode(err) === FOREIGN_KEY_VIOLATION) throw new StoreInputError(`No organization with id ${JSON.stringify(input.orgId)}`, "orgId");
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
    return (await this.#query<KeyRow>(`SELECT ${KEY_COLUMNS} FROM api_keys WHERE org_id = $1 ORDER BY created_at_ms, id`, [orgId])).rows.map(toApiKey);
  }

  async revokeApiKey(keyId: string, nowMs: number): Promise<boolean> {
    if (hasNul(keyId)) return false;
    return (await this.#query("UPDATE api_keys SET revoked_at_ms = $1 WHERE id = $2 AND revoked_at_ms IS NULL", [nowMs, keyId])).rowCount === 1;
  }
}
