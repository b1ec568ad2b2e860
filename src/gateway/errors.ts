import type { FieldError } from "../contract/errors.ts";

/** Every way the gateway refuses or fails a request. The HTTP layer maps each code to a status. */
export type GatewayErrorCode =
  | "invalid_body"
  | "unknown_model"
  | "model_not_configured"
  | "model_not_ready"
  | "model_unavailable"
  | "model_timeout"
  | "model_invalid_response"
  | "context_rejected"
  | "org_paused"
  | "insufficient_credits"
  | "rate_limited"
  | "preview_quota_org"
  | "preview_quota_global"
  | "reservation_expired"
  | "idempotency_key_reused"
  | "idempotency_in_progress"
  | "idempotency_response_not_kept"
  | "not_found"
  | "storage_unavailable";

export class GatewayError extends Error {
  constructor(
    readonly code: GatewayErrorCode,
    /** Overrides the catalogue's text when the situation has more to say. */
    readonly detail?: string,
    readonly extra: { errors?: FieldError[]; retryAfterMs?: number } = {},
  ) {
    super(detail ?? code);
    this.name = "GatewayError";
  }
}
