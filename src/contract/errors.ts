import { type Static, Type } from "@sinclair/typebox";
import { ERROR_CATALOGUE, type ErrorCode, type ServiceError } from "../domain/errors.ts";
import { MAX_FIELD_ERRORS } from "./validation.ts";

export const FieldError = Type.Object(
  {
    field: Type.String({ description: "Path into the request body, e.g. questions.q1.criteria" }),
    message: Type.String(),
  },
  { additionalProperties: false },
);

export const ErrorResponse = Type.Object(
  {
    detail: Type.String(),
    errors: Type.Optional(Type.Array(FieldError, { description: "Field-level validation errors (at most 50)" })),
  },
  { additionalProperties: false, title: "ErrorResponse" },
);

export type FieldError = Static<typeof FieldError>;
export type ErrorResponse = Static<typeof ErrorResponse>;

/** The body of an error answer: `detail` (the catalogue's for `code` unless given); field errors are added by the caller. */
export function errorResponse(code: ErrorCode, detail: string = ERROR_CATALOGUE[code].detail): ErrorResponse {
  return { detail };
}

export interface ErrorBodyOptions {
  detail?: string;
  errors?: FieldError[];
  /** How many problems were found when `errors` lists only some of them (default: errors.length). */
  totalErrors?: number;
}

/** `Invalid request body: <first problem> (and N more)`: the detail of field errors given without one. */
export function validationDetail(errors: FieldError[], total = errors.length): string {
  const first = errors[0];
  const summary = first ? `${first.field}: ${first.message}` : "";
  return total > 1 ? `Invalid request body: ${summary} (and ${total - 1} more)` : `Invalid request body: ${summary}`;
}

/** The body of an error answer: `{detail, errors?}`, errors[] bounded to MAX_FIELD_ERRORS and the detail saying so. */
export function errorBody(code: ErrorCode, options: ErrorBodyOptions = {}): ErrorResponse {
  const body = errorResponse(code, options.detail ?? ERROR_CATALOGUE[code].detail);
  if (options.errors && options.errors.length > 0) {
    const total = Math.max(options.totalErrors ?? 0, options.errors.length);
    body.errors = options.errors.slice(0, MAX_FIELD_ERRORS);
    if (total > MAX_FIELD_ERRORS) body.detail = `${body.detail} (showing the first ${MAX_FIELD_ERRORS} of ${total} problems)`;
  }
  return body;
}

/** The status and body the API answers a ServiceError with. */
export function serviceErrorAnswer(error: ServiceError): { status: number; body: ErrorResponse; retryAfterMs?: number } {
  const errors = error.extra.errors;
  const detail = error.detail ?? (errors && errors.length > 0 ? validationDetail(errors) : undefined);
  const body = errorBody(error.code, { ...(detail !== undefined ? { detail } : {}), ...(errors ? { errors } : {}) });
  return { status: error.status, body, ...(error.extra.retryAfterMs !== undefined ? { retryAfterMs: error.extra.retryAfterMs } : {}) };
}
