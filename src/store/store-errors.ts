/**
 * Errors a Store adapter throws for bad input from the caller (as opposed to a conflict with stored data,
 * which is `StoreConflictError` in store.ts). The HTTP layer answers a `StoreInputError` with 422.
 */
export class StoreInputError extends Error {
  constructor(
    message: string,
    /** The query or record field at fault, such as `cursor` or `limit`, when known. */
    readonly field?: string,
  ) {
    super(message);
    this.name = "StoreInputError";
  }
}

const UNAVAILABLE_SQLITE = /^SQLITE_(BUSY|LOCKED|IOERR|FULL|CANTOPEN|READONLY|PROTOCOL)/;
/** PostgreSQL SQLSTATEs: connection (08), resources (53), operator intervention (57: shutdown, statement timeout), system (58), lock timeout, serialization, read-only standby. */
const UNAVAILABLE_PG = /^(08|53|57|58)...$|^(55P03|40001|40P01|25006|25P03)$/;
const UNAVAILABLE_NET = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "EHOSTUNREACH", "ENETUNREACH", "ENOTFOUND", "EAI_AGAIN"]);
/** node-postgres errors that carry no code. */
const UNAVAILABLE_MESSAGE = /Connection terminated|connection error and is not queryable|timeout exceeded when trying to connect/;

/**
 * True for failures of the storage itself (database busy or locked, disk full or failing, connection
 * lost), as opposed to bad input or a bug: the API answers them with 503 and a retryable detail.
 */
export function isStoreUnavailable(err: unknown): boolean {
  if (typeof err !== "object" || err === null) return false;
  const code = (err as { code?: unknown }).code;
  if (typeof code !== "string") return err instanceof Error && UNAVAILABLE_MESSAGE.test(err.message);
  return UNAVAILABLE_SQLITE.test(code) || UNAVAILABLE_PG.test(code) || UNAVAILABLE_NET.has(code);
}

const RETRYABLE_SQLITE = /^SQLITE_(BUSY|LOCKED)/;
/** Deadlock, serialization failure, lock not available: the transaction was rolled back and may simply be run again. */
const RETRYABLE_PG = new Set(["40P01", "40001", "55P03"]);

/**
 * True for a transaction that failed only because others held what it needed (SQLite busy or locked, a
 * PostgreSQL deadlock or serialization failure): nothing of it was committed, and it can be run again as it is.
 */
export function isStoreRetryable(err: unknown): boolean {
  if (typeof err !== "object" || err === null) return false;
  const code = (err as { code?: unknown }).code;
  return typeof code === "string" && (RETRYABLE_SQLITE.test(code) || RETRYABLE_PG.has(code));
}
