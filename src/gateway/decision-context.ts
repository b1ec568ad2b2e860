import type { ApiKeyRecord, Organization } from "../domain/organizations.ts";
import type { UsageSource } from "../domain/usage-records.ts";

export interface DecisionContext {
  requestId: string;
  org: Organization;
  keyId: string;
  /**
   * The limits of the key that the pipeline applies: the models it may use, its budget, spent in its lineage's row
   * (absent: none of its own).
   */
  key?: Pick<ApiKeyRecord, "models" | "budget" | "lineageId">;
  source: UsageSource;
  /** performance.now() when the request arrived. */
  startedAt: number;
  /** Fires when the server gives up on the request (shutdown). */
  signal?: AbortSignal;
}

export interface IdempotencyRequest {
  key: string;
  /** sha256 of the request body bytes. */
  requestHash: string;
}

export interface DecisionReply {
  status: 200;
  /** JSON text of the DecisionResponse, byte-for-byte the same on a replay. */
  body: string;
  requestId: string;
  replayed: boolean;
}
