import pg from "pg";
import { CONNECTIONS_KEPT_FOR_READS } from "../group-commit.ts";
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
 *   pool_size=N             at most N connections in this instance's two pools together (default 10; see poolSizes)
 *   statement_timeout_ms=N  statement_timeout of every connection, in ms (default 5000); a transaction left
 *                           idle that long is ended by the server too (idle_in_transaction_session_timeout)
 *
 * e.g. postgres://tds:secret@db.internal:5432/tds?pool_size=20&statement_timeout_ms=3000&sslmode=require
 * Every other parameter (sslmode, application_name, …) is pg's, kept as written; `options` (-c search_path=…) is
 * sent after the adapter's own session settings (clientConfig).
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

/** What a bookkeeping connection's session gets beyond every session's settings (sessionOptions). */
export interface BookkeepingSession {
  /** plan_cache_mode=force_generic_plan: only where the store keeps every table's statistics fresh (postgres-store.ts). */
  genericPlans: boolean;
}

/**
 * What every session of the gateway needs, sent in the startup packet's `options` (`-c name=value`), so that a
 * connection has it from its first statement and no statement on the request path sets anything: no JIT (the
 * bookkeeping statements are cheap, and JIT compiling one costs milliseconds whenever an estimate crosses
 * jit_above_cost), and the timeouts. The bookkeeping connections (`bookkeeping`) also get:
 * - enable_seqscan=off, enable_hashjoin=off, enable_mergejoin=off: every bookkeeping statement finds its rows by a key
 *   (a batch's keys, unnested, joined to a primary key by a nested loop) or by the in-flight index. A plan made while a
 *   table was a few rows small (a new database, or one analyzed then) costs a Seq Scan, or a hash or merge join over a
 *   whole index, less than the lookups, and it was kept as the table grew, reading all of it at every execution until
 *   the next ANALYZE, up to a refresh interval later (postgres-statistics.ts). A statement that no index serves would
 *   still run, as a Seq Scan; none of them is one (test/store/postgres-generic-plans.test.ts). A join also names its
 *   keys as `= ANY`, so that the table is reached by key on either side of the loop (BY_KEY, postgres-book-rows.ts).
 * - with `genericPlans`, plan_cache_mode=force_generic_plan: their prepared statements are planned once per connection
 *   and after each ANALYZE of a table they use (postgres-statistics.ts), never at each execution, which the server's
 *   `auto` would do for the lookups by `= ANY($1)` (their generic plan assumes 10 keys).
 * The other connections follow the server's settings. Only settings every supported server knows (PostgreSQL 12 or
 * newer): an unknown name makes the server refuse the connection.
 */
function sessionOptions(statementTimeoutMs: number, idleInTransactionMs: number, bookkeeping: BookkeepingSession | null): string {
  const settings = {
    jit: "off",
    statement_timeout: statementTimeoutMs,
    idle_in_transaction_session_timeout: idleInTransactionMs,
    ...(bookkeeping ? { enable_seqscan: "off", enable_hashjoin: "off", enable_mergejoin: "off" } : {}),
    ...(bookkeeping?.genericPlans ? { plan_cache_mode: "force_generic_plan" } : {}),
  };
  return Object.entries(settings)
    .map(([name, value]) => `-c ${name}=${value}`)
    .join(" ");
}

/**
 * The URL without pg's `options` parameter, and that parameter's value. (pg reads PGOPTIONS only when it is given
 * no `options`; the store always gives some, so the URL is the one place for the operator's.)
 */
function operatorOptions(connectionString: string): { connectionString: string; options: string | undefined } {
  const q = connectionString.indexOf("?");
  if (q < 0) return { connectionString, options: undefined };
  let options: string | undefined;
  const kept: string[] = [];
  for (const part of connectionString.slice(q + 1).split("&")) {
    const eq = part.indexOf("=");
    if (safeDecode(eq < 0 ? part : part.slice(0, eq)) === "options") options = safeDecode(eq < 0 ? "" : part.slice(eq + 1));
    else kept.push(part);
  }
  return {
    connectionString: connectionString.slice(0, q) + (kept.length > 0 ? `?${kept.join("&")}` : ""),
    options,
  };
}

/**
 * The pg settings of every connection. The session settings (sessionOptions) go first in the startup `options`,
 * followed by the operator's own `options` (the URL's), which the server applies later, so an
 * operator's value wins (its `-c statement_timeout=…` over statement_timeout_ms, for instance). A pooler that refuses
 * unknown startup parameters (PgBouncer without `ignore_startup_parameters = options`) must be told to accept them.
 * Clients are pipelined (pg's `pipeline`): a statement is sent without waiting for the answers to those before it;
 * a caller that awaits each statement sees no difference, and `pipelinedTransaction` sends several at once.
 */
export function clientConfig(
  settings: ConnectionSettings,
  own: { statementTimeoutMs?: number; bookkeeping?: BookkeepingSession | undefined } = {},
): pg.ClientConfig {
  const statementTimeoutMs = own.statementTimeoutMs ?? settings.statementTimeoutMs;
  const operator = operatorOptions(settings.connectionString);
  const ours = sessionOptions(statementTimeoutMs, settings.statementTimeoutMs, own.bookkeeping ?? null);
  // A timeout of this connection's own (the migrations' longer one) comes last: the operator's must not shorten it.
  const last = statementTimeoutMs === settings.statementTimeoutMs ? "" : ` -c statement_timeout=${statementTimeoutMs}`;
  return {
    connectionString: operator.connectionString,
    options: (operator.options?.trim() ? `${ours} ${operator.options.trim()}` : ours) + last,
    application_name: settings.applicationName,
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    keepAlive: true,
    keepAliveInitialDelayMillis: 10_000,
    pipeline: true,
    types: TYPES,
  };
}

