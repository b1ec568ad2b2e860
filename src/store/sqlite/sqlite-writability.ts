import { accessSync, chmodSync, constants, statSync } from "node:fs";
import type Database from "better-sqlite3";
import type { Writability, WriteCheck } from "../store.ts";
import { isSqliteBusy } from "./busy.ts";
import { sqliteFailureKind } from "./sqlite-errors.ts";

/**
 * A statement that needs the write lock and a writable file but changes nothing: a read-only connection (a file it
 * could only open for reading) fails it with SQLITE_READONLY, although BEGIN IMMEDIATE alone succeeds there.
 */
const PROBE_SQL = "UPDATE schema_migrations SET name = name WHERE version = -1";

/** What a SQLite error says about writing: null for an error that is not about the storage (a constraint, a bug). */
export function sqliteWritability(err: unknown): Writability | null {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code !== "string") return sqliteFailureKind(err) === "unavailable" ? "unavailable" : null;
  if (code.startsWith("SQLITE_READONLY")) return "read_only";
  if (code === "SQLITE_FULL") return "disk_full";
  if (/^SQLITE_(IOERR|CANTOPEN|PROTOCOL|CORRUPT|NOTADB)/.test(code)) return "cannot_write";
  return null;
}

/** States that a new connection may cure (the file was made writable again, the volume came back). */
export function curedByReopening(state: Writability): boolean {
  return state === "read_only" || state === "cannot_write";
}

/**
 * Whether `db` can write now, committing nothing: BEGIN IMMEDIATE, a write statement that touches no row, ROLLBACK.
 * It never waits: a lock held by another connection means the database takes writes (someone is writing).
 */
export function probeWrite(db: Database.Database): WriteCheck {
  if (!db.open) return { state: "unavailable", reason: "The database connection is not open" };
  // Statements on this connection run synchronously: a transaction open now belongs to the caller.
  if (db.inTransaction) return { state: "ok" };
  const busyTimeout = db.pragma("busy_timeout", { simple: true }) as number;
  try {
    db.pragma("busy_timeout = 0");
    db.exec("BEGIN IMMEDIATE");
    try {
      db.prepare(PROBE_SQL).run();
    } finally {
      db.exec("ROLLBACK");
    }
    return { state: "ok" };
  } catch (err) {
    if (isSqliteBusy(err)) return { state: "ok" };
    const state = sqliteWritability(err);
    if (state === null) throw err;
    return { state, reason: err instanceof Error ? `${(err as { code?: string }).code ?? err.name}: ${err.message}` : String(err) };
  } finally {
    if (db.open) db.pragma(`busy_timeout = ${busyTimeout}`);
  }
}

/**
 * SQLite creates the -wal and -shm files with the database file's mode: made while the file was read-only, they stay
 * read-only after the file is made writable again (chmod u+w on the database alone), and every new connection is
 * read-only for them. When the database file is writable for this process, its -wal and -shm files (this user's) that
 * are not get the database file's mode again. Anything else is left to the operator.
 */
export function restoreSideFileModes(fullPath: string): void {
  if (!writable(fullPath)) return;
  const mode = statSync(fullPath).mode & 0o666;
  for (const suffix of ["-wal", "-shm"]) {
    const side = statSync(fullPath + suffix, { throwIfNoEntry: false });
    if (!side || writable(fullPath + suffix) || side.uid !== process.getuid?.()) continue;
    try {
      chmodSync(fullPath + suffix, mode);
    } catch {
      // The next attempt tries again; the write check keeps saying read-only meanwhile.
    }
  }
}

function writable(path: string): boolean {
  try {
    accessSync(path, constants.W_OK);
    return true;
  } catch {
    return false;
  }
}
