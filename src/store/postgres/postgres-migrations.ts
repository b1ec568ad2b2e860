import { fileURLToPath } from "node:url";
import type pg from "pg";
import { type Migration, readMigrations } from "../migration-files.ts";
import { runPostgresDataStep } from "./postgres-accounts.ts";

/** The PostgreSQL migration files shipped with the service (src/store/migrations/postgres/), named NNN_name.sql. */
export const POSTGRES_MIGRATIONS_DIR = fileURLToPath(new URL("../migrations/postgres/", import.meta.url));

/** Reads the `NNN_name.sql` files of a folder, ordered by version. */
export function readPostgresMigrations(dir: string = POSTGRES_MIGRATIONS_DIR): Migration[] {
  return readMigrations(dir);
}

/**
 * The key of the session advisory lock held while migrating ("tds_migr" in ASCII). One per database: every
 * instance of the service that opens the database takes it, so only one migrates at a time.
 */
export const MIGRATION_LOCK_KEY = 0x7464735f6d696772n;

export interface MigrationRecord {
  version: number;
  name: string;
}

export interface MigrationResult {
  /** The migrations this call applied, in order (none when another instance was first or nothing was pending). */
  applied: MigrationRecord[];
  /** Every migration recorded in the database afterwards, in version order. */
  current: MigrationRecord[];
}

/**
 * Applies every migration not yet recorded in `schema_migrations`, in version order, safely when several
 * instances start at once:
 *
 *   1. `pg_advisory_lock(MIGRATION_LOCK_KEY)` on this connection: a second instance waits here, then finds
 *      the migrations applied and applies nothing (no migration ever runs twice);
 *   2. a database with a migration this version does not know (a newer version used it) is refused;
 *   3. each pending file runs in its own transaction together with its `schema_migrations` row, so a failing
 *      migration leaves no trace of itself (the ones before it in the same run stay applied) and names its file;
 *   4. the lock is released (also when a step failed; a lost connection releases it on the server).
 *
 * `client` must be a dedicated connection (not shared with other work while this runs) with a session of its own:
 * through a pooler in transaction mode (PgBouncer pool_mode=transaction) a session advisory lock does not hold,
 * so point the service at the server or at a session-mode pool. The wait for the lock is bounded by the
 * connection's statement_timeout; migration statements run without one.
 */
export async function applyPostgresMigrations(
  client: pg.ClientBase,
  migrations: Migration[],
  nowMs: number = Date.now(),
): Promise<MigrationResult> {
  try {
    await client.query("SELECT pg_advisory_lock($1)", [MIGRATION_LOCK_KEY.toString()]);
  } catch (err) {
    if ((err as { code?: unknown }).code === "57014") {
      throw new Error(
        "Timed out waiting for another instance of the service to finish migrating the database (its migration advisory lock)",
        { cause: err },
      );
    }
    throw err;
  }
  const unlock = () => client.query("SELECT pg_advisory_unlock($1)", [MIGRATION_LOCK_KEY.toString()]);
  let result: MigrationResult;
  try {
    // A migration may take longer than the statement timeout meant for requests.
    await client.query("SET statement_timeout = 0");
    await client.query(
      "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at_ms bigint NOT NULL)",
    );
    const rows = (await client.query<MigrationRecord>("SELECT version, name FROM schema_migrations ORDER BY version")).rows;
    const known = new Set(migrations.map((m) => m.version));
    const unknown = rows.filter((r) => !known.has(r.version));
    if (unknown.length > 0) {
      const list = unknown.map((r) => `${r.version} (${r.name})`).join(", ");
      throw new Error(`The database has migrations this version of the service does not know: ${list}. It was used by a newer version.`);
    }
    const done = new Set(rows.map((r) => r.version));
    const applied: MigrationRecord[] = [];
    for (const migration of migrations) {
      if (done.has(migration.version)) continue;
      await client.query("BEGIN");
      try {
        try {
          // No parameters: the simple query protocol runs every statement of the file.
          await client.query(migration.sql);
          await runPostgresDataStep(client, migration.file);
        } catch (err) {
          throw new Error(`Migration ${migration.file} failed: ${(err as Error).message}`, { cause: err });
        }
        await client.query("INSERT INTO schema_migrations (version, name, applied_at_ms) VALUES ($1, $2, $3)", [
          migration.version,
          migration.name,
          nowMs,
        ]);
        await client.query("COMMIT");
      } catch (err) {
        await client.query("ROLLBACK").catch(() => undefined);
        throw err;
      }
      applied.push({ version: migration.version, name: migration.name });
    }
    const current = (await client.query<MigrationRecord>("SELECT version, name FROM schema_migrations ORDER BY version")).rows;
    result = { applied, current: current.map((r) => ({ version: r.version, name: r.name })) };
  } catch (err) {
    // When the unlock fails too, the connection is gone (and with it the lock); the caller ends the client. Keep the first error.
    await unlock().catch(() => undefined);
    throw err;
  }
  await unlock();
  return result;
}
