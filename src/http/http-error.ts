import type { FieldError } from "../contract/errors.ts";
import type { ErrorCode } from "./error-catalogue.ts";

/** An error raised by the HTTP layer itself (auth, parsing); carries a catalogue code. */
export class HttpError extends Error {
  constructor(
    readonly code: ErrorCode,
    readonly detail?: string,
    readonly errors?: FieldError[],
  ) {
    super(detail ?? code);
    this.name = "HttpError";
  }
}
