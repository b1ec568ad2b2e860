import type { StoreFailureKind } from "../store-errors.ts";

/** Deadlock, serialization failure, lock not available: the transaction was rolled back and may simply be run again. */
const RETRYABLE = new Set(["40P01", "40001", "55P03"]);
/**
 * SQLSTATEs: connection (08), login refused (28: a password changed under the gateway), resources (53), operator
 * intervention (57: shutdown, statement timeout), system (58), the database gone (3D000), read-only standby.
 */
const UNAVAILABLE = /^(08|28|53|57|58)...$|^(3D000|25006|25P03)$/;
const NETWORK = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "EHOSTUNREACH", "ENETUNREACH", "ENOTFOUND", "EAI_AGAIN"]);
/** node-postgres errors that carry no code. */
const CONNECTION_LOST = /Connection terminated|connection error and is not queryable|timeout exceeded when trying to connect/;

/** PostgreSQL's and the network's storage failures as the port's kinds. */
export function postgresFailureKind(err: unknown): StoreFailureKind {
  if (typeof err !== "object" || err === null) return "other";
  const code = (err as { code?: unknown }).code;
  if (typeof code !== "string") return err instanceof Error && CONNECTION_LOST.test(err.message) ? "unavailable" : "other";
  if (RETRYABLE.has(code)) return "retryable";
  return UNAVAILABLE.test(code) || NETWORK.has(code) ? "unavailable" : "other";
}
