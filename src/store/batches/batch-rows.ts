/** The rows the Batches port (batches.ts) answers with; the tables are described in schema/tables.ts. */

/** `validating`: its upload is being read; invisible to the API and never run. */
export type BatchStatus = "validating" | "queued" | "running" | "completed" | "cancelling" | "cancelled" | "expired";

export interface BatchRecord {
  id: string;
  orgId: string;
  keyId: string;
  /** The model of requests that name none; null: the configured model when each request runs. */
  model: string | null;
  status: BatchStatus;
  createdAtMs: number;
  startedAtMs: number | null;
  endedAtMs: number | null;
  expiresAtMs: number;
  /** While validating: the lines written so far. */
  total: number;
  /** Requests answered 200. */
  succeeded: number;
  /** Requests ended with any other status (cancelled and expired ones included). */
  failed: number;
  costMicrousd: number;
  inputBytes: number;
}

/** A batches row: the record, the upload's last write, the expired requests and the submission's Idempotency-Key. */
export type BatchRow = BatchRecord & {
  touchedAtMs: number;
  expired: number;
  idempotencyKey: string | null;
  requestHash: string | null;
};

/** One request of a batch as the route validated it. */
export interface BatchLine {
  /** 0-based position among the submission's requests (not its input line number: blank lines are not counted). */
  position: number;
  customId: string;
  /** The line's JSON text. */
  body: string;
}

/** A batch request claimed by an instance: what it needs to run it as an ordinary decision. */
export interface ClaimedRequest {
  batchId: string;
  position: number;
  orgId: string;
  keyId: string;
  /** The batch's model (the line's own `model`, if any, is in its body). */
  model: string | null;
  customId: string;
  body: string;
  /** Given at the request's first claim and kept by later ones: a re-run after a takeover has the same id. */
  requestId: string;
  leaseUntilMs: number;
  /** Claimed before (its lease ended or it was deferred): a run of it may have been admitted, or even completed. */
  takenOver: boolean;
}

/** A finished request: the answer POST /v1/systemone would have given. */
export interface BatchResult {
  position: number;
  customId: string;
  /** Null for a request that never ran (it was cancelled or expired before it started). */
  requestId: string | null;
  status: number;
  /** JSON text: the DecisionResponse or the error body. */
  body: string;
  costMicrousd: number;
}

/** A batch_requests row. */
export interface BatchRequestRow {
  batchId: string;
  position: number;
  customId: string;
  body: string;
  state: "pending" | "claimed" | "done";
  requestId: string | null;
  claimedBy: string | null;
  leaseUntilMs: number | null;
  resultStatus: number | null;
  resultBody: string | null;
  costMicrousd: number | null;
  finishedAtMs: number | null;
}
