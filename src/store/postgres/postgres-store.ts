import pg from "pg";
import { composeStore } from "../compose-store.ts";
import type { Store, WriteCheck } from "../store.ts";
import type { StoreFailureKind } from "../store-errors.ts";
import { PostgresAccounts } from "./postgres-accounts.ts";
import { PostgresBatches } from "./postgres-batches.ts";
import { PostgresBookkeeping } from "./postgres-bookkeeping.ts";
import { type ConnectionSettings, clientConfig, connectionSettings, openPool, poolSizes } from "./postgres-connection.ts";
import { postgresFailureKind } from "./postgres-errors.ts";
import { applyPostgresMigrations, type MigrationResult, readPostgresMigrations } from "./postgres-migrations.ts";
import { type StatisticsRefresh, StatisticsRefresher } from "./postgres-statistics.ts";
import { postgresWriteCheck } from "./postgres-writability.ts";

export interface PostgresStore extends Store {
  readonly dialect: "postgres";
  /** The pg pool of everything but the bookkeeping transactions, for tests and diagnostics. Not part of the Store contract. */
  readonly pool: pg.Pool;
  /** The pg pool of the bookkeeping transactions (plan_cache_mode=force_generic_plan), for tests and diagnostics. */
  readonly bookkeepingPool: pg.Pool;
  /** What opening did to the schema: the migrations it applied, and all recorded afterwards. */
  readonly migrations: MigrationResult;
  /** The effective settings (pool size, statement timeout, application name); the URL itself is not kept here. */
  readonly settings: Omit<ConnectionSettings, "connectionString">;
  /** Analyzes the tables that are due now, after a refresh in flight (see postgres-statistics.ts); for tests and diagnostics. */
  refreshStatistics(): Promise<StatisticsRefresh>;
}

export interface PostgresStoreOptions {
  /** Most connections this instance opens, both pools together (default 10). The URL parameter `pool_size` overrides it. */
  poolSize?: number;
  /**
   * Bookkeeping transactions run at once (the group commit's lanes), which size the bookkeeping pool: lanes + 1
   * connections, at most pool_size − 2 (see poolSizes). Without it, that pool may take pool_size − 2.
   */
  bookkeepingLanes?: number;
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
  /**
   * Analyze the tables that are due as the store opens (before it returns) and then as they grow, every
   * STATISTICS_REFRESH_INTERVAL_MS while it is open (postgres-statistics.ts); for a serving gateway. Without it only
   * `refreshStatistics()` analyzes.
   */
  keepStatisticsFresh?: boolean;
  /**
   * Called when the periodic refresh of the tables' planner statistics (postgres-statistics.ts) fails, or leaves a
   * table unanalyzed (once per message); for logging.
   */
  onStatisticsProblem?: (message: string) => void;
}

/** The wait for another instance's migrations (the advisory lock) gives up after this long. */
export const MIGRATION_LOCK_TIMEOUT_MS = 60_000;

/**
 * Opens a PostgreSQL database (`postgres://` or `postgresql://` URL, see connectionSettings for the adapter's
 * URL parameters), applies pending migrations under the migration advisory lock on one dedicated connection,
 * and returns a store backed by two pg pools: the bookkeeping transactions' and everything else's. With
 * `keepStatisticsFresh` it analyzes its tables as they grow (postgres-statistics.ts) until it is closed, and, when its
 * first refresh could analyze every table, the bookkeeping connections use generic plans (plan_cache_mode=
 * force_generic_plan: planned once per connection and statistics change, not at every execution). The database must exist; the schema is the connection's search_path
 * (normally `public`). Connection failures reject with pg's error (code ECONNREFUSED, 28P01, 3D000, …).
 */
export async function openPostgresStore(url: string, options: PostgresStoreOptions = {}): Promise<PostgresStore> {
  const settings = connectionSettings(url, options);
  const migrationFiles = readPostgresMigrations(options.migrationsDir);
  const client = new pg.Client(
    clientConfig(settings, { statementTimeoutMs: Math.max(settings.statementTimeoutMs, MIGRATION_LOCK_TIMEOUT_MS) }),
  );
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
  const sizes = poolSizes(settings.poolSize, options.bookkeepingLanes);
  const pool = openPool(settings, sizes.reads, { onIdleError: options.onIdleError });
  const statistics = new StatisticsRefresher(pool, options.onStatisticsProblem);
  // The first refresh before the store is used. A generic plan rests on the statistics of when it was made (on a large
  // table never analyzed, one was about 20 times slower), so they are used only where the store keeps them fresh.
  const first = options.keepStatisticsFresh ? await statistics.start() : null;
  const genericPlans = first !== null && first.failed.length === 0;
  if (options.keepStatisticsFresh && !genericPlans) {
    options.onStatisticsProblem?.(
      "The bookkeeping statements are planned at every execution (plan_cache_mode auto), which costs PostgreSQL more CPU per request: " +
        "the store could not analyze every one of its tables (see the messages before this one).",
    );
  }
  const bookkeepingPool = openPool(settings, sizes.bookkeeping, { bookkeeping: { genericPlans }, onIdleError: options.onIdleError });
  return composeStore(
    new PostgresHandle(pool, bookkeepingPool, migrations, settings, statistics),
    new PostgresAccounts(pool),
    new PostgresBookkeeping(pool, bookkeepingPool),
    // On the read pool: batch claims and finishes are short transactions that do not need the bookkeeping pool's generic plans.
    new PostgresBatches(pool),
  );
}

/** The pools and what opening did; the methods come from postgres-accounts.ts, postgres-bookkeeping.ts and postgres-batches.ts. */
class PostgresHandle {
  readonly dialect = "postgres" as const;
  readonly settings: Omit<ConnectionSettings, "connectionString">;
  readonly checkWritable: () => Promise<WriteCheck>;
  readonly #statistics: StatisticsRefresher;
  #closing: Promise<void> | null = null;

  constructor(
    readonly pool: pg.Pool,
    readonly bookkeepingPool: pg.Pool,
    readonly migrations: MigrationResult,
    settings: ConnectionSettings,
    statistics: StatisticsRefresher,
  ) {
    this.settings = {
      poolSize: settings.poolSize,
      statementTimeoutMs: settings.statementTimeoutMs,
      applicationName: settings.applicationName,
    };
    this.checkWritable = postgresWriteCheck(pool, bookkeepingPool);
    this.#statistics = statistics;
  }

  refreshStatistics(): Promise<StatisticsRefresh> {
    return this.#statistics.refreshNow();
  }

  classifyFailure(err: unknown): StoreFailureKind {
    return postgresFailureKind(err);
  }

  /** Both pools together. */
  connectionStats(): { total: number; idle: number; waiting: number } {
    const [reads, books] = [this.pool, this.bookkeepingPool];
    return {
      total: reads.totalCount + books.totalCount,
      idle: reads.idleCount + books.idleCount,
      waiting: reads.waitingCount + books.waitingCount,
    };
  }

  /**
   * Stops the statistics refresh (waiting for one in flight) and ends the pools (waiting for checked-out clients to come
   * back); a second call waits for the first.
   */
  close(): Promise<void> {
    this.#closing ??= this.#statistics.stop().then(async () => {
      await Promise.all([this.pool.end(), this.bookkeepingPool.end()]);
    });
    return this.#closing;
  }
}
