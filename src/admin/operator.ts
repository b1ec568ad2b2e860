import { userInfo } from "node:os";

/** The longest operator name recorded (the admin API's x-tds-client takes 50 characters, "cli:" included). */
export const MAX_OPERATOR_LENGTH = 40;

/**
 * Who runs this process, for the audit log of changes made on this machine (the `tds` CLI, the first start's
 * bootstrap): the OS user's name, or `uid N` where the system has no name for it. Printable ASCII only (anything
 * else becomes ?), at most MAX_OPERATOR_LENGTH characters.
 */
export function osOperator(): string {
  let name = "";
  try {
    name = userInfo().username;
  } catch {
    // No passwd entry for this uid (a container run with --user 1234, say).
  }
  if (name === "") name = typeof process.getuid === "function" ? `uid ${process.getuid()}` : "unknown";
  return name.replace(/[^\x20-\x7e]/g, "?").slice(0, MAX_OPERATOR_LENGTH);
}

/** Why an operator name given on the command line (--actor) cannot be recorded, or null. */
export function operatorProblem(name: string): string | null {
  if (!/^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/.test(name) || name.length > MAX_OPERATOR_LENGTH)
    return `must be 1 to ${MAX_OPERATOR_LENGTH} printable ASCII characters, not starting or ending with a space`;
  return null;
}
