import { chmodSync } from "node:fs";
import { dirname, resolve } from "node:path";
import Database from "better-sqlite3";
import { createPrivateFile, makePrivateDir, octal, PRIVATE_FILE_MODE, readableByOthers, symbolicLinkAt } from "../../private-files.ts";
import { composeStore } from "../compose-store.ts";
import { readMigrations } from "../migration-files.ts";
import type { Store, WriteCheck } from "../store.ts";
import type { StoreFailureKind } from "../store-errors.ts";
import { whileBusy } from "./busy.ts";
import { type Checkpointer, DEFAULT_WAL_LIMIT_BYTES, startCheckpointer } from "./checkpointer.ts";
import { applyMigrations, SQLITE_MIGRATIONS_DIR } from "./migrations.ts";
import { type ConnectionSettings, SqliteConnection } from "./sqlite-connection.ts";
import { sqliteFailureKind } from "./sqlite-errors.ts";

export { usageListQuery } from "./sqlite-bookkeeping.ts";

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
  /**
   * The WAL is started over once it holds this many pages (default WAL_RESTART_PAGES, 32 MiB of 4 KiB pages; at most
   * half of walLimitBytes): between two writes when the checkpoint thread can catch up, by a RESTART checkpoint
   * holding the write lock when it has not at twice as many (at most three quarters of the limit).
   */
  walRestartPages?: number;
  /**
   * The WAL file is kept to at most this many bytes on disk (default DEFAULT_WAL_LIMIT_BYTES, 64 MiB): SQLite's
   * journal_size_limit, and with the checkpoint thread a TRUNCATE checkpoint whenever the file is larger.
   */
  walLimitBytes?: number;
  /** Told when a background checkpoint fails (at most once a minute for the same error). */
  onCheckpointError?: (message: string) => void;
  /**
   * Told when the database refused writes (read-only, I/O) and a new connection is tried: whether it takes writes
   * (the store uses it from then on) or not yet (tried again after 1 s, doubling up to 30 s). For the server log.
   */
  onReopen?: (event: { reopened: boolean; message: string }) => void;
  /** Told when an existing database file can be read by other users (a new one is always 0600). */
  onWarning?: (message: string) => void;
}

/** The options of a serving gateway: the event loop never waits on a lock, a commit or a checkpoint. */
export const SERVING_SQLITE: Readonly<SqliteStoreOptions> = Object.freeze({
  lockWaitMs: 5000,
  busyTimeoutMs: 0,
  checkpointIntervalMs: 500,
});

/**
 * Opens (creating the file and its folder when missing) a SQLite database and applies pending migrations.
 * `path` is relative to the current directory; `:memory:` gives a private in-memory database.
 * Folders it creates are 0700, a file it creates is 0600 (SQLite gives its -wal and -shm files the
 * database file's mode); an existing file keeps its mode, with a warning when others can read it. A path (or its
 * -wal, -shm or -journal file) that is a symbolic link is refused: SQLite would create or open the file where the link
 * points, with modes this function does not control.
 */
export function openSqliteStore(path: string, options: SqliteStoreOptions = {}): SqliteStore {
  if (path.trim() === "") throw new Error("The SQLite database path is empty");
  const inMemory = path === ":memory:";
  const fullPath = inMemory ? path : resolve(path);
  if (!inMemory) refuseSymbolicLinks(fullPath);
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
    const checkpoints = !inMemory && (options.checkpointIntervalMs ?? 0) > 0;
    const walLimitBytes = options.walLimitBytes ?? DEFAULT_WAL_LIMIT_BYTES;
    const settings: ConnectionSettings = {
      path: fullPath,
      busyTimeoutMs: options.busyTimeoutMs ?? lockWaitMs,
      walLimitBytes,
      ownCheckpoints: checkpoints,
      schemaVersion: Math.max(0, ...migrations.map((m) => m.version)),
    };
    const startCheckpoints = (): Checkpointer | null =>
      checkpoints
        ? startCheckpointer(fullPath, {
            intervalMs: options.checkpointIntervalMs!,
            walLimitBytes,
            ...(options.walRestartPages !== undefined ? { restartPages: options.walRestartPages } : {}),
            ...(options.onCheckpointError ? { onError: options.onCheckpointError } : {}),
          })
        : null;
    const connection = new SqliteConnection(db, settings, {
      write: (fn) => whileBusy(fn, lockWaitMs),
      startCheckpoints,
      ...(options.onReopen ? { onReopen: options.onReopen } : {}),
    });
    return composeStore(new SqliteHandle(connection), connection.accounts, connection.books, connection.batches);
  } catch (err) {
    db.close();
    throw err;
  }
}

const BUSY_TIMEOUT_MS = 5000;

/** SymbolicLinkError when the database file or one of SQLite's files beside it is a symbolic link. */
function refuseSymbolicLinks(fullPath: string): void {
  for (const suffix of ["", "-wal", "-shm", "-journal"]) {
    const target = symbolicLinkAt(fullPath + suffix);
    if (target !== null) throw new SymbolicLinkError(fullPath + suffix, target);
  }
}

/** The SQLite path is a symbolic link: the message names it and its target (the start-up line adds TDS_DATABASE_URL). */
export class SymbolicLinkError extends Error {
  constructor(
    readonly path: string,
    readonly target: string,
  ) {
    super(`${path} is a symbolic link (to ${target}), and links are not followed: name the database file itself`);
    this.name = "SymbolicLinkError";
  }
}

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

/** The store's lifecycle over its connection; the methods come from sqlite-accounts.ts, sqlite-bookkeeping.ts and sqlite-batches.ts. */
class SqliteHandle {
  readonly dialect = "sqlite" as const;

  constructor(private readonly connection: SqliteConnection) {}

  /** The connection in use now (a new one after the database was opened again). */
  get db(): Database.Database {
    return this.connection.db;
  }

  get path(): string {
    return this.connection.settings.path;
  }

  checkWritable(): Promise<WriteCheck> {
    return this.connection.checkWritable();
  }

  classifyFailure(err: unknown): StoreFailureKind {
    return sqliteFailureKind(err);
  }

  close(): Promise<void> {
    return this.connection.close();
  }
}
