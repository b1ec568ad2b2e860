import { type Static, Type } from "@sinclair/typebox";
import { ERROR_CATALOGUE, type ErrorCode } from "../domain/errors.ts";

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
