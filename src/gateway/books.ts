import type { AdmitCommand, AdmitResult, CompleteCommand, CompleteResult } from "../domain/bookkeeping.ts";
import type { StoreFailureKind } from "../store/store-errors.ts";

/**
 * The port through which the pipeline records a request: admission and completion, each one durable step.
 * The store's group committer (src/store/group-commit.ts) implements it; a promise settles once its step
 * committed. `waitMs` bounds how long a step may wait for busy storage.
 */
export interface Books {
  admit(command: AdmitCommand, waitMs?: number): Promise<AdmitResult>;
  complete(command: CompleteCommand, waitMs?: number): Promise<CompleteResult>;
  /** How the store reads a failure of admit or complete: busy or unavailable storage is answered 503. */
  classifyFailure(err: unknown): StoreFailureKind;
}
