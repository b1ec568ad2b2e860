import { ServiceError } from "../domain/errors.ts";

/**
 * Bad input from the caller of a Store (as opposed to a conflict with stored data, which is `StoreConflictError` in
 * store.ts): an `invalid_query` ServiceError naming the query field.
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
 * How a Store operation failed for reasons of the storage itself: `retryable` (others held what it needed; nothing
 * was committed and it can run again as it is), `unavailable` (busy, locked, disk full or failing, connection lost).
 * The API answers both with 503 and a retryable detail.
 */
export type StoreFailureKind = "retryable" | "unavailable";

/** How one adapter reads its driver's errors: a kind for a storage failure of its own, else null. */
export type DriverErrorClassifier = (err: unknown) => StoreFailureKind | null;

const classifiers: DriverErrorClassifier[] = [];

/** Called by each adapter when it is loaded: the port itself knows no driver's codes. */
export function registerDriverErrors(classify: DriverErrorClassifier): void {
  if (!classifiers.includes(classify)) classifiers.push(classify);
}

export function storeFailureKind(err: unknown): StoreFailureKind | null {
  if (typeof err !== "object" || err === null) return null;
  for (const classify of classifiers) {
    const kind = classify(err);
    if (kind !== null) return kind;
  }
  return null;
}

/** True for failures of the storage itself, as opposed to bad input or a bug. */
export function isStoreUnavailable(err: unknown): boolean {
  return storeFailureKind(err) !== null;
}

/** True for a transaction that failed only because others held what it needed: it can be run again as it is. */
export function isStoreRetryable(err: unknown): boolean {
  return storeFailureKind(err) === "retryable";
}
