import { type ErrorCode, type FieldProblem, ServiceError } from "../domain/errors.ts";

/**
 * Why an administrative operation failed, as the CLI tells it (exit codes, hints). `conflict`: the state of what it
 * names forbids it (a revoked key cannot be changed or rotated), 409.
 */
export type AdminErrorReason = "not_found" | "name_taken" | "conflict" | "invalid" | "idempotency_key_reused" | "unavailable";

const CODES: Record<AdminErrorReason, ErrorCode> = {
  not_found: "not_found",
  name_taken: "name_taken",
  // The catalogue's 409 for a change of a key its state refuses; the detail says which.
  conflict: "key_not_active",
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
    /** For `invalid`: further problems, after the first (`field`). */
    more: FieldProblem[] = [],
  ) {
    const problem = { field: field ?? "(body)", message: fieldMessage ?? message };
    const and = more.length === 0 ? "" : ` (and ${more.length} more)`;
    super(
      CODES[reason],
      reason === "invalid"
        ? `Invalid request body: ${problem.field}: ${problem.message}${and}`
        : reason === "unavailable"
          ? undefined
          : message,
      {
        message,
        ...(reason === "invalid"
          ? { errors: [problem, ...more] }
          : reason === "name_taken"
            ? { errors: [{ field: "name", message: "is already in use" }] }
            : {}),
      },
    );
    this.name = "AdminError";
  }

  /** An `invalid` error of one or more fields; its message lists each (`field: problem`). */
  static fields(problems: FieldProblem[]): AdminError {
    const [first, ...more] = problems;
    if (first === undefined) throw new RangeError("no problems");
    return new AdminError("invalid", problems.map((p) => `${p.field}: ${p.message}`).join("; "), first.field, first.message, more);
  }
}
