import Database from "better-sqlite3";
import type { BatchStore } from "../batches.ts";
import type { AccountsPart, BookkeepingPart } from "../compose-store.ts";
import { KeyLookupCache } from "../key-lookup-cache.ts";
import type { DbRow } from "../schema/table.ts";
import type { WriteCheck } from "../store.ts";
import { SharedCheck, WriteOutcomes } from "../write-outcomes.ts";
import type { Checkpointer } from "./checkpointer.ts";
import { SqliteAccounts } from "./sqlite-accounts.ts";
import { SqliteBatches } from "./sqlite-batches.ts";
import { SqliteBookkeeping } from "./sqlite-bookkeeping.ts";
import { curedByReopening, probeWrite, restoreSideFileModes, sqliteWritability } from "./sqlite-writability.ts";

/** The first attempt to open the database again waits this long after the previous one; then doubling up to the max. */
export const FIRST_REOPEN_DELAY_MS = 1000;
export const MAX_REOPEN_DELAY_MS = 30_000;

export interface ConnectionSettings {
  /** The absolute database file path, or `:memory:` (never opened again). */
  path: string;
  busyTimeoutMs: number;
  walLimitBytes: number;
  /** A checkpoint thread checkpoints the WAL: the connection's own autocheckpoint is off. */
  ownCheckpoints: boolean;
  /** The newest migration: a file opened again must hold it (not, say, an older backup put in its place). */
  schemaVersion: number;
}

type Write = <T>(fn: () => T) => Promise<T>;

export interface ConnectionHooks {
  /** Runs one write transaction (the store's asynchronous wait while another process holds the lock). */
  write: Write;
  /** Starts the checkpoint thread with a connection of its own (again after a reopen); null when there is none. */
  startCheckpoints: () => Checkpointer | null;
  onReopen?: (event: { reopened: boolean; message: string }) => void;
}

interface Parts {
  db: Database.Database;
  accounts: SqliteAccounts;
  books: SqliteBookkeeping;
  batches: SqliteBatches;
}

/** What every connection of the store is set to (journal_mode = WAL is kept in the file itself). */
function configure(db: Database.Database, settings: ConnectionSettings): void {
  db.pragma("synchronous = NORMAL");
  db.pragma("foreign_keys = ON");
  db.pragma(`journal_size_limit = ${settings.walLimitBytes}`);
  if (settings.ownCheckpoints) db.pragma("wal_autocheckpoint = 0");
  db.pragma(`busy_timeout = ${settings.busyTimeoutMs}`);
}

/**
 * An object whose methods are those of whatever `current()` returns at the time of each call, each call made through
 * `call` and each promise it returns passed through `observe` (both with the method's name).
 */
function forwarding<T extends object>(
  current: () => T,
  observe: (method: string, result: Promise<unknown>) => Promise<unknown>,
  call: (method: string, run: () => unknown) => unknown = (_method, run) => run(),
): T {
  return new Proxy({} as T, {
    get: (_target, name) => {
      const target = current();
      const value: unknown = Reflect.get(target, name);
      if (typeof value !== "function") return value;
      return (...args: unknown[]) => {
        const result: unknown = call(String(name), () => value.apply(target, args));
        return result instanceof Promise ? observe(String(name), result) : result;
      };
    },
  });
}

/** The books' group commit, which runs its transaction itself (not through the store's `write`), synchronously within the call. */
const SELF_COMMITTING = new Set(["commitBatch"]);

function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const code = (err as { code?: unknown }).code;
  return typeof code === "string" ? `${code}: ${err.message}` : err.message;
}

/**
 * The store's SQLite connection, and a new one when the database stops taking writes for a reason a new connection
 * may cure: a file that was read-only when it was opened (SQLite then keeps it read-only for good, even once the file
 * is writable again), or I/O errors (a volume that went away and came back). After such a failure — of a write or of
 * the write check — the file is opened again at most once per delay (1 s, doubling to 30 s, back to 1 s once it takes
 * writes). Every connection of this process to the file is closed first (the checkpoint thread's too): SQLite shares
 * one handle of the -shm file among them, opened read-only while the file was, for as long as any stays open. The new
 * connection is used from then on, and the checkpoint thread restarted with it; until it takes writes, every write
 * fails as before, with 503.
 */
export class SqliteConnection {
  #parts: Parts;
  #checkpointer: Checkpointer | null;
  readonly #outcomes = new WriteOutcomes();
  readonly #shared = new SharedCheck(() => this.#checkNow());
  #delayMs = FIRST_REOPEN_DELAY_MS;
  #nextAttemptMs = 0;
  #reopening: Promise<boolean> | null = null;
  #lastFailure = "";
  #closing: Promise<void> | null = null;
  /** The kept key lookups (Accounts.findApiKeyForRequest): one for the store, whichever connection is in use. */
  readonly #keptKeys = new KeyLookupCache<DbRow>();
  /** The accounts, books and batches of the connection in use, whichever it is at each call. */
  readonly accounts: AccountsPart = forwarding(
    () => this.#parts.accounts,
    (method, result) => this.#observed(method, result),
  );
  readonly books: BookkeepingPart = forwarding(
    () => this.#parts.books,
    (method, result) => this.#observed(method, result),
    (method, run) => (SELF_COMMITTING.has(method) ? this.#writing(run) : run()),
  );
  readonly batches: BatchStore = forwarding(
    () => this.#parts.batches,
    (method, result) => this.#observed(method, result),
  );

  constructor(
    db: Database.Database,
    readonly settings: ConnectionSettings,
    private readonly hooks: ConnectionHooks,
  ) {
    configure(db, settings);
    this.#parts = this.#partsOf(db);
    this.#checkpointer = hooks.startCheckpoints();
  }

  get db(): Database.Database {
    return this.#parts.db;
  }

  /** The write check, shared by the calls of a second (see SharedCheck). */
  checkWritable(): Promise<WriteCheck> {
    return this.#shared.check();
  }

  /** The write probe on the connection in use (opening the file again first when that may cure it), then what the latest writes met. */
  async #checkNow(): Promise<WriteCheck> {
    if (this.#closing !== null) return { state: "unavailable", reason: "The database connection is not open" };
    let probe = probeWrite(this.#parts.db);
    if (this.#mayCure(probe.state) && (await this.#reopen())) probe = probeWrite(this.#parts.db);
    if (probe.state !== "ok") return probe;
    return this.#outcomes.latest() ?? probe;
  }

  close(): Promise<void> {
    this.#shared.invalidate();
    this.#closing ??= (async () => {
      await this.#reopening;
      await this.#checkpointer?.stop();
      const db = this.#parts.db;
      if (!db.open) return;
      try {
        db.pragma("optimize");
      } catch {
        // Only statistics for the query planner; another process may hold the lock it needs.
      }
      db.close();
    })();
    return this.#closing;
  }

  /** A synchronous write transaction, told to the checkpoint thread (which checkpoints between two): see Checkpointer. */
  #writing<T>(write: () => T): T | Promise<T> {
    return this.#checkpointer ? this.#checkpointer.write(write) : write();
  }

