import pg from "pg";
import { composeStore } from "../compose-store.ts";
import type { Store, WriteCheck } from "../store.ts";
import type { StoreFailureKind } from "../store-errors.ts";
import { PostgresAccounts } from "./postgres-accounts.ts";
import { PostgresBookkeeping } from "./postgres-bookkeeping.ts";
import { type ConnectionSettings, clientConfig, connectionSettings, openPool } from "./postgres-connection.ts";
import { postgresFailureKind } from "./postgres-errors.ts";
import { applyPostgresMigrations, type MigrationResult, readPostgresMigrations } from "./postgres-migrations.ts";
import { postgresWriteCheck } from "./postgres-writability.ts";

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
  const pool = openPool(settings, options.onIdleError);
  return composeStore(new PostgresHandle(pool, migrations, settings), new PostgresAccounts(pool), new PostgresBookkeeping(pool));
}

/** The pool and what opening did; the methods come from postgres-accounts.ts and postgres-bookkeeping.ts. */
class PostgresHandle {
  readonly dialect = "postgres" as const;
  readonly settings: Omit<ConnectionSettings, "connectionString">;
  readonly checkWritable: () => Promise<WriteCheck>;
  #closing: Promise<void> | null = null;

  constructor(
    readonly pool: pg.Pool,
    readonly migrations: MigrationResult,
    settings: ConnectionSettings,
  ) {
    this.settings = {
      poolSize: settings.poolSize,
      statementTimeoutMs: settings.statementTimeoutMs,
      applicationName: settings.applicationName,
    };
    this.checkWritable = postgresWriteCheck(pool);
  }

  classifyFailure(err: unknown): StoreFailureKind {
    return postgresFailureKind(err);
  }

  connectionStats(): { total: number; idle: number; waiting: number } {
    return { total: this.pool.totalCount, idle: this.pool.idleCount, waiting: this.pool.waitingCount };
  }

  /** Ends the pool (waiting for checked-out clients to come back); a second call waits for the first. */
  close(): Promise<void> {
    this.#closing ??= this.pool.end();
    return this.#closing;
  }
}
