/**
 * An Idempotency-Key answers the same stored response (a decision) or the same batch (a submission) for this long
 * after its first use; after it, the key names a new request.
 */
export const IDEMPOTENCY_WINDOW_MS = 24 * 60 * 60 * 1000;
