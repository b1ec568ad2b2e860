import { type ErrorCode, ServiceError } from "../domain/errors.ts";

/** Why an administrative operation failed, as the CLI tells it (exit codes, hints). */
export type AdminErrorReason = "not_found" | "name_taken" | "invalid" | "idempotency_key_reused" | "unavailable";

const CODES: Record<AdminErrorReason, ErrorCode> = {
  not_found: "not_found",
  name_taken: "name_taken",
  invalid: "invalid_body",
  idempotency_key_reused: "idempotency_key_reused",
  unavailable: "storage_unavailable",
};

/**
 * A failure of an administrative operation the caller can act on: a ServiceError (the admin API answers it from the
 * catalogue) whose `message` is the plain sentence the CLI prints.
 */
export class AdminError extends ServiceError {
  constructor(
    readonly reason: AdminErrorReason,
    message: string,
    /** For `invalid`: the request field at fault, such as `name` or `amount_usd`. */
    readonly field?: string,
    /** For `invalid`: the problem as a fragment that follows the field name ("must not be empty"); default: the message. */
    readonly fieldMessage?: string,
  ) {
    const problem = { field: field ?? "(body)", message: fieldMessage ?? message };
    super(
      CODES[reason],
      reason === "invalid" ? `Invalid request body: ${problem.field}: ${problem.message}` : reason === "unavailable" ? undefined : message,
      {
        message,
        ...(reason === "invalid"
          ? { errors: [problem] }
          : reason === "name_taken"
            ? { errors: [{ field: "name", message: "is already in use" }] }
            : {}),
      },
    );
    this.name = "AdminError";
  }
}
