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

/**
 * True for failures of the storage itself (database busy or locked, disk full or failing, connection
 * lost), as opposed to bad input or a bug: the API answers them with 503 and a retryable detail.
 */
export function isStoreUnavailable(err: unknown): boolean {
  if (typeof err !== "object" || err === null) return false;
  const code = (err as { code?: unknown }).code;
  if (typeof code !== "string") return false;
  return UNAVAILABLE_SQLITE.test(code) || code === "ECONNREFUSED" || code === "ECONNRESET" || code.startsWith("57P") || code.startsWith("08");
}
