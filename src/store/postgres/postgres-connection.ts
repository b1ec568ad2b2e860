import pg from "pg";
import { StoreConflictError, StoreInputError } from "../store-errors.ts";

/**
 * Connections for the PostgreSQL adapter: the pool settings every connection gets, the adapter's own URL
 * parameters, bigint parsing, and the two ways a method talks to the database — `withClient` (one
 * statement, autocommit) and `transaction` (BEGIN … COMMIT). Both always give the client back to the pool,
 * after a ROLLBACK when a transaction failed, and discard it (`release(err)`) when its connection is broken or
 * its session read-only, so no client leaks, no transaction stays open and no stale session is kept.
 */

export const DEFAULT_POOL_SIZE = 10;
export const DEFAULT_STATEMENT_TIMEOUT_MS = 5000;
export const DEFAULT_APPLICATION_NAME = "typed-decision-service";
/** How long to wait for a connection (a new one, or a free one from a busy pool) before failing. */
export const CONNECT_TIMEOUT_MS = 10_000;
/** An unused pooled connection is closed after this long. */
const IDLE_TIMEOUT_MS = 30_000;
const MAX_POOL_SIZE = 1000;
/** PostgreSQL's limit for a timeout setting (an int, in ms). */
const MAX_TIMEOUT_MS = 2_147_483_647;

export interface ConnectionSettings {
  /** The URL for pg, without the adapter's own parameters. Never printed: it may hold a password. */
  connectionString: string;
  poolSize: number;
  statementTimeoutMs: number;
  applicationName: string;
}

export interface ConnectionOptions {
  poolSize?: number;
  statementTimeoutMs?: number;
  applicationName?: string;
}

function wholeNumber(value: unknown, field: string, max: number): number {
  const n = typeof value === "string" ? (/^[0-9]{1,10}$/.test(value) ? Number(value) : Number.NaN) : value;
  if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 1 || n > max) {
    throw new Error(`The PostgreSQL ${field} must be a whole number from 1 to ${max}, got ${JSON.stringify(value)}`);
  }
  return n;
}

/**
 * The connection settings of a `postgres://` or `postgresql://` URL. Two query parameters belong to the
 * adapter and are taken out before the URL goes to pg; when present they override the `options` argument:
 *
 *   pool_size=N             at most N connections in this instance's pool (default 10)
 *   statement_timeout_ms=N  statement_timeout of every connection, in ms (default 5000); a transaction left
 *                           idle that long is ended by the server too (idle_in_transaction_session_timeout)
 *
 * e.g. postgres://tds:secret@db.internal:5432/tds?pool_size=20&statement_timeout_ms=3000&sslmode=require
 * Every other parameter (sslmode, application_name, options=-c search_path=…, …) is pg's, kept as written.
 */
export function connectionSettings(url: string, options: ConnectionOptions = {}): ConnectionSettings {
  let poolSize = options.poolSize === undefined ? DEFAULT_POOL_SIZE : wholeNumber(options.poolSize, "pool size", MAX_POOL_SIZE);
  let statementTimeoutMs =
    options.statementTimeoutMs === undefined
      ? DEFAULT_STATEMENT_TIMEOUT_MS
      : wholeNumber(options.statementTimeoutMs, "statement timeout", MAX_TIMEOUT_MS);
  const trimmed = url.trim();
  if (!/^postgres(ql)?:\/\//i.test(trimmed)) throw new Error("A PostgreSQL database URL starts with postgres:// or postgresql://");
  const hash = trimmed.indexOf("#");
  const withoutFragment = hash < 0 ? trimmed : trimmed.slice(0, hash);
  const q = withoutFragment.indexOf("?");
  let connectionString = withoutFragment;
  if (q >= 0) {
    const kept: string[] = [];
    for (const part of withoutFragment.slice(q + 1).split("&")) {
      if (part === "") continue;
      const eq = part.indexOf("=");
      const name = safeDecode(eq < 0 ? part : part.slice(0, eq));
      const value = safeDecode(eq < 0 ? "" : part.slice(eq + 1));
      if (name === "pool_size") poolSize = wholeNumber(value, "pool_size URL parameter", MAX_POOL_SIZE);
      else if (name === "statement_timeout_ms")
        statementTimeoutMs = wholeNumber(value, "statement_timeout_ms URL parameter", MAX_TIMEOUT_MS);
      else kept.push(part);
    }
    connectionString = withoutFragment.slice(0, q) + (kept.length > 0 ? `?${kept.join("&")}` : "");
  }
  return { connectionString, poolSize, statementTimeoutMs, applicationName: options.applicationName ?? DEFAULT_APPLICATION_NAME };
}

function safeDecode(text: string): string {
  try {
    return decodeURIComponent(text.replace(/\+/g, " "));
  } catch {
    return text;
  }
}

// ── bigint → number ──

const INT8_OID = 20;

/** bigint columns (and count(*)) as numbers; every stored amount and time is a safe integer, and this checks it. */
export function parseBigint(text: string): number {
  const n = Number(text);
  if (!Number.isSafeInteger(n))
    throw new RangeError(`The database returned the bigint ${text}, outside the range of exact JavaScript numbers`);
  return n;
}

/** Per-pool type parsers (pg's global parsers are left alone for any other user of pg in the process). */
const TYPES: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: "text" | "binary") =>
    oid === INT8_OID && format !== "binary" ? parseBigint : pg.types.getTypeParser(oid, format)) as pg.CustomTypesConfig["getTypeParser"],
};

