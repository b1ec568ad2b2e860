import type { StoredResponse } from "./store.ts";

/** Inputs and rows of the idempotency-key methods, shared by the SQLite and PostgreSQL adapters. */
export interface ClaimInput {
  orgId: string;
  key: string;
  requestHash: string;
  requestId: string;
  nowMs: number;
  lockUntilMs: number;
  expiresAtMs: number;
}

export interface OwnerInput {
  orgId: string;
  key: string;
  requestId: string;
}

export interface CompleteInput extends OwnerInput {
  response: StoredResponse;
}

export interface EntryRow {
  request_hash: string;
  request_id: string;
  state: "in_progress" | "completed";
  response_status: number | null;
  response_body: string | null;
  response_request_id: string | null;
  lock_until_ms: number;
  expires_at_ms: number;
}
