import { ServiceError } from "../domain/errors.ts";

/**
 * Bad input from the caller of a Store: an `invalid_query` ServiceError (422) naming the query or record field.
 */
export class StoreInputError extends ServiceError {
  constructor(
    message: string,
    /** The query or record field at fault, such as `cursor` or `limit`, when known. */
    readonly field?: string,
  ) {
    super("invalid_query", `Invalid query: ${message}`, { message, errors: [{ field: `query.${field ?? "(query)"}`, message }] });
    this.name = "StoreInputError";
  }
}

/**
 * A write that conflicts with stored data: a unique name or key is taken. The callers that can meet one map it to
 * their own answer (the administrative operations: `name_taken`, 409). The ids the store is given are made by the
 * service, so one that reaches the HTTP layer unmapped is the service's fault: `internal` (500, the catalogue's detail;
 * the message, which may name stored values, is for the log and the CLI only).
 */
export class StoreConflictError extends ServiceError {
  constructor(message: string) {
    super("internal", undefined, { message });
    this.name = "StoreConflictError";
  }
}

/**
 * How a Store call failed, as the store that made it reads its driver's error (`Store.classifyFailure`):
 * `retryable` (others held what it needed; nothing was committed and it can run again as it is), `unavailable`
 * (disk full or failing, read-only, connection lost), `other` (not a failure of the storage: bad input, a conflict,
 * a bug). The API answers the first two with 503 `storage_unavailable`.
 */
export type StoreFailureKind = "retryable" | "unavailable" | "other";
