import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import type { Store } from "./store.ts";
import { openPostgresStore } from "./postgres/postgres-store.ts";
import { openSqliteStore, type SqliteStoreOptions } from "./sqlite/sqlite-store.ts";

const ACCEPTED_FORMS =
  "sqlite:PATH (relative to the current directory, e.g. sqlite:./data/tds.sqlite), sqlite::memory:, " +
  "file:PATH or file:///absolute/path, a bare path ending in .sqlite or .db, " +
  "or postgres://USER:PASSWORD@HOST:PORT/DATABASE (also postgresql://)";

/**
 * Where a SQLite database URL points: a file path (relative paths stay relative to the current
 * directory) or `:memory:`; null when the URL is not a SQLite URL.
 */
export function sqlitePathOf(databaseUrl: string): string | null {
  const url = databaseUrl.trim();
  let path: string | null = null;
  if (/^sqlite:/i.test(url)) {
    path = url.slice("sqlite:".length);
    // sqlite:///abs/path and sqlite://./rel/path: an empty authority, as in URL syntax.
    if (path.startsWith("//")) path = path.slice(2);
  } else if (/^file:/i.test(url)) {
    // file:///abs/path is a file URL (percent-decoded); file:./rel/path or file:rel is a plain path.
    path = url.slice("file:".length).startsWith("//") ? fileURLToPath(url) : url.slice("file:".length);
  } else if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(url) && /\.(sqlite|db)$/i.test(url)) {
    path = url;
  }
  if (path === null) return null;
  if (path === "") throw new Error(`The database URL ${JSON.stringify(databaseUrl)} has no path; accepted forms: ${ACCEPTED_FORMS}`);
  return path;
}

/** True for a PostgreSQL database URL (`postgres://…` or `postgresql://…`). */
export function isPostgresUrl(databaseUrl: string): boolean {
  return /^postgres(ql)?:\/\//i.test(databaseUrl.trim());
}

export interface MigrationRecord {
  version: number;
  name: string;
}

/** What opening a store did to its schema (for `tds migrate`). */
export interface MigrationReport {
  dialect: Store["dialect"];
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
 * `statement_timeout_ms`, see postgres-connection.ts), anything sqlitePathOf accepts → SQLite (with `options.sqlite`;
 * a serving gateway passes SERVING_SQLITE, tools keep SQLite's own busy wait).
 */
export async function openStore(databaseUrl: string, options: { sqlite?: SqliteStoreOptions } = {}): Promise<Store> {
  if (isPostgresUrl(databaseUrl)) {
    const store = await openPostgresStore(databaseUrl.trim());
    reports.set(store, { dialect: "postgres", applied: store.migrations.applied, current: store.migrations.current });
    return store;
  }
  const path = sqlitePathOf(databaseUrl);
  if (path === null) {
    throw new Error(`Unsupported database URL ${JSON.stringify(databaseUrl)}; accepted forms: ${ACCEPTED_FORMS}`);
  }
  const before = sqliteMigrationsOf(path);
  const store = openSqliteStore(path, options.sqlite);
  try {
    const current = store.db.prepare<[], MigrationRecord>("SELECT version, name FROM schema_migrations ORDER BY version").all();
    const known = new Set(before.map((m) => m.version));
    reports.set(store, { dialect: "sqlite", applied: current.filter((m) => !known.has(m.version)), current });
  } catch (err) {
    await store.close();
    throw err;
  }
  return store;
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
