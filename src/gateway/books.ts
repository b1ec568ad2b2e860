import type { AdmitCommand, AdmitResult, CompleteCommand, CompleteResult } from "../store/bookkeeping/commands.ts";

export type { AdmitCommand, AdmitResult, CompleteCommand, CompleteResult };

/**
 * The port through which the pipeline records a request: admission and completion, each one durable step.
 * The store's group committer (src/store/batched-books.ts) implements it; a promise settles once its step
 * committed. `waitMs` bounds how long a step may wait for busy storage.
 */
export interface Books {
  admit(command: AdmitCommand, waitMs?: number): Promise<AdmitResult>;
  complete(command: CompleteCommand, waitMs?: number): Promise<CompleteResult>;
}