/**
 * How pool_size is shared by the two pools of a store: the bookkeeping transactions' (one connection per lane, and one
 * more for the sweep, a grant or a release running beside them) and everything else's (reads, key lookups, the
 * accounts, the readiness check), which keeps at least CONNECTIONS_KEPT_FOR_READS. Without a lane count the
 * bookkeeping pool may grow to the most lanes lanesFor allows (pool_size − 2). Below 3, pool_size still opens one
 * connection of each kind.
 */
export function poolSizes(poolSize: number, lanes?: number): { bookkeeping: number; reads: number } {
  const mostForBookkeeping = poolSize - CONNECTIONS_KEPT_FOR_READS;
  const bookkeeping = Math.max(1, lanes === undefined ? mostForBookkeeping : Math.min(lanes + 1, mostForBookkeeping));
  return { bookkeeping, reads: Math.max(1, poolSize - bookkeeping) };
}

export function openPool(
  settings: ConnectionSettings,
  size: number,
  own: { bookkeeping?: BookkeepingSession; onIdleError?: ((err: Error) => void) | undefined } = {},
): pg.Pool {
  const pool = new pg.Pool({
    ...clientConfig(settings, { bookkeeping: own.bookkeeping }),
    max: size,
    idleTimeoutMillis: IDLE_TIMEOUT_MS,
  });
  // An idle pooled connection that fails (server restart, pg_terminate_backend, network) has already been
  // removed by pg-pool; the next call opens a new one. Without a listener the 'error' event would crash the process.
  pool.on("error", (err) => own.onIdleError?.(err));
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

/**
 * The statements of one transaction on a pipelined client: `send` writes a statement at once, without waiting for
 * the answers to those before it; `settle` waits for every answer sent so far (one round trip for all of them) and
 * fails with the first failure in the order sent — the statements after a failed one fail only because the
 * transaction is aborted (25P02). A statement's failure may be mapped as it is sent (e.g. to StoreConflictError).
 */
export class Pipeline {
  #pending: Promise<unknown>[] = [];

  constructor(readonly client: Client) {}

  send<R extends pg.QueryResultRow = pg.QueryResultRow>(
    query: pg.QueryConfig,
    mapError?: (err: unknown) => unknown,
  ): Promise<pg.QueryResult<R>> {
    const sent = this.client.query<R>(query);
    const answer =
      mapError === undefined
        ? sent
        : sent.catch((err: unknown) => {
            throw mapError(err);
          });
    // Handled here, so that a failure awaits `settle` without being reported as unhandled meanwhile.
    answer.catch(() => {});
    this.#pending.push(answer);
    return answer;
  }

  async settle(): Promise<void> {
    const failed = await this.firstFailure();
    if (failed) throw failed.reason;
  }

  /** Waits for every answer not settled yet; the first failure among them, if any. */
  async firstFailure(): Promise<PromiseRejectedResult | undefined> {
    const pending = this.#pending;
    this.#pending = [];
    const outcomes = await Promise.allSettled(pending);
    return outcomes.find((o): o is PromiseRejectedResult => o.status === "rejected");
  }
}

/** COMMIT's command tag when the transaction had failed: the server rolled it back instead. */
const ROLLED_BACK = "ROLLBACK";

/**
 * Runs `fn` inside BEGIN … COMMIT like `transaction`, with the statements pipelined: BEGIN goes out with `fn`'s first
 * statements, and COMMIT right behind its last ones, so a transaction that reads once and then writes costs two round
 * trips. A COMMIT sent behind a statement that failed ends the transaction with ROLLBACK: the failure surfaces, as the
 * first failure of the pipeline, and the transaction fails. On any failure the client goes back to the pool after a
 * ROLLBACK when a transaction is still open, or is discarded when its connection failed (or its session is read-only).
 */
export async function pipelinedTransaction<T>(pool: pg.Pool, fn: (p: Pipeline) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  const onError = (err: Error) => (broken ??= err);
  client.on("error", onError);
  const p = new Pipeline(client);
  try {
    p.send({ text: "BEGIN ISOLATION LEVEL READ COMMITTED" });
    const result = await fn(p);
    const commit = p.send({ text: "COMMIT" });
    await p.settle();
    if ((await commit).command === ROLLED_BACK) throw new Error("The transaction failed and was rolled back at COMMIT");
    observers.get(pool)?.(null);
    return result;
  } catch (thrown) {
    // A statement still in flight that failed came first: it explains a failure of `fn` that followed (25P02).
    const err = (await p.firstFailure())?.reason ?? thrown;
    const failure = surfaced(err, broken);
    if (isConnectionFailure(err) || isReadOnlySession(err)) broken ??= err instanceof Error ? err : new Error(String(err));
    observers.get(pool)?.(failure);
    // Idle ('I'): no transaction left open (BEGIN never ran, or COMMIT ended it with ROLLBACK).
    if (broken === undefined && client.getTransactionStatus() !== "I") {
      try {
        await client.query("ROLLBACK");
      } catch (rollbackErr) {
        broken = rollbackErr instanceof Error ? rollbackErr : new Error(String(rollbackErr));
      }
    }
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
