import pg from "pg";
import {
  StoreConflictError,
  type ApiKeyRecord,
  type Balance,
  type IdempotencyClaim,
  type LedgerEntry,
  type Organization,
  type PreviewQuotaResult,
  type Reservation,
  type Store,
  type StoredResponse,
  type UsageOutcome,
  type UsagePage,
  type UsageQuery,
  type UsageRecord,
} from "../store.ts";
import { StoreInputError } from "../store-errors.ts";
import { encodeUsageCursor } from "../usage-cursor.ts";
import {
  clientConfig,
  connectionSettings,
  createPool,
  FOREIGN_KEY_VIOLATION,
  hasNul,
  isUniqueViolation,
  pgCode,
  withClient,
  type ConnectionSettings,
} from "./postgres-connection.ts";
import { PostgresCredits } from "./postgres-credits.ts";
import { PostgresIdempotency } from "./postgres-idempotency.ts";
import { applyPostgresMigrations, readPostgresMigrations, type MigrationResult } from "./postgres-migrations.ts";
import { PostgresPreviewQuotas } from "./postgres-preview-quotas.ts";
import { insertUsageRow, postgresUsageListQuery } from "./postgres-usage.ts";
import { toUsage, USAGE_COLUMNS, type UsageRow } from "../usage-rows.ts";

export interface PostgresStore extends Store {
  readonly dialect: "postgres";
  /** The pg pool, for tests and diagnostics. Not part of the Store contract. */
  readonly pool: pg.Pool;
  /** What opening did to the schema: the migrations it applied, and all recorded afterwards. */
  readonly migrations: MigrationResult;
  /** The effective settings (pool size, statement timeout, application name); the URL itself is not kept here. */
  readonly settings: Omit<ConnectionSettings, "connectionString">;
}

export interface PostgresStoreOptions {
  /** Most connections this instance opens (default 10). The URL parameter `pool_size` overrides it. */
  poolSize?: number;
  /**
   * statement_timeout of every connection in ms (default 5000); idle_in_transaction_session_timeout gets the
   * same value. The URL parameter `statement_timeout_ms` overrides it.
   */
  statementTimeoutMs?: number;
  /** application_name of the connections, shown in pg_stat_activity (default "typed-decision-service"). */
  applicationName?: string;
  /** Where the `NNN_name.sql` files are; defaults to src/store/migrations/postgres. For tests. */
  migrationsDir?: string;
  /** Called when an idle pooled connection fails (it is already discarded); for logging. */
  onIdleError?: (err: Error) => void;
}

/** The wait for another instance's migrations (the advisory lock) gives up after this long. */
export const MIGRATION_LOCK_TIMEOUT_MS = 60_000;

export const MAX_USAGE_PAGE = 200;
const USAGE_OUTCOMES: readonly UsageOutcome[] = ["succeeded", "model_error", "context_rejected", "reservation_expired"];

/**
 * Opens a PostgreSQL database (`postgres://` or `postgresql://` URL, see connectionSettings for the adapter's
 * URL parameters), applies pending migrations under the migration advisory lock on one dedicated connection,
 * and returns a store backed by a pg.Pool. The database must exist; the schema is the connection's search_path
 * (normally `public`). Connection failures reject with pg's error (code ECONNREFUSED, 28P01, 3D000, …).
 */
export async function openPostgresStore(url: string, options: PostgresStoreOptions = {}): Promise<PostgresStore> {
  const settings = connectionSettings(url, options);
  const migrationFiles = readPostgresMigrations(options.migrationsDir);
  const client = new pg.Client(clientConfig(settings, Math.max(settings.statementTimeoutMs, MIGRATION_LOCK_TIMEOUT_MS)));
  // An error event after connecting (the connection dropped between statements) must not crash the process;
  // the statement in flight rejects with it.
  client.on("error", () => undefined);
  let migrations: MigrationResult;
  try {
    await client.connect();
    migrations = await applyPostgresMigrations(client, migrationFiles);
  } finally {
    await client.end().catch(() => undefined);
  }
  const pool = createPool(settings, options.onIdleError);
  return new PostgresStoreImpl(pool, migrations, settings);
}

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

function checkTime(value: number | undefined, field: string): void {
  if (value !== undefined && !Number.isFinite(value)) throw new StoreInputError(`${field} must be a finite number of epoch milliseconds`, field);
}

class PostgresStoreImpl implements PostgresStore {
  readonly dialect = "postgres" as const;
  readonly #pool: pg.Pool;
  readonly #migrations: MigrationResult;
  readonly #settings: Omit<ConnectionSettings, "connectionString">;
  #closing: Promise<void> | null = null;

  readonly #credits: PostgresCredits;
  readonly #quotas: PostgresPreviewQuotas;
  readonly #idempotency: PostgresIdempotency;

  constructor(pool: pg.Pool, migrations: MigrationResult, settings: ConnectionSettings) {
    this.#pool = pool;
    this.#migrations = migrations;
    this.#settings = { poolSize: settings.poolSize, statementTimeoutMs: settings.statementTimeoutMs, applicationName: settings.applicationName };
    this.#credits = new PostgresCredits(pool);
    this.#quotas = new PostgresPreviewQuotas(pool);
    this.#idempotency = new PostgresIdempotency(pool);
  }

  get pool(): pg.Pool {
    return this.#pool;
  }

