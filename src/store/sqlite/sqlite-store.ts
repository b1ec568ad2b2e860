import { mkdirSync } from "node:fs";
import { dirname, resolve } from "node:path";
import Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
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
import { USAGE_COLUMNS, toUsage, type UsageRow } from "../usage-rows.ts";
import { applyMigrations, readMigrations, SQLITE_MIGRATIONS_DIR } from "./migrations.ts";
import { SqliteCredits } from "./sqlite-credits.ts";
import { isConstraint, UNIQUE_CODES } from "./sqlite-errors.ts";
import { SqliteIdempotency } from "./sqlite-idempotency.ts";
import { SqlitePreviewQuotas } from "./sqlite-preview-quotas.ts";
import { decodeUsageCursor, encodeUsageCursor } from "../usage-cursor.ts";

export interface SqliteStore extends Store {
  readonly dialect: "sqlite";
  /** The better-sqlite3 connection, for tests and diagnostics. Not part of the Store contract. */
  readonly db: Database.Database;
  /** The absolute database file path, or `:memory:`. */
  readonly path: string;
}

export interface SqliteStoreOptions {
  /** Where the `NNN_name.sql` files are; defaults to src/store/migrations/sqlite. For tests. */
  migrationsDir?: string;
}

export const MAX_USAGE_PAGE = 200;
const USAGE_OUTCOMES: readonly UsageOutcome[] = ["succeeded", "model_error", "context_rejected", "reservation_expired"];

/**
 * Opens (creating the file and its folder when missing) a SQLite database and applies pending migrations.
 * `path` is relative to the current directory; `:memory:` gives a private in-memory database.
 */
export function openSqliteStore(path: string, options: SqliteStoreOptions = {}): SqliteStore {
  if (path.trim() === "") throw new Error("The SQLite database path is empty");
  const inMemory = path === ":memory:";
  const fullPath = inMemory ? path : resolve(path);
  if (!inMemory) mkdirSync(dirname(fullPath), { recursive: true });
  const migrations = readMigrations(options.migrationsDir ?? SQLITE_MIGRATIONS_DIR);
  const db = new Database(fullPath);
  try {
    // busy_timeout first: switching to WAL and the migration transaction may have to wait for another process.
    db.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
    enableWal(db);
    db.pragma("synchronous = NORMAL");
    db.pragma("foreign_keys = ON");
    applyMigrations(db, migrations);
    return new SqliteStoreImpl(db, fullPath);
  } catch (err) {
    db.close();
    throw err;
  }
}

const BUSY_TIMEOUT_MS = 5000;

/**
 * PRAGMA journal_mode = WAL, retried for up to busy_timeout: when several processes open a new file at once,
 * SQLite can answer SQLITE_BUSY here without calling the busy handler (while another connection switches the
 * file to WAL, or checkpoints it on close), so busy_timeout alone does not cover this step.
 */
function enableWal(db: Database.Database): void {
  const deadline = Date.now() + BUSY_TIMEOUT_MS;
  for (;;) {
    try {
      db.pragma("journal_mode = WAL");
      return;
    } catch (err) {
      if (!(err instanceof Database.SqliteError && err.code.startsWith("SQLITE_BUSY")) || Date.now() >= deadline) throw err;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5);
    }
  }
}

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
  return {
    id: row.id,
    orgId: row.org_id,
    name: row.name,
    hash: row.hash,
    createdAtMs: row.created_at_ms,
    revokedAtMs: row.revoked_at_ms,
  };
}

function checkTime(value: number | undefined, field: string): void {
  if (value !== undefined && !Number.isFinite(value)) throw new StoreInputError(`${field} must be a finite number of epoch milliseconds`, field);
}

/**
 * The SQL and parameters of one usage page (limit + 1 rows, to know whether more follow). Exported for the
 * query-plan test. Only one upper bound is used: with a cursor and toMs, whichever is lower implies the other,
 * so SQLite can seek to it in usage_records_by_org_time instead of scanning the earlier pages.
 */
