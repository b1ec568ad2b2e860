import { chmodSync } from "node:fs";
import { dirname, resolve } from "node:path";
import Database from "better-sqlite3";
import "./sqlite-errors.ts";
import { createPrivateFile, makePrivateDir, octal, PRIVATE_FILE_MODE, readableByOthers } from "../../private-files.ts";
import { composeStore } from "../compose-store.ts";
import { readMigrations } from "../migration-files.ts";
import type { Store } from "../store.ts";
import { whileBusy } from "./busy.ts";
import { type Checkpointer, startCheckpointer } from "./checkpointer.ts";
import { applyMigrations, SQLITE_MIGRATIONS_DIR } from "./migrations.ts";
import { SqliteAccounts } from "./sqlite-accounts.ts";
import { SqliteBooks } from "./sqlite-books.ts";

export { usageListQuery } from "./sqlite-books.ts";

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
  /**
   * How long a write waits while another process holds the write lock (default 5000 ms). A serving gateway
   * passes SERVING_SQLITE: SQLite's own busy handler is turned off, and writes wait asynchronously instead.
   */
  lockWaitMs?: number;
  /** SQLite's busy_timeout after opening (default: lockWaitMs, a synchronous wait in the thread). */
  busyTimeoutMs?: number;
  /** Checkpoint the WAL on a worker thread every this many ms instead of on commit (0: SQLite's autocheckpoint). */
  checkpointIntervalMs?: number;
  /** The WAL is started over once it holds this many pages (default WAL_RESTART_PAGES, 16 MB of 4 KB pages). */
  walRestartPages?: number;
  /** Told when a background checkpoint fails (at most once a minute for the same error). */
  onCheckpointError?: (message: string) => void;
  /** Told when an existing database file can be read by other users (a new one is always 0600). */
  onWarning?: (message: string) => void;
}

/** The options of a serving gateway: the event loop never waits on a lock, a commit or a checkpoint. */
export const SERVING_SQLITE: Readonly<SqliteStoreOptions> = Object.freeze({
  lockWaitMs: 5000,
  busyTimeoutMs: 0,
  checkpointIntervalMs: 1000,
});

/**
 * Opens (creating the file and its folder when missing) a SQLite database and applies pending migrations.
 * `path` is relative to the current directory; `:memory:` gives a private in-memory database.
 * Folders it creates are 0700, a file it creates is 0600 (SQLite gives its -wal and -shm files the
 * database file's mode); an existing file keeps its mode, with a warning when others can read it.
 */
export function openSqliteStore(path: string, options: SqliteStoreOptions = {}): SqliteStore {
  if (path.trim() === "") throw new Error("The SQLite database path is empty");
  const inMemory = path === ":memory:";
  const fullPath = inMemory ? path : resolve(path);
  const created = !inMemory && createDatabaseFile(fullPath);
  if (!inMemory && !created) warnIfReadable(fullPath, options.onWarning);
  const migrations = readMigrations(options.migrationsDir ?? SQLITE_MIGRATIONS_DIR);
  const db = new Database(fullPath);
  try {
    // busy_timeout first: switching to WAL and the migration transaction may have to wait for another process.
    db.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
    enableWal(db);
    if (created) for (const suffix of ["-wal", "-shm"]) chmodIfExists(fullPath + suffix, PRIVATE_FILE_MODE);
    db.pragma("synchronous = NORMAL");
    db.pragma("foreign_keys = ON");
    applyMigrations(db, migrations);
    const lockWaitMs = options.lockWaitMs ?? BUSY_TIMEOUT_MS;
    db.pragma(`busy_timeout = ${options.busyTimeoutMs ?? lockWaitMs}`);
    let checkpointer: Checkpointer | null = null;
    if (!inMemory && (options.checkpointIntervalMs ?? 0) > 0) {
      db.pragma("wal_autocheckpoint = 0");
      checkpointer = startCheckpointer(fullPath, {
        intervalMs: options.checkpointIntervalMs!,
        ...(options.walRestartPages !== undefined ? { restartPages: options.walRestartPages } : {}),
        ...(options.onCheckpointError ? { onError: options.onCheckpointError } : {}),
      });
    }
    return composeSqliteStore(db, fullPath, lockWaitMs, checkpointer);
  } catch (err) {
    db.close();
    throw err;
  }
}

const BUSY_TIMEOUT_MS = 5000;

/** Creates the database file (and its missing folders) private to this user; false when it already exists. */
function createDatabaseFile(fullPath: string): boolean {
  makePrivateDir(dirname(fullPath));
  return createPrivateFile(fullPath);
}

function warnIfReadable(fullPath: string, warn: ((message: string) => void) | undefined): void {
  if (!warn) return;
  const { readable, mode } = readableByOthers(fullPath);
  if (!readable) return;
  warn(
    `the database file ${fullPath} can be read by other users (mode ${octal(mode)}): ` +
      `run chmod 600 ${fullPath} ${fullPath}-wal ${fullPath}-shm`,
  );
}

function chmodIfExists(path: string, mode: number): void {
  try {
    chmodSync(path, mode);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
}

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

/** The connection, its path and its checkpointer; the methods come from sqlite-accounts.ts and sqlite-books.ts. */
class SqliteHandle {
  readonly dialect = "sqlite" as const;

  constructor(
    readonly db: Database.Database,
    readonly path: string,
    private readonly checkpointer: Checkpointer | null,
  ) {}

  async close(): Promise<void> {
    await this.checkpointer?.stop();
    if (!this.db.open) return;
    try {
      this.db.pragma("optimize");
    } catch {
      // Only statistics for the query planner; another process may hold the lock it needs.
    }
    this.db.close();
  }
}

function composeSqliteStore(db: Database.Database, path: string, lockWaitMs: number, checkpointer: Checkpointer | null): SqliteStore {
  const write = <T>(fn: () => T) => whileBusy(fn, lockWaitMs);
  return composeStore(new SqliteHandle(db, path, checkpointer), new SqliteAccounts(db, write), new SqliteBooks(db, write));
}
