import { type ModelErrorKind, ModelServiceError } from "../model-service.ts";
import type { AttemptOutcome } from "./types.ts";

/** What an attempt's ending means for its deployment's passive health. */
export type HealthOutcome = "success" | "failure" | "neutral";

/**
 * Kinds that say "this deployment could not serve the call now" — the request itself was fine — so the call is
 * sent to another deployment and the failure counts against the deployment:
 * - `unavailable` (refused, reset, DNS, closed), `timeout`, `overloaded` (429/529, a full engine queue);
 * - `bad_status`: 5xx, and also the other unexpected statuses (401/403/404/3xx …): the adapter already maps the
 *   statuses about the request (400/413/422) to `context_rejected` or `refused`, so what is left is about the
 *   deployment (a wrong key, a model missing on that replica) and another deployment may well answer;
 * - `not_ready`: an in-process engine still loading (or failed to load); another deployment may be ready.
 * Not retried: `invalid_response` (the deployment answered; the answer may have been computed and the same request
 * may fail the same way anywhere), `context_rejected` (the request's fault), `refused` (a 400/422 about the request: the
 * same request would be refused anywhere, and a client must not be able to put deployments into cooldown with it),
 * `aborted` (the caller stopped).
 */
const RETRYABLE: ReadonlySet<ModelErrorKind> = new Set<ModelErrorKind>(["unavailable", "timeout", "bad_status", "overloaded", "not_ready"]);

export function isRetryable(err: unknown): boolean {
  return err instanceof ModelServiceError && RETRYABLE.has(err.kind);
}

/**
 * Retryable failures count against the deployment; a deployment that answered (an answer, `invalid_response`,
 * `context_rejected`, `refused`) proved it is reachable; the caller's abort and unexpected exceptions (bugs) say nothing.
 */
export function healthOutcome(err: unknown | null): HealthOutcome {
  if (err === null) return "success";
  if (!(err instanceof ModelServiceError)) return "neutral";
  if (RETRYABLE.has(err.kind)) return "failure";
  return err.kind === "aborted" ? "neutral" : "success";
}

/** The outcome reported to the observer; an exception that is not a ModelServiceError reports "invalid_response". */
export function attemptOutcome(err: unknown | null): AttemptOutcome {
  if (err === null) return "ok";
  return err instanceof ModelServiceError ? err.kind : "invalid_response";
}

/** A copy of `err` that carries the route (and says how many attempts failed, when more than one). */
export function withRoute(err: ModelServiceError, deployment: string | null, attempts: number): ModelServiceError {
  const message = attempts > 1 ? `${err.message} (after ${attempts} attempts)` : err.message;
  return err.with({ message, route: { deployment, attempts } });
}