  connectionStats(): { total: number; idle: number; waiting: number } {
    return { total: this.#pool.totalCount, idle: this.#pool.idleCount, waiting: this.#pool.waitingCount };
  }

  get migrations(): MigrationResult {
    return this.#migrations;
  }

  get settings(): Omit<ConnectionSettings, "connectionString"> {
    return this.#settings;
  }

  /** Ends the pool (waiting for checked-out clients to come back); a second call waits for the first. */
  close(): Promise<void> {
    this.#closing ??= this.#pool.end();
    return this.#closing;
  }

  #query<R extends pg.QueryResultRow>(sql: string, params: unknown[]): Promise<pg.QueryResult<R>> {
    return withClient(this.#pool, (c) => c.query<R>(sql, params));
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

  async findApiKey(keyId: string): Promise<{ key: ApiKeyRecord; org: Organization } | null> {
    if (hasNul(keyId)) return null;
    const row = (
      await this.#query<KeyWithOrgRow>(
        "SELECT k.id, k.org_id, k.name, k.hash, k.created_at_ms, k.revoked_at_ms, " +
          "o.name AS org_name, o.paused AS org_paused, o.created_at_ms AS org_created_at_ms " +
          "FROM api_keys k JOIN organizations o ON o.id = k.org_id WHERE k.id = $1",
        [keyId],
      )
    ).rows[0];
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

  async insertUsage(record: UsageRecord): Promise<void> {
    await withClient(this.#pool, (c) => insertUsageRow(c, record));
  }

  async getUsage(orgId: string, requestId: string): Promise<UsageRecord | null> {
    if (hasNul(orgId, requestId)) return null;
    const row = (await this.#query<UsageRow>(`SELECT ${USAGE_COLUMNS} FROM usage_records WHERE org_id = $1 AND request_id = $2`, [orgId, requestId])).rows[0];
    return row ? toUsage(row) : null;
  }

  async listUsage(orgId: string, query: UsageQuery): Promise<UsagePage> {
    const { limit } = query;
    if (!Number.isInteger(limit) || limit < 1 || limit > MAX_USAGE_PAGE) {
      throw new StoreInputError(`limit must be a whole number from 1 to ${MAX_USAGE_PAGE}`, "limit");
    }
    checkTime(query.fromMs, "fromMs");
    checkTime(query.toMs, "toMs");
    if (query.outcome !== undefined && !USAGE_OUTCOMES.includes(query.outcome)) {
      throw new StoreInputError(`outcome must be one of ${USAGE_OUTCOMES.join(", ")}`, "outcome");
    }
    const { sql, params } = postgresUsageListQuery(orgId, query);
    if (hasNul(orgId)) return { records: [], nextCursor: null };
    const rows = (await this.#query<UsageRow>(sql, params)).rows;
    const more = rows.length > limit;
    const records = (more ? rows.slice(0, limit) : rows).map(toUsage);
    const last = records[records.length - 1];
    return { records, nextCursor: more && last ? encodeUsageCursor({ createdAtMs: last.createdAtMs, requestId: last.requestId }) : null };
  }

  // ── Credits, preview quotas, idempotency keys: see postgres-credits.ts, postgres-preview-quotas.ts, postgres-idempotency.ts. ──

  async grantCredits(input: { orgId: string; amountMicrousd: number; nowMs: number; note?: string }): Promise<Balance> {
    return this.#credits.grant(input);
  }

  async getBalance(orgId: string): Promise<Balance> {
    return this.#credits.balance(orgId);
  }

  async reserveCredits(input: {
    reservationId: string;
    orgId: string;
    requestId: string;
    amountMicrousd: number;
    nowMs: number;
    expiresAtMs: number;
  }): Promise<"reserved" | "insufficient"> {
    return this.#credits.reserve(input);
  }

  async settleReservation(input: { reservationId: string; costMicrousd: number; nowMs: number; usage: UsageRecord }): Promise<"settled" | "expired" | "not_pending"> {
    return this.#credits.settle(input);
  }

  async releaseReservation(input: { reservationId: string; nowMs: number; usage: UsageRecord | null }): Promise<"released" | "not_pending"> {
    return this.#credits.release(input);
  }

  async expireReservations(input: { nowMs: number; limit: number }): Promise<number> {
    return this.#credits.expire(input);
  }

  async getReservation(reservationId: string): Promise<Reservation | null> {
    return this.#credits.reservation(reservationId);
  }

  async listLedger(orgId: string): Promise<LedgerEntry[]> {
    return this.#credits.ledger(orgId);
  }

  async consumePreviewQuota(input: { orgId: string; day: string; orgLimit: number; globalLimit: number }): Promise<PreviewQuotaResult> {
    return this.#quotas.consume(input);
  }

  async previewUsage(orgId: string, day: string): Promise<{ org: number; global: number }> {
    return this.#quotas.usage(orgId, day);
  }

  async claimIdempotencyKey(input: {
    orgId: string;
    key: string;
    requestHash: string;
    requestId: string;
    nowMs: number;
    lockUntilMs: number;
    expiresAtMs: number;
  }): Promise<IdempotencyClaim> {
    return this.#idempotency.claim(input);
  }

  async completeIdempotencyKey(input: { orgId: string; key: string; requestId: string; response: StoredResponse }): Promise<void> {
    return this.#idempotency.complete(input);
  }

  async releaseIdempotencyKey(input: { orgId: string; key: string; requestId: string }): Promise<void> {
    return this.#idempotency.release(input);
  }
}
