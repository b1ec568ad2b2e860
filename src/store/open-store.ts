import { existsSync } from "node:fs";
import { resolve } from "node:path";
import Database from "better-sqlite3";
import { ACCEPTED_DATABASE_URLS, describeDatabase, isPostgresUrl, sqlitePathOf } from "../database-url.ts";
import type { PostgresStoreOptions } from "./postgres/postgres-store.ts";
import { openSqliteStore, type SqliteStoreOptions } from "./sqlite/sqlite-store.ts";
import type { Store } from "./store.ts";

/** A SQLite file that does not exist, opened by a tool that must not create one (the CLI: only `tds init` creates). */
export class DatabaseMissingError extends Error {
  constructor(readonly path: string) {
    super(`There is no SQLite database at ${path}`);
    this.name = "DatabaseMissingError";
  }
}

export interface MigrationRecord {
  version: number;
  name: string;
}

/** What opening a store did to its schema (for `tds migrate`). */
export interface MigrationReport {
  dialect: Store["dialect"];
  /** Which database, for people: its kind and where it is, without a password. */
  database: string;
  /** The migrations applied while opening, in order; empty when the schema was up to date. */
  applied: MigrationRecord[];
  /** Every migration recorded in the database afterwards, in version order. */
  current: MigrationRecord[];
}

const reports = new WeakMap<Store, MigrationReport>();

/** The migration report of a store opened by openStore (null for a store opened any other way). */
export function migrationReportOf(store: Store): MigrationReport | null {
  return reports.get(store) ?? null;
}

/**
 * Opens the store a database URL names and applies its pending migrations:
 * `postgres://` / `postgresql://` → PostgreSQL (openPostgresStore; the URL may carry `pool_size` and
 * `statement_timeout_ms`, see postgres-connection.ts; with `options.postgres`: a serving gateway passes its lanes and
 * keepStatisticsFresh), anything sqlitePathOf accepts → SQLite
 * (with `options.sqlite`; a serving gateway passes SERVING_SQLITE, tools keep SQLite's own busy wait). With `mustExist` a missing SQLite
 * file is a DatabaseMissingError instead of a new database.
 */
export async function openStore(
  databaseUrl: string,
  options: {
    sqlite?: SqliteStoreOptions;
    postgres?: Pick<PostgresStoreOptions, "bookkeepingLanes" | "keepStatisticsFresh" | "onStatisticsProblem">;
    mustExist?: boolean;
  } = {},
): Promise<Store> {
  if (isPostgresUrl(databaseUrl)) {
    // Loaded only for PostgreSQL, so that SQLite starts and CLI runs do not pay for the pg driver.
    const { openPostgresStore } = await import("./postgres/postgres-store.ts");
    const store = await openPostgresStore(databaseUrl.trim(), options.postgres);
    reports.set(store, {
      dialect: "postgres",
      database: describedDatabase(databaseUrl),
      applied: store.migrations.applied,
      current: store.migrations.current,
    });
    return store;
  }
  const path = sqlitePathOf(databaseUrl);
  if (path === null) {
    throw new Error(`Unsupported database URL ${JSON.stringify(databaseUrl)}; accepted forms: ${ACCEPTED_DATABASE_URLS}`);
  }
  if (options.mustExist && path !== ":memory:" && !existsSync(path)) throw new DatabaseMissingError(resolve(path));
  const before = sqliteMigrationsOf(path);
  const store = openSqliteStore(path, options.sqlite);
  try {
    const current = store.db.prepare<[], MigrationRecord>("SELECT version, name FROM schema_migrations ORDER BY version").all();
    const known = new Set(before.map((m) => m.version));
    reports.set(store, {
      dialect: "sqlite",
      database: describedDatabase(databaseUrl),
      applied: current.filter((m) => !known.has(m.version)),
      current,
    });
  } catch (err) {
    await store.close();
    throw err;
  }
  return store;
}

function describedDatabase(databaseUrl: string): string {
  const { kind, location } = describeDatabase(databaseUrl);
  return `${kind} database ${location}`;
}

/**
 * The migrations recorded in an existing SQLite file before it is opened (none for a new file or :memory:),
 * so that openStore can tell which ones the open applied. Read (only) on a separate connection; a file that
 * cannot be read here is left to openSqliteStore to report. Another process migrating the same file at the same
 * moment may make this report a migration as applied by this open: the report is for people, not for logic.
 */
function sqliteMigrationsOf(path: string): MigrationRecord[] {
  if (path === ":memory:" || !existsSync(path)) return [];
  let db: Database.Database | undefined;
  try {
    db = new Database(path, { fileMustExist: true, timeout: 5000 });
    const table = db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'").get();
    return table ? db.prepare<[], MigrationRecord>("SELECT version, name FROM schema_migrations ORDER BY version").all() : [];
  } catch {
    return [];
  } finally {
    db?.close();
  }
}
