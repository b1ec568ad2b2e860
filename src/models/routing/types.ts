import type { EngineStatus, ModelErrorKind, ModelService, ModelServiceError } from "../model-service.ts";

/** One way to get answers for a public model: a model service and the name that service knows the model by. */
export interface Deployment {
  /** What usage records, metrics and logs name, e.g. "gpu-a". Unique within a router. */
  name: string;
  /** An HTTP adapter or an in-process engine. May be shared with other deployments and routers. */
  service: ModelService;
  /** The model name that service knows; the router puts it in `call.model` (and looks for it in the service's list). */
  upstreamName: string;
  /** Share of the traffic, relative to the other candidates; a finite number > 0 (default 1). */
  weight: number;
  /** Calls sent to this deployment at once at most; null = no limit (default null). */
  maxConcurrency: number | null;
  /** Used only while no primary (non-fallback) deployment is usable (default false). */
  fallback: boolean;
}

/** A Deployment as given to createModelRouter: weight, maxConcurrency and fallback take their defaults. */
export type DeploymentInput = Pick<Deployment, "name" | "service" | "upstreamName"> &
  Partial<Pick<Deployment, "weight" | "maxConcurrency" | "fallback">>;

/**
 * A deployment's health:
 * - `healthy`: takes calls; counts consecutive retryable failures.
 * - `cooling_down`: takes no calls until its cooldown ends (after `failureThreshold` consecutive retryable
 *   failures, a failed probe, or a failed active check).
 * - `probing`: the cooldown is over; exactly ONE call (the probe) may go through at a time. Its success (or a
 *   successful active check) makes the deployment healthy; its retryable failure starts the next, longer cooldown.
 */
export type HealthState = "healthy" | "cooling_down" | "probing";

/** A deployment's health state change, besides its new state. */
export interface HealthChange {
  from: HealthState;
  /** The failure (of a call or of an active check) that started the current cooldown; null when healthy. */
  failure: ModelServiceError | null;
}

/** What an attempt ended with: "ok", or the kind of its failure (an unexpected exception reports "invalid_response"). */
export type AttemptOutcome = "ok" | ModelErrorKind;

/** Notified synchronously; exceptions it throws are swallowed. Feed metrics and logs from it. */
export interface RouterObserver {
  /** One attempt of a `decide` call on a deployment ended, after `ms` milliseconds. */
  attempt(deployment: string, outcome: AttemptOutcome, ms: number): void;
  /**
   * A deployment's health state changed. `change.from` tells a deployment that stopped taking calls (from `healthy`)
   * from one that merely moved between a cooldown and a probe; `change.failure` is the failure behind the cooldown
   * (null once healthy).
   */
  healthChanged(deployment: string, state: HealthState, change: HealthChange): void;
  /** One active health check (`listModels`) of a deployment ended. */
  check?(deployment: string, outcome: AttemptOutcome, ms: number): void;
}

/** Traces the attempts of `decide` calls (src/observability/spans.ts implements it); absent while tracing is off. */
export interface AttemptTracer {
  /** The span of one attempt on `deployment`, under the caller's current span; null when the call is not traced. */
  start(model: string, deployment: string, attempt: number): AttemptSpan | null;
}

export interface AttemptSpan {
  /** Runs the attempt's service call with this span current (an HTTP adapter sends its trace context on). */
  within<T>(call: () => T): T;
  /** `error`: the attempt's failure, null when it answered. */
  end(outcome: AttemptOutcome, error: unknown): void;
}

/** Timer functions (injectable for tests). Handles of the periodic health checks are `unref()`'d when they can be. */
export interface RouterTimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export interface RouterOptions {
  /** Attempts per `decide` call at most, first try included (default 3). */
  maxAttempts?: number;
  /**
   * How long one attempt may run while another deployment is left to try; the last possible attempt (no untried
   * usable deployment, or maxAttempts reached) always gets all the time left. null (default) = all the time left.
   */
  attemptTimeoutMs?: number | null;
  /** Consecutive retryable failures of a healthy deployment that start a cooldown (default 3). */
  failureThreshold?: number;
  /** The first cooldown; each following one without a recovery in between doubles (default 1000 ms). */
  cooldownInitialMs?: number;
  /** The longest cooldown (default 30 000 ms): a deployment is probed again at the latest this long after its last failure. */
  cooldownMaxMs?: number;
  /** Period of the active health checks (`listModels` on every deployment) once `start()` was called; null = none (default 10 000 ms). */
  healthCheckIntervalMs?: number | null;
  /** Deadline of one active check, and the cap of the deadline of the router's own `listModels` calls to its deployments (default 2000 ms). */
  checkTimeoutMs?: number;
  /** How long the router's `listModels` answer is reused (default 5000 ms). */
  listCacheMs?: number;
  /** Whether `close()` closes the deployments' services (default false: they may be shared with other routers). */
  ownsServices?: boolean;
  observer?: RouterObserver;
  /** Spans of the attempts (OpenTelemetry tracing). */
  tracer?: AttemptTracer;
  /** A monotonic clock in milliseconds (default `performance.now`). */
  nowMs?: () => number;
  /** Uniform numbers in [0, 1) for the balancer (default `Math.random`). */
  random?: () => number;
  timers?: RouterTimers;
}

export interface DeploymentHealth {
  name: string;
  state: HealthState;
  /** `decide` calls running on it now (attempts whose service call has not settled yet). */
  outstanding: number;
  fallback: boolean;
  /** Milliseconds until a cooling-down deployment may be probed again; null in the other states. */
  retryInMs: number | null;
  /** What its service's in-process engine is doing (the service's `status()`), when it runs one. */
  engine?: EngineStatus;
}

export interface RouterHealth {
  /** Whether some deployment would take a call (healthy, or probing with no probe running); when false, `decide` fails at once. */
  usable: boolean;
  /** Calls waiting in the FIFO queue for a deployment below its maxConcurrency. */
  waiting: number;
  deployments: DeploymentHealth[];
}

/** The ModelService of one public model, served by several deployments. */
export interface ModelRouter extends ModelService {
  /** The public model name (the one entry of `listModels`). */
  readonly model: string;
  health(): RouterHealth;
  /** Starts the periodic active health checks (the first round at once); no-op when already started, closed, or disabled. */
  start(): void;
  /** Runs one round of active health checks now (all deployments) and resolves when it is over. */
  checkNow(): Promise<void>;
}
