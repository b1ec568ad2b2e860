/**
 * Every way the service refuses or fails a request, with its HTTP status and standard `detail`: the one place that
 * decides a status (the HTTP answer, the usage record's http_status and the routes' documented responses).
 */
export const ERROR_CATALOGUE = {
  missing_api_key: { status: 401, detail: "Missing API key: send the header Authorization: Bearer <API_KEY>." },
  invalid_api_key: { status: 401, detail: "Invalid API key." },
  revoked_api_key: { status: 401, detail: "This API key has been revoked." },
  expired_api_key: { status: 401, detail: "This API key has expired." },
  retired_api_key: { status: 401, detail: "This API key was rotated and its grace period has ended; use the key that replaced it." },
  missing_admin_token: {
    status: 401,
    detail: "Missing admin token: send the header Authorization: Bearer <admin token> (TDS_ADMIN_TOKEN).",
  },
  invalid_admin_token: { status: 401, detail: "Invalid admin token." },
  admin_auth_throttled: {
    status: 429,
    detail: "Too many failed admin authentications from this address; retry after the time in Retry-After.",
  },
  name_taken: { status: 409, detail: "The name is already in use." },
  key_not_active: {
    status: 409,
    detail: "The API key is revoked or was already rotated (it cannot be changed or rotated), or has expired (it cannot be rotated).",
  },
  org_paused: { status: 403, detail: "Requests of this organization are paused pending billing review." },
  model_not_allowed: { status: 403, detail: "This API key may not use this model." },
  key_budget_exhausted: { status: 402, detail: "This API key's budget for the period cannot cover the reservation for this request." },
  insufficient_credits: { status: 402, detail: "Available credits cannot cover the token reservation for this request." },
  reservation_expired: {
    status: 409,
    detail:
      "The request's credit reservation expired before it could be settled; nothing was charged. Check Usage by request_id before retrying.",
  },
  idempotency_in_progress: {
    status: 409,
    detail: "A request with this Idempotency-Key is still being processed; wait for it to finish, then retry to get its stored response.",
  },
  idempotency_response_not_kept: {
    status: 409,
    detail:
      "A request with this Idempotency-Key already succeeded, but its response was too large to keep for replays; find it in Usage by request_id.",
  },
  idempotency_key_reused: { status: 422, detail: "This Idempotency-Key was already used with a different request body." },
  batch_cancelled: { status: 409, detail: "The batch was cancelled before this request started; it was neither run nor charged." },
  batch_expired: {
    status: 409,
    detail: "The batch's completion window ended before this request started; it was neither run nor charged.",
  },
  body_too_large: { status: 413, detail: "Request body exceeds max_request_bytes." },
  token_bound_over_reserve: {
    status: 413,
    detail: "This paid request may use more tokens than reserve_tokens, the most one request may reserve; nothing was charged.",
  },
  invalid_json: { status: 422, detail: "Request body is not valid JSON." },
  invalid_utf8: { status: 422, detail: "Request body is not valid UTF-8." },
  unsupported_media_type: { status: 422, detail: "Content-Type must be application/json." },
  invalid_body: { status: 422, detail: "Request body does not match the contract." },
  invalid_query: { status: 422, detail: "Query parameters are invalid." },
  unknown_model: { status: 422, detail: "Unknown model." },
  context_rejected: { status: 422, detail: "The request is longer than the model's context." },
  rate_limited: { status: 429, detail: "Per-minute request limit of the organization reached." },
  key_rate_limited: { status: 429, detail: "Per-minute request limit of this API key reached." },
  preview_quota_org: { status: 429, detail: "Daily preview request limit of the organization reached; it resets at 00:00 UTC." },
  preview_quota_global: { status: 429, detail: "Daily preview capacity of the service reached; it resets at 00:00 UTC." },
  model_unavailable: { status: 502, detail: "The model service is unavailable; no credits were charged." },
  model_timeout: { status: 502, detail: "The model service timed out; no credits were charged." },
  model_invalid_response: { status: 502, detail: "The model service returned an invalid response; no credits were charged." },
  model_not_configured: { status: 503, detail: "No model service is configured." },
  model_not_ready: { status: 503, detail: "The model is not ready." },
  storage_unavailable: { status: 503, detail: "Storage is temporarily unavailable; retry later." },
  not_found: { status: 404, detail: "Not found." },
  route_not_found: { status: 404, detail: "No such endpoint." },
  method_not_allowed: { status: 405, detail: "Method not allowed." },
  bad_request: { status: 400, detail: "Bad request." },
  malformed_http: {
    status: 400,
    detail: "Malformed HTTP request: the request line, headers or body framing could not be parsed.",
  },
  invalid_url: { status: 400, detail: "The request URL is not valid: its percent-encoding cannot be decoded." },
  request_timeout: { status: 408, detail: "The request did not arrive in time." },
  uri_too_long: { status: 414, detail: "The request URL is too long." },
  headers_too_large: { status: 431, detail: "The request's headers are too large." },
  internal: { status: 500, detail: "Internal error." },
} as const satisfies Record<string, { status: number; detail: string }>;

/** The one code union: the catalogue's keys. */
export type ErrorCode = keyof typeof ERROR_CATALOGUE;

export function statusOf(code: ErrorCode): number {
  return ERROR_CATALOGUE[code].status;
}

/** One problem with one field of a request (the contract's FieldError has this shape). */
export interface FieldProblem {
  field: string;
  message: string;
}

export interface ServiceErrorExtra {
  /** Field-level problems of the request (bounded when sent). */
  errors?: FieldProblem[];
  retryAfterMs?: number;
  /** The Error's message when it differs from the detail sent (a CLI prints it); default: the detail, else the code. */
  message?: string;
}

/** The one error the service throws for a refusal or failure it can name; the HTTP layer answers it from the catalogue. */
export class ServiceError extends Error {
  readonly status: number;
  constructor(
    readonly code: ErrorCode,
    /** Overrides the catalogue's text when the situation has more to say. */
    readonly detail?: string,
    readonly extra: ServiceErrorExtra = {},
  ) {
    super(extra.message ?? detail ?? code);
    this.name = "ServiceError";
    this.status = statusOf(code);
  }
}
