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