/**
 * The pg settings of every connection: statement_timeout and idle_in_transaction_session_timeout are sent in
 * the startup packet, so each connection has them from its first statement, with no extra round trip.
 * (A pooler that refuses unknown startup parameters, such as PgBouncer without ignore_startup_parameters,
 * must be told to accept or ignore these two.)
 */
export function clientConfig(settings: ConnectionSettings, statementTimeoutMs = settings.statementTimeoutMs): pg.ClientConfig {
  return {
    connectionString: settings.connectionString,
    application_name: settings.applicationName,
    statement_timeout: statementTimeoutMs,
    idle_in_transaction_session_timeout: settings.statementTimeoutMs,
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    keepAlive: true,
    keepAliveInitialDelayMillis: 10_000,
    types: TYPES,
  };
}

export function openPool(settings: ConnectionSettings, onIdleError?: (err: Error) => void): pg.Pool {
  const pool = new pg.Pool({
    ...clientConfig(settings),
    max: settings.poolSize,
    idleTimeoutMillis: IDLE_TIMEOUT_MS,
    // The bookkeeping statements are prepared once per connection; a generic plan made while the tables were small
    // (a sequential scan) would be kept as they grow. Awaited before pg-pool hands the new client out, so it never
    // overlaps the caller's first statement. A server that refuses the setting (before PostgreSQL 12) keeps its default.
    onConnect: async (client) => {
      await client.query("SET plan_cache_mode = force_custom_plan").catch(() => {});
    },
  });
  // An idle pooled connection that fails (server restart, pg_terminate_backend, network) has already been
  // removed by pg-pool; the next call opens a new one. Without a listener the 'error' event would crash the process.
  pool.on("error", (err) => onIdleError?.(err));
  pool.on("connect", (client) => {
    // A connection killed while pg-pool is still handing it out has neither pg-pool's idle listener nor ours
    // (withClient/transaction) attached: a permanent no-op listener keeps that 'error' from crashing the process.
    // The failure itself still surfaces as the failed query's error, and the client is discarded then.
    client.on("error", () => {});
  });
  return pool;
}

// ── running statements ──

/** pg's own errors (no SQLSTATE) for a connection that is gone. */
const PG_CONNECTION_LOST = /Connection terminated|not queryable|Client was closed|connection error/;

/**
 * True when an error means the connection itself is gone or unusable, so the client must be discarded and no
 * ROLLBACK tried: a FATAL/PANIC server error or one of classes 08 (connection exception) and 57P (operator
 * intervention, such as 57P01 from pg_terminate_backend), a socket error (ECONNRESET, EPIPE, …), or pg's
 * "Connection terminated unexpectedly" and the like. The adapter's own errors (StoreConflictError, …), other
 * server errors and a refused bigint leave the connection usable. (pg-pool also discards a client whose
 * connection it knows to be dead, whatever it is told.)
 */
export function isConnectionFailure(err: unknown): boolean {
  if (err instanceof pg.DatabaseError) {
    return err.severity === "FATAL" || err.severity === "PANIC" || /^(08|57P)/.test(err.code ?? "");
  }
  if (!(err instanceof Error)) return false;
  const code = (err as { code?: unknown }).code;
  return (typeof code === "string" && /^E[A-Z]+$/.test(code)) || PG_CONNECTION_LOST.test(err.message);
}

/** 25006: the session is read-only (default_transaction_read_only, or a standby). */
const READ_ONLY_TRANSACTION = "25006";

/**
 * A session that refused a write for being read-only is discarded rather than given back to the pool: it keeps the
 * settings it started with (an `ALTER DATABASE … SET default_transaction_read_only` since undone, a server since
 * promoted), and a new connection gets the current ones.
 */
function isReadOnlySession(err: unknown): boolean {
  return pgCode(err) === READ_ONLY_TRANSACTION;
}

/** Told of every failure, and of every committed transaction (a success: null), of a pool's calls. */
export type OutcomeObserver = (failure: unknown) => void;
const observers = new WeakMap<pg.Pool, OutcomeObserver>();

/** What the write check hears of the writes: see WriteOutcomes. One observer per pool. */
export function observeOutcomes(pool: pg.Pool, observer: OutcomeObserver): void {
  observers.set(pool, observer);
}

/**
 * Whether a pooled session is read-only now (transaction_read_only: default_transaction_read_only, or a standby),
 * committing nothing; a read-only session is discarded, so that the next one is opened with the current settings.
 */
