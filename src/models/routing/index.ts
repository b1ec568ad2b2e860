/**
 * Several deployments of one public model behind one ModelService (`createModelRouter`).
 *
 * - Balancing (balancer.ts): weighted power of two choices over the candidates with a free slot — two distinct
 *   deployments drawn ∝ weight, the lower outstanding/weight wins (the first drawn on a tie). A deployment at its
 *   maxConcurrency is skipped; when every candidate is full the call waits FIFO (wait-queue.ts) until its deadline,
 *   then fails "overloaded". Fallback deployments are candidates only when no primary is usable (healthy, or probing
 *   with no probe running) or the call has already tried every usable primary; a primary that is merely full does
 *   not let a fallback in.
 * - Failover (router.ts, outcomes.ts): one deadline per call; retryable kinds (unavailable, timeout, bad_status,
 *   overloaded, not_ready) go to another deployment. A call goes to each deployment at most once (so a model with
 *   one deployment is not retried), at most maxAttempts times, none past the deadline (the router's own timer
 *   enforces it even against a service that ignores its deadline). An attempt gets at most attemptTimeoutMs while
 *   another deployment is left to try, else all the time left. invalid_response, context_rejected and aborted end
 *   the call. Answers carry `route {deployment, attempts}`; the final error carries `route` too and is the last
 *   attempt's failure (or, with no attempt, why none could start).
 * - Health (health.ts, checks.ts): healthy → cooling_down after failureThreshold consecutive retryable failures
 *   (cooldowns double from cooldownInitialMs up to cooldownMaxMs) → probing (one call) → healthy or the next
 *   cooldown. Active checks (`listModels` every healthCheckIntervalMs after `start()`) end or start cooldowns. With
 *   nothing usable, `decide` fails at once: "unavailable", or "not_ready" when every deployment is a loading engine.
 */

export { isRetryable } from "./outcomes.ts";
export { createModelRouter } from "./router.ts";
export type {
  AttemptOutcome,
  Deployment,
  DeploymentHealth,
  DeploymentInput,
  HealthChange,
  HealthState,
  ModelRouter,
  RouterHealth,
  RouterObserver,
  RouterOptions,
  RouterTimers,
} from "./types.ts";
