import { ErrorResponse } from "../contract/errors.ts";
import { type ErrorCode, statusOf } from "../domain/errors.ts";

/** A route's documented error responses, from the catalogue codes it can answer with (one schema per status). */
export function errorResponses(...codes: ErrorCode[]): Record<number, typeof ErrorResponse> {
  return Object.fromEntries(codes.map((code) => [statusOf(code), ErrorResponse]));
}

/** What every route that takes an API key can answer before its own work. */
export const API_KEY_ERRORS: ErrorCode[] = ["missing_api_key", "invalid_api_key", "revoked_api_key"];