export async function sessionReadOnly(pool: pg.Pool): Promise<boolean> {
  const client = await pool.connect();
  let discard: Error | undefined;
  const onError = (err: Error) => (discard ??= err);
  client.on("error", onError);
  try {
    const result = await client.query<{ read_only: string }>("SELECT current_setting('transaction_read_only') AS read_only");
    const readOnly = result.rows[0]?.read_only === "on";
    if (readOnly) discard ??= new Error("read-only session");
    return readOnly;
  } catch (err) {
    discard ??= err instanceof Error ? err : new Error(String(err));
    throw err;
  } finally {
    client.off("error", onError);
    client.release(discard ?? false);
  }
}

export function pgCode(err: unknown): string | undefined {
  return err instanceof pg.DatabaseError ? err.code : undefined;
}

export const UNIQUE_VIOLATION = "23505";
export const FOREIGN_KEY_VIOLATION = "23503";

/** A unique violation, optionally of one named constraint. */
export function isUniqueViolation(err: unknown, constraint?: string): err is pg.DatabaseError {
  return pgCode(err) === UNIQUE_VIOLATION && (constraint === undefined || (err as pg.DatabaseError).constraint === constraint);
}

/**
 * Text with U+0000 cannot be stored in PostgreSQL (SQLite can): the server answers 22021. Written values are
 * the caller's input, so that becomes a StoreInputError; lookups with such text return "not found" before
 * reaching the database (see `hasNul`).
 */
function mapInputError(err: unknown): unknown {
  if (pgCode(err) === "22021" && /0x00/.test((err as Error).message)) {
    return new StoreInputError("Text values must not contain NUL characters (U+0000)");
  }
  return err;
}

/** True when any of the strings holds U+0000, which no stored value can: a lookup with it finds nothing. */
export function hasNul(...values: (string | null | undefined)[]): boolean {
  return values.some((v) => typeof v === "string" && v.includes("\0"));
}

export type Client = pg.PoolClient;

/**
 * The error to surface for a failed call: when the connection failed between two statements, pg reports the
 * next statement as "Client has encountered a connection error and is not queryable" (no code); the failure
 * itself (often with a code such as 57P01, which postgresFailureKind reads as unavailable) says more.
 */
function surfaced(err: unknown, broken: Error | undefined): unknown {
  const notQueryable = err instanceof Error && !(err instanceof pg.DatabaseError) && /not queryable/.test(err.message);
  return mapInputError(notQueryable && broken !== undefined && broken !== err ? broken : err);
}

/** Thrown inside `transaction` to roll back and still return `value` (an answer such as "global_exhausted"). */
export class Rollback<T> {
  constructor(readonly value: T) {}
}

/**
 * Runs `fn` with a pooled client outside any explicit transaction (each statement commits on its own).
 * The client goes back to the pool afterwards, or is discarded when its connection failed.
 */
export async function withClient<T>(pool: pg.Pool, fn: (client: Client) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  // While checked out, pg-pool does not listen for the client's 'error' event (a connection lost between two
  // statements); unheard, it would crash the process.
  const onError = (err: Error) => (broken ??= err);
  client.on("error", onError);
  try {
    return await fn(client);
  } catch (err) {
    const failure = surfaced(err, broken);
    if (isConnectionFailure(err) || isReadOnlySession(err)) broken ??= err instanceof Error ? err : new Error(String(err));
    observers.get(pool)?.(failure);
    throw failure;
  } finally {
    client.off("error", onError);
    client.release(broken ?? false);
  }
}

/**
 * Runs `fn` inside BEGIN … COMMIT (READ COMMITTED, always; row locks and conditional updates make each method safe
 * under concurrency). Any error — from a statement, from `fn` itself, or from COMMIT — is followed by a ROLLBACK
 * and the client goes back to the pool; when the connection failed (or the ROLLBACK does), the client is
 * discarded instead. Throwing a `Rollback` rolls back and returns its value.
 */
export async function transaction<T>(pool: pg.Pool, fn: (client: Client) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  const onError = (err: Error) => (broken ??= err);
  client.on("error", onError);
  try {
    // Explicit, whatever default_transaction_isolation says: the conditional updates and row locks rely on READ
    // COMMITTED re-checking their conditions on the newest committed row (stricter levels would fail with 40001).
    await client.query("BEGIN ISOLATION LEVEL READ COMMITTED");
    const result = await fn(client);
    await client.query("COMMIT");
    observers.get(pool)?.(null);
    return result;
  } catch (err) {
    const failure = surfaced(err, broken);
    // A lost connection has no transaction left to roll back (the server ended it with the session); a read-only
    // session is discarded, and ends its transaction with it.
    if (isConnectionFailure(err) || isReadOnlySession(err)) broken ??= err as Error;
    if (!(err instanceof Rollback)) observers.get(pool)?.(failure);
    if (broken === undefined) {
      try {
        await client.query("ROLLBACK");
      } catch (rollbackErr) {
        broken = rollbackErr instanceof Error ? rollbackErr : new Error(String(rollbackErr));
      }
    }
    if (err instanceof Rollback) return err.value as T;
    throw failure;
  } finally {
    client.off("error", onError);
    client.release(broken ?? false);
  }
}

/** Rethrows a unique violation of the insert as StoreConflictError with `message`; anything else as it is. */
export function conflictOr(err: unknown, message: string): never {
  if (isUniqueViolation(err)) throw new StoreConflictError(message);
  throw err;
}
