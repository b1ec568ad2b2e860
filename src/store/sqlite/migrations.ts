import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type Database from "better-sqlite3";

/** The SQLite migration files shipped with the service (src/store/migrations/sqlite/). */
export const SQLITE_MIGRATIONS_DIR = fileURLToPath(new URL("../migrations/sqlite/", import.meta.url));

export interface Migration {
  version: number;
  /** The part of the file name after the version, such as `initial`. */
  name: string;
  file: string;
  sql: string;
}

const MIGRATION_FILE = /^(\d{3,})_([A-Za-z0-9_-]+)\.sql$/;

/** Reads `NNN_name.sql` files, ordered by version. Any other `.sql` file, or two files with one version, is an error. */
export function readMigrations(dir: string = SQLITE_MIGRATIONS_DIR): Migration[] {
  const migrations: Migration[] = [];
  for (const file of readdirSync(dir).sort()) {
    if (!file.endsWith(".sql")) continue;
    const match = MIGRATION_FILE.exec(file);
    if (!match) throw new Error(`Migration file ${join(dir, file)} is not named NNN_name.sql`);
    const version = Number(match[1]);
    const previous = migrations.find((m) => m.version === version);
    if (previous) throw new Error(`Migration files ${previous.file} and ${file} in ${dir} have the same version ${version}`);
    migrations.push({ version, name: match[2]!, file, sql: readFileSync(join(dir, file), "utf8") });
  }
  return migrations.sort((a, b) => a.version - b.version);
}

/**
 * Applies every migration not yet recorded in `schema_migrations`, in version order, inside one
 * `BEGIN IMMEDIATE` transaction: a second process opening the same database waits (busy_timeout)
 * and then finds them applied, so no migration ever runs twice. All or nothing: a failing migration
 * rolls back the ones before it in the same run. Returns the versions applied by this call.
 */
export function applyMigrations(db: Database.Database, migrations: Migration[], nowMs: number = Date.now()): number[] {
  const appliedNow: number[] = [];
  db.exec("BEGIN IMMEDIATE");
  try {
    db.exec(
      "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at_ms INTEGER NOT NULL) STRICT",
    );
    const rows = db.prepare<[], { version: number; name: string }>("SELECT version, name FROM schema_migrations").all();
    const applied = new Set(rows.map((r) => r.version));
    const known = new Set(migrations.map((m) => m.version));
    const unknown = rows.filter((r) => !known.has(r.version));
    if (unknown.length > 0) {
      const list = unknown.map((r) => `${r.version} (${r.name})`).join(", ");
      throw new Error(`The database has migrations this version of the service does not know: ${list}. It was used by a newer version.`);
    }
    const record = db.prepare<[number, string, number]>("INSERT INTO schema_migrations (version, name, applied_at_ms) VALUES (?, ?, ?)");
    for (const migration of migrations) {
      if (applied.has(migration.version)) continue;
      try {
        db.exec(migration.sql);
      } catch (err) {
        throw new Error(`Migration ${migration.file} failed: ${(err as Error).message}`, { cause: err });
      }
      record.run(migration.version, migration.name, nowMs);
      appliedNow.push(migration.version);
    }
    db.exec("COMMIT");
  } catch (err) {
    if (db.inTransaction) db.exec("ROLLBACK");
    throw err;
  }
  return appliedNow;
}
