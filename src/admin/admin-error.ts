/** A failure of an administrative operation the caller can act on; the HTTP layer and the CLI map `code` to a status or an exit code. */
export type AdminErrorCode = "not_found" | "name_taken" | "invalid" | "idempotency_key_reused" | "unavailable";

export class AdminError extends Error {
  constructor(
    readonly code: AdminErrorCode,
    message: string,
    /** For `invalid`: the request field at fault, such as `name` or `amount_usd`. */
    readonly field?: string,
    /** For `invalid`: the problem as a fragment that follows the field name ("must not be empty"); default: the message. */
    readonly fieldMessage?: string,
  ) {
    super(message);
    this.name = "AdminError";
  }
}