  #partsOf(db: Database.Database): Parts {
    const write: Write = async <T>(fn: () => T): Promise<T> => {
      // Until it ran with the gate open: the gate may close again between the wait and the write.
      for (;;) {
        await this.#checkpointer?.closed();
        const result = await this.hooks.write(() => this.#checkpointer?.ifOpen(fn) ?? { ran: true as const, value: fn() });
        if (result.ran) {
          this.#outcomes.succeeded();
          return result.value;
        }
      }
    };
    return {
      db,
      accounts: new SqliteAccounts(db, write, this.#keptKeys),
      books: new SqliteBookkeeping(db, write),
      batches: new SqliteBatches(db, write),
    };
  }

  /**
   * What a store call met: a failure of the storage (of any call: reads see a connection gone, writes a read-only
   * file or a full disk) is remembered, and may start an attempt to open the file again. Successful writes are told
   * by `write`, and by the calls that commit by themselves.
   */
  async #observed<T>(method: string, result: Promise<T>): Promise<T> {
    try {
      const value = await result;
      if (SELF_COMMITTING.has(method)) this.#outcomes.succeeded();
      return value;
    } catch (err) {
      const state = sqliteWritability(err);
      if (state !== null) this.#shared.invalidate();
      if (state !== null && state !== "unavailable") this.#outcomes.failed({ state, reason: describe(err) });
      if (state !== null && this.#mayCure(state)) void this.#reopen();
      throw err;
    }
  }

  /** Whether opening the file again may help: it refused writes, or an attempt to open it again found no file to open. */
  #mayCure(state: WriteCheck["state"]): boolean {
    return curedByReopening(state) || (state === "unavailable" && !this.#parts.db.open && this.#closing === null);
  }

  /** Opens the file again if the delay has passed (one attempt at a time); true when the connection now takes writes. */
  #reopen(): Promise<boolean> {
    if (this.#reopening) return this.#reopening;
    const now = Date.now();
    if (this.#closing !== null || this.settings.path === ":memory:" || now < this.#nextAttemptMs) return Promise.resolve(false);
    const delayMs = this.#delayMs;
    this.#nextAttemptMs = now + delayMs;
    this.#delayMs = Math.min(delayMs * 2, MAX_REOPEN_DELAY_MS);
    this.#reopening = this.#openAgain(delayMs)
      .catch(() => false)
      .finally(() => {
        this.#reopening = null;
      });
    return this.#reopening;
  }

  async #openAgain(delayMs: number): Promise<boolean> {
    await this.#checkpointer?.stop();
    this.#checkpointer = null;
    if (this.#closing !== null) return false;
    if (this.#parts.db.open) this.#parts.db.close();
    let reason: string;
    try {
      restoreSideFileModes(this.settings.path);
      const fresh = new Database(this.settings.path, { fileMustExist: true });
      try {
        configure(fresh, this.settings);
        const version = fresh.prepare<[], { v: number | null }>("SELECT max(version) AS v FROM schema_migrations").get()?.v ?? 0;
        if (version !== this.settings.schemaVersion) {
          throw new Error(`the file now holds schema version ${version}, not ${this.settings.schemaVersion}`);
        }
      } catch (err) {
        fresh.close();
        throw err;
      }
      this.#parts = this.#partsOf(fresh);
      this.#checkpointer = this.hooks.startCheckpoints();
      const check = probeWrite(fresh);
      this.#shared.invalidate();
      if (check.state === "ok") {
        this.#outcomes.succeeded();
        this.#delayMs = FIRST_REOPEN_DELAY_MS;
        this.#nextAttemptMs = 0;
        this.#lastFailure = "";
        this.hooks.onReopen?.({ reopened: true, message: `the SQLite database ${this.settings.path} takes writes again: opened it again` });
        return true;
      }
      reason = check.reason ?? check.state;
    } catch (err) {
      // The old connection is closed: until an attempt opens the file, every call fails as storage unavailable (503).
      reason = describe(err);
    }
    if (reason !== this.#lastFailure) {
      this.#lastFailure = reason;
      this.hooks.onReopen?.({
        reopened: false,
        message: `the SQLite database ${this.settings.path} does not take writes, and opening it again did not help (${reason}); trying again in ${delayMs / 1000} s and later`,
      });
    }
    return false;
  }
}