export function usageListQuery(orgId: string, query: UsageQuery): { sql: string; params: unknown[] } {
  const cursor = query.cursor === undefined ? undefined : decodeUsageCursor(query.cursor);
  const clauses = ["org_id = ?"];
  const params: unknown[] = [orgId];
  if (query.fromMs !== undefined) {
    clauses.push("created_at_ms >= ?");
    params.push(query.fromMs);
  }
  if (query.toMs !== undefined && (cursor === undefined || cursor.createdAtMs >= query.toMs)) {
    clauses.push("created_at_ms < ?");
    params.push(query.toMs);
  } else if (cursor !== undefined) {
    clauses.push("(created_at_ms, request_id) < (?, ?)");
    params.push(cursor.createdAtMs, cursor.requestId);
  }
  if (query.outcome !== undefined) {
    clauses.push("outcome = ?");
    params.push(query.outcome);
  }
  params.push(query.limit + 1);
  const sql =
    `SELECT ${USAGE_COLUMNS} FROM usage_records WHERE ${clauses.join(" AND ")} ` + "ORDER BY created_at_ms DESC, request_id DESC LIMIT ?";
  return { sql, params };
}

class SqliteStoreImpl implements SqliteStore {
  readonly dialect = "sqlite" as const;
  readonly #db: Database.Database;
  readonly #path: string;

  readonly #insertOrg: Statement<[string, string, number]>;
  readonly #orgById: Statement<[string], OrgRow>;
  readonly #orgByName: Statement<[string], OrgRow>;
  readonly #listOrgs: Statement<[], OrgRow>;
  readonly #countOrgs: Statement<[], { n: number }>;
  readonly #setPaused: Statement<[number, string]>;

  readonly #insertKey: Statement<[string, string, string | null, string, number]>;
  readonly #keyWithOrg: Statement<[string], KeyWithOrgRow>;
  readonly #listKeys: Statement<[string], KeyRow>;
  readonly #revokeKey: Statement<[number, string]>;

  readonly #insertUsage: Statement<unknown[]>;
  readonly #getUsage: Statement<[string, string], UsageRow>;
  /** listUsage statements, one per combination of filters, each prepared on first use. */
  readonly #listUsage = new Map<string, Statement<unknown[], UsageRow>>();

  readonly #credits: SqliteCredits;
  readonly #quotas: SqlitePreviewQuotas;
  readonly #idempotency: SqliteIdempotency;

  constructor(db: Database.Database, path: string) {
    this.#db = db;
    this.#path = path;
    this.#insertOrg = db.prepare("INSERT INTO organizations (id, name, paused, created_at_ms) VALUES (?, ?, 0, ?)");
    this.#orgById = db.prepare(`SELECT ${ORG_COLUMNS} FROM organizations WHERE id = ?`);
    this.#orgByName = db.prepare(`SELECT ${ORG_COLUMNS} FROM organizations WHERE name = ?`);
    this.#listOrgs = db.prepare(`SELECT ${ORG_COLUMNS} FROM organizations ORDER BY created_at_ms, id`);
    this.#countOrgs = db.prepare("SELECT count(*) AS n FROM organizations");
    this.#setPaused = db.prepare("UPDATE organizations SET paused = ? WHERE id = ?");

    this.#insertKey = db.prepare(`INSERT INTO api_keys (id, org_id, name, hash, created_at_ms, revoked_at_ms) VALUES (?, ?, ?, ?, ?, NULL)`);
    this.#keyWithOrg = db.prepare(
      "SELECT k.id, k.org_id, k.name, k.hash, k.created_at_ms, k.revoked_at_ms, " +
        "o.name AS org_name, o.paused AS org_paused, o.created_at_ms AS org_created_at_ms " +
        "FROM api_keys k JOIN organizations o ON o.id = k.org_id WHERE k.id = ?",
    );
    this.#listKeys = db.prepare(`SELECT ${KEY_COLUMNS} FROM api_keys WHERE org_id = ? ORDER BY created_at_ms, id`);
    this.#revokeKey = db.prepare("UPDATE api_keys SET revoked_at_ms = ? WHERE id = ? AND revoked_at_ms IS NULL");

    this.#insertUsage = db.prepare(`INSERT INTO usage_records (${USAGE_COLUMNS}) VALUES (${Array(16).fill("?").join(", ")})`);
    this.#getUsage = db.prepare(`SELECT ${USAGE_COLUMNS} FROM usage_records WHERE org_id = ? AND request_id = ?`);

