import { fileURLToPath } from "node:url";
import type Database from "better-sqlite3";
import type { Migration } from "../migration-files.ts";
import { runSqliteDataStep } from "./sqlite-accounts.ts";

/** The SQLite migration files shipped with the service (src/store/migrations/sqlite/). */
export const SQLITE_MIGRATIONS_DIR = fileURLToPath(new URL("../migrations/sqlite/", import.meta.url));

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
        runSqliteDataStep(db, migration.file);
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