    // settle and release insert the usage record inside their own transaction.
    this.#credits = new SqliteCredits(db, (record) => this.#insertUsageRow(record));
    this.#quotas = new SqlitePreviewQuotas(db);
    this.#idempotency = new SqliteIdempotency(db);
  }

  get db(): Database.Database {
    return this.#db;
  }

  get path(): string {
    return this.#path;
  }

  async close(): Promise<void> {
    if (!this.#db.open) return;
    try {
      this.#db.pragma("optimize");
    } finally {
      this.#db.close();
    }
  }

  async createOrganization(input: { id: string; name: string; nowMs: number }): Promise<Organization> {
    try {
      this.#insertOrg.run(input.id, input.name, input.nowMs);
    } catch (err) {
      if (isConstraint(err, "SQLITE_CONSTRAINT_UNIQUE") && err.message.includes("organizations.name")) {
        throw new StoreConflictError(`An organization named ${JSON.stringify(input.name)} already exists`);
      }
      if (isConstraint(err, ...UNIQUE_CODES)) throw new StoreConflictError(`An organization with id ${JSON.stringify(input.id)} already exists`);
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

  async setOrganizationPaused(orgId: string, paused: boolean): Promise<boolean> {
    return this.#setPaused.run(paused ? 1 : 0, orgId).changes > 0;
  }

  async createApiKey(input: { id: string; orgId: string; name: string | null; hash: string; nowMs: number }): Promise<ApiKeyRecord> {
    try {
      this.#insertKey.run(input.id, input.orgId, input.name ?? null, input.hash, input.nowMs);
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

  async findApiKey(keyId: string): Promise<{ key: ApiKeyRecord; org: Organization } | null> {
    const row = this.#keyWithOrg.get(keyId);
    if (!row) return null;
    return {
      key: toApiKey(row),
      org: { id: row.org_id, name: row.org_name, paused: row.org_paused === 1, createdAtMs: row.org_created_at_ms },
    };
  }

  async listApiKeys(orgId: string): Promise<ApiKeyRecord[]> {
    return this.#listKeys.all(orgId).map(toApiKey);
  }

  async revokeApiKey(keyId: string, nowMs: number): Promise<boolean> {
    return this.#revokeKey.run(nowMs, keyId).changes > 0;
  }

  async insertUsage(record: UsageRecord): Promise<void> {
    this.#insertUsageRow(record);
  }

  /** Inserts one usage record; StoreConflictError on a duplicate request id. Synchronous, so a transaction can include it. */
  #insertUsageRow(record: UsageRecord): void {
    try {
      this.#insertUsage.run(
        record.requestId,
        record.orgId,
        record.keyId,
        record.createdAtMs,
        record.source,
        record.model,
        record.mode,
        record.outcome,
        record.httpStatus,
        record.inputTokens,
        record.outputTokens,
        record.costMicrousd,
        record.latencyMs ?? null,
        record.gatewayLatencyMs,
        record.errorDetail ?? null,
        record.overReservation ? 1 : 0,
      );
    } catch (err) {
      if (isConstraint(err, ...UNIQUE_CODES)) throw new StoreConflictError(`A usage record with request id ${JSON.stringify(record.requestId)} already exists`);
      throw err;
    }
  }

  async getUsage(orgId: string, requestId: string): Promise<UsageRecord | null> {
    const row = this.#getUsage.get(orgId, requestId);
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
    const { sql, params } = usageListQuery(orgId, query);
    let statement = this.#listUsage.get(sql);
    if (!statement) {
      statement = this.#db.prepare<unknown[], UsageRow>(sql);
      this.#listUsage.set(sql, statement);
    }
    const rows = statement.all(...params);
    const more = rows.length > limit;
    const records = (more ? rows.slice(0, limit) : rows).map(toUsage);
    const last = records[records.length - 1];
    return { records, nextCursor: more && last ? encodeUsageCursor({ createdAtMs: last.createdAtMs, requestId: last.requestId }) : null };
  }

  // ── Credits, preview quotas, idempotency keys: see sqlite-credits.ts, sqlite-preview-quotas.ts, sqlite-idempotency.ts. ──

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
    this.#idempotency.complete(input);
  }

  async releaseIdempotencyKey(input: { orgId: string; key: string; requestId: string }): Promise<void> {
    this.#idempotency.release(input);
  }
}
