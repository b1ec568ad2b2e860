import { ROUTER_DEFAULTS } from "../../config-defaults.ts";
import {
  type CallOptions,
  callFor,
  type ModelAnswerSet,
  type ModelCall,
  ModelServiceError,
  type TokenBound,
  type UpstreamModel,
} from "../model-service.ts";
import { nonNegativeNumber, positiveInteger, positiveNumber } from "../option-checks.ts";
import { pickPowerOfTwo } from "./balancer.ts";
import { ActiveChecks, type ListResult, listDeployment } from "./checks.ts";
import { smallestContext } from "./context.ts";
import { DeploymentRuntime, normalizeDeployments } from "./deployment.ts";
import type { HealthTicket } from "./health.ts";
import { attemptOutcome, healthOutcome, isRetryable, withRoute } from "./outcomes.ts";
import type {
  DeploymentInput,
  HealthChange,
  HealthState,
  ModelRouter,
  RouterHealth,
  RouterObserver,
  RouterOptions,
  RouterTimers,
} from "./types.ts";
import { AcquireFailure, type AcquireReason, type Grant, MAX_TIMER_MS, WaitQueue } from "./wait-queue.ts";

const realTimers: RouterTimers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (handle) => clearTimeout(handle as NodeJS.Timeout | undefined),
};

interface CallRoute {
  /** Deployments this call has been sent to: a call goes to each deployment at most once. */
  tried: Set<DeploymentRuntime>;
}

/** A call's hold on one deployment, from the choice until its service call settles. */
interface Lease {
  deployment: DeploymentRuntime;
  ticket: HealthTicket;
}

type AttemptResult = { ok: true; answer: ModelAnswerSet } | { ok: false; error: unknown };

/**
 * A ModelService for one public model over several deployments: weighted power-of-two-choices balancing,
 * per-deployment concurrency limits with a FIFO wait, failover of retryable failures within the call's one
 * deadline, passive (cooldown / probe) and active (`listModels`) health, fallback deployments.
 */
export function createModelRouter(model: string, deployments: readonly DeploymentInput[], options: RouterOptions = {}): ModelRouter {
  if (typeof model !== "string" || model === "") throw new TypeError("model must be a non-empty string");
  const specs = normalizeDeployments(model, deployments);
  const maxAttempts = positiveInteger("maxAttempts", options.maxAttempts ?? ROUTER_DEFAULTS.maxAttempts);
  const failureThreshold = positiveInteger("failureThreshold", options.failureThreshold ?? ROUTER_DEFAULTS.failureThreshold);
  const cooldownInitialMs = positiveNumber("cooldownInitialMs", options.cooldownInitialMs ?? ROUTER_DEFAULTS.cooldownInitialMs);
  const cooldownMaxMs = positiveNumber(
    "cooldownMaxMs",
    options.cooldownMaxMs ?? Math.max(ROUTER_DEFAULTS.cooldownMaxMs, cooldownInitialMs),
  );
  if (cooldownMaxMs < cooldownInitialMs) throw new TypeError("cooldownMaxMs must be >= cooldownInitialMs");
  const intervalOption =
    options.healthCheckIntervalMs === undefined ? ROUTER_DEFAULTS.healthCheckIntervalMs : options.healthCheckIntervalMs;
  const healthCheckIntervalMs = intervalOption === null ? null : positiveNumber("healthCheckIntervalMs", intervalOption);
  const attemptTimeoutMs = options.attemptTimeoutMs == null ? null : positiveNumber("attemptTimeoutMs", options.attemptTimeoutMs);
  const checkTimeoutMs = positiveNumber("checkTimeoutMs", options.checkTimeoutMs ?? ROUTER_DEFAULTS.checkTimeoutMs);
  const listCacheMs = nonNegativeNumber("listCacheMs", options.listCacheMs ?? ROUTER_DEFAULTS.listCacheMs);
  const ownsServices = options.ownsServices ?? false;
  const nowMs = options.nowMs ?? (() => performance.now());
  const random = options.random ?? Math.random;
  const timers = options.timers ?? realTimers;
  const observer = safeObserver(options.observer);
  const tracer = options.tracer ?? null;

  const queue = new WaitQueue<Lease>(timers, nowMs);
  // A deployment that came back may serve waiters; one that went down may leave them none. Deferred: a state may
  // change while a call is being routed (a cooldown that ends is noticed lazily), and must not re-enter the choice.
  let drainScheduled = false;
  const onHealthChange = (d: DeploymentRuntime, state: HealthState, change: HealthChange) => {
    observer.healthChanged(d.name, state, change);
    if (drainScheduled || queue.length === 0) return;
    drainScheduled = true;
    queueMicrotask(() => {
      drainScheduled = false;
      queue.drain();
    });
  };
  const all = specs.map((spec) => new DeploymentRuntime(spec, { failureThreshold, cooldownInitialMs, cooldownMaxMs }, onHealthChange));
  const checks = new ActiveChecks(all, {
    intervalMs: healthCheckIntervalMs,
    checkTimeoutMs,
    timers,
    nowMs,
    onResult: (d, result) => {
      observer.check(d.name, result.ok ? "ok" : (result.error?.kind ?? "invalid_response"), result.ms);
      remember(d, result);
      d.health.check(result.ok, nowMs(), result.error ?? null);
    },
  });
  let closed = false;
  let listCache: { atMs: number; models: UpstreamModel[] } | null = null;
  let listing: Promise<UpstreamModel[]> | null = null;

  // ---------------------------------------------------------------------------------------------
  // Choice

  /**
   * Where a call may go now: the usable primaries it has not tried, or — when it has tried every usable primary or
   * none is usable — the usable fallbacks it has not tried. "Usable" is healthy, or probing with no probe running;
   * a deployment at its maxConcurrency is usable but busy (and a busy primary keeps the fallbacks out).
   */
  function untried(route: CallRoute, now: number): DeploymentRuntime[] | "down" | "exhausted" {
    const primaries = all.filter((d) => !d.fallback && d.health.open(now));
    const fresh = primaries.filter((d) => !route.tried.has(d));
    if (fresh.length > 0) return fresh;
    const fallbacks = all.filter((d) => d.fallback && d.health.open(now));
    const freshFallbacks = fallbacks.filter((d) => !route.tried.has(d));
    if (freshFallbacks.length > 0) return freshFallbacks;
    return primaries.length + fallbacks.length === 0 ? "down" : "exhausted";
  }

  /** A deployment with a free slot that this call may go to, or why there is none ("busy": all are full). */
  function choose(route: CallRoute): DeploymentRuntime | "busy" | "down" | "exhausted" {
    const pool = untried(route, nowMs());
    if (typeof pool === "string") return pool;
    const free = pool.filter((d) => d.hasSlot());
    if (free.length === 0) return "busy";
    return pickPowerOfTwo(free, random);
  }

  function lease(d: DeploymentRuntime): Lease {
    d.outstanding++;
    return { deployment: d, ticket: d.health.begin(nowMs()) };
  }

  function release(l: Lease): void {
    l.deployment.outstanding--;
    queue.drain();
  }

  function acquire(route: CallRoute, deadlineMs: number, signal: AbortSignal | undefined): Promise<Lease> {
    if (closed) return Promise.reject(new AcquireFailure("closed"));
    const first = choose(route);
    if (first === "down" || first === "exhausted") return Promise.reject(new AcquireFailure(first));
    // FIFO: a new call never overtakes waiting ones.
    if (first !== "busy" && queue.length === 0) return Promise.resolve(lease(first));
    const tryGrant = (): Grant<Lease> => {
      if (closed) return { fail: "closed" };
      const c = choose(route);
      return c === "busy" ? null : c === "down" || c === "exhausted" ? { fail: c } : { lease: lease(c) };
    };
    return queue.wait(tryGrant, deadlineMs, signal);
  }

  // ---------------------------------------------------------------------------------------------
  // Errors

  function noHealthyDeployment(): ModelServiceError {
    const now = nowMs();
    const failures = all.map((d) => d.health.lastFailure);
    // Every deployment is an engine that is still loading (or failed to load): say so, as one engine would (503).
    if (failures.every((f) => f?.kind === "not_ready")) return (failures[0] as ModelServiceError).with({});
    const waits = all.map((d) => d.health.retryInMs(now)).filter((ms): ms is number => ms !== null);
    const probing = all.some((d) => d.health.state(now) === "probing" && d.health.probeInFlight);
    const next =
      waits.length > 0
        ? `the next is tried again in ${(Math.min(...waits) / 1000).toFixed(1)} s`
        : probing
          ? "a deployment is being probed"
          : "none is ready";
    const last = failures.find((f) => f !== null);
    const cause = last ? `; last failure: ${last.message}` : "";
    // The router's own words (the note) may reach the client; the last failure's only the log.
    const note = `no healthy deployment of model ${JSON.stringify(model)}; ${next}`;
    return new ModelServiceError("unavailable", `${note}${cause}`, undefined, {
      note,
      ...(last?.upstreamText !== undefined ? { upstreamText: last.upstreamText } : {}),
    });
  }

  function acquireError(reason: AcquireReason, timeoutMs: number): ModelServiceError {
    switch (reason) {
      case "down":
        return noHealthyDeployment();
      case "busy": {
        const why = `every deployment of model ${JSON.stringify(model)} is at its concurrency limit; no slot became free within the deadline (${timeoutMs} ms)`;
        return new ModelServiceError("overloaded", why, undefined, { note: why });
      }
      case "aborted":
        return new ModelServiceError("aborted", "model call aborted");
      case "closed":
        return new ModelServiceError("unavailable", `the router of model ${JSON.stringify(model)} is closed`);
      case "exhausted": // only after a failed attempt, whose error decide throws instead
        return new ModelServiceError("unavailable", `no deployment of model ${JSON.stringify(model)} is left to try`);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // One attempt

  /**
   * Runs the call on the leased deployment with `remainingMs`. Ends at the first of: the service's answer or
   * failure, the deadline (the router's own timer: "timeout", even if the service ignores its deadline), or the
   * caller's abort ("aborted", at once). The service gets the same deadline and the caller's own signal (no
   * AbortController per attempt: the service stops itself at that deadline). The slot is held until the service
   * call itself settles.
   */
  function attempt(l: Lease, call: ModelCall, remainingMs: number, signal: AbortSignal | undefined, n: number): Promise<AttemptResult> {
    const d = l.deployment;
    const started = nowMs();
    const span = tracer === null ? null : tracer.start(model, d.name, n);
    return new Promise<AttemptResult>((resolve) => {
      let decided = false;
      const finish = (error: unknown | null, result: AttemptResult) => {
        if (decided) return;
        decided = true;
        timers.clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        const now = nowMs();
        const outcome = attemptOutcome(error);
        observer.attempt(d.name, outcome, now - started);
        span?.end(outcome, error);
        d.health.end(l.ticket, healthOutcome(error), now, error instanceof ModelServiceError ? error : null);
        resolve(result);
      };
      const timer = timers.setTimeout(
        () => {
          const error = new ModelServiceError("timeout", `model service did not answer within ${Math.round(remainingMs)} ms`);
          finish(error, { ok: false, error });
        },
        Math.min(Math.ceil(remainingMs), MAX_TIMER_MS),
      );
      const onAbort = () => {
        const error = new ModelServiceError("aborted", "model call aborted");
        finish(error, { ok: false, error });
      };
      signal?.addEventListener("abort", onAbort, { once: true });

      let running: Promise<ModelAnswerSet>;
      try {
        const serviceCall = () =>
          d.spec.service.decide(
            callFor(call, d.spec.upstreamName),
            signal ? { timeoutMs: remainingMs, signal } : { timeoutMs: remainingMs },
          );
        running = Promise.resolve(span === null ? serviceCall() : span.within(serviceCall));
      } catch (err) {
        running = Promise.reject(err);
      }
      running.then(
        (answer) => {
          finish(null, { ok: true, answer });
          release(l);
        },
        (error: unknown) => {
          finish(error, { ok: false, error });
          release(l);
        },
      );
    });
  }

  // ---------------------------------------------------------------------------------------------
  // The port

  async function decide(call: ModelCall, callOptions: CallOptions): Promise<ModelAnswerSet> {
    const { timeoutMs, signal } = callOptions;
    const startedMs = nowMs();
    const deadlineMs = startedMs + timeoutMs;
    const route: CallRoute = { tried: new Set() };
    let lastError: ModelServiceError | null = null;
    let attempts = 0;
    let last: DeploymentRuntime | null = null;
    const routed = (err: ModelServiceError) => withRoute(err, last?.name ?? null, attempts);

    if (signal?.aborted) throw routed(new ModelServiceError("aborted", "model call aborted before it started"));
    if (!(timeoutMs > 0)) throw routed(new ModelServiceError("timeout", `model call deadline already passed (timeoutMs ${timeoutMs})`));

    for (;;) {
      let l: Lease;
      try {
        l = await acquire(route, deadlineMs, signal);
      } catch (err) {
        // After a failed attempt, the call ends with that failure (unless the caller aborted).
        if (err instanceof AcquireFailure)
          throw routed(lastError !== null && err.reason !== "aborted" ? lastError : acquireError(err.reason, timeoutMs));
        throw err;
      }
      const remainingMs = deadlineMs - nowMs();
      if (!(remainingMs > 0) || signal?.aborted) {
        // Granted at the very end of the wait: do not start an attempt past the deadline.
        l.deployment.health.end(l.ticket, "neutral", nowMs());
        release(l);
        throw routed(signal?.aborted ? acquireError("aborted", timeoutMs) : (lastError ?? acquireError("busy", timeoutMs)));
      }
      attempts++;
      route.tried.add(l.deployment);
      last = l.deployment;
      const lastPossible = attempts >= maxAttempts || typeof untried(route, nowMs()) === "string";
      const result = await attempt(
        l,
        call,
        attemptTimeoutMs === null || lastPossible ? remainingMs : Math.min(remainingMs, attemptTimeoutMs),
        signal,
        attempts,
      );
      // latencyMs: the whole routed call (slot wait and failed attempts included), so that the gateway's own share
      // (gateway_latency_ms = its time minus this) is not inflated by failovers.
      if (result.ok) {
        const { answers, usage } = result.answer;
        return { answers, usage, latencyMs: nowMs() - startedMs, route: { deployment: l.deployment.name, attempts } };
      }
      const error = result.error;
      if (!(error instanceof ModelServiceError)) throw error; // a bug in a service: not retried, not wrapped
      lastError = error;
      if (!isRetryable(error) || attempts >= maxAttempts || !(deadlineMs - nowMs() > 0)) throw routed(error);
      if (signal?.aborted) throw routed(new ModelServiceError("aborted", "model call aborted"));
    }
  }

  function remember(d: DeploymentRuntime, result: ListResult): void {
    if (result.ok && result.list) d.listed = result.list.find((m) => m?.name === d.spec.upstreamName) ?? null;
  }

  /**
   * Lists the deployments that are not cooling down (deadline: the caller's, at most checkTimeoutMs), then merges
   * the most recent entry of every deployment — so a replica that is down right now still keeps the published limits
   * within what it enforces. Fails when no deployment answered with a list that includes its upstreamName.
   */
  async function refreshList(timeoutMs: number): Promise<UpstreamModel[]> {
    const now = nowMs();
    const targets = all.filter((d) => d.health.state(now) !== "cooling_down");
    if (targets.length === 0) throw noHealthyDeployment();
    const results = await Promise.all(targets.map((d) => listDeployment(d, Math.min(timeoutMs, checkTimeoutMs), timers, nowMs)));
    let answered = false;
    const errors: ModelServiceError[] = [];
    for (let i = 0; i < targets.length; i++) {
      const d = targets[i] as DeploymentRuntime;
      const r = results[i] as ListResult;
      remember(d, r);
      if (r.ok && d.listed) answered = true;
      if (r.error) errors.push(r.error);
    }
    if (!answered) {
      if (errors.length === targets.length && errors.every((e) => e.kind === "not_ready")) throw (errors[0] as ModelServiceError).with({});
      const lastError = errors[errors.length - 1];
      const cause = lastError === undefined ? `no deployment lists it` : `last failure: ${lastError.message}`;
      throw new ModelServiceError(
        "unavailable",
        `no deployment of model ${JSON.stringify(model)} answered its model list; ${cause}`,
        undefined,
        lastError?.upstreamText !== undefined ? { upstreamText: lastError.upstreamText } : {},
      );
    }
    const context = smallestContext(all.map((d) => d.listed?.context));
    const models: UpstreamModel[] = [context ? { name: model, context } : { name: model }];
    listCache = { atMs: nowMs(), models };
    return models;
  }

  const router: ModelRouter = {
    model,

    decide,

    async listModels(callOptions: CallOptions): Promise<UpstreamModel[]> {
      if (closed) throw acquireError("closed", callOptions.timeoutMs);
      if (listCache && nowMs() - listCache.atMs < listCacheMs) return copyList(listCache.models);
      // One refresh at a time; concurrent callers share it (with the first caller's deadline, not its signal).
      listing ??= refreshList(callOptions.timeoutMs).finally(() => {
        listing = null;
      });
      return copyList(await listing);
    },

    /**
     * The largest bound over all deployments (any of them may end up serving the call after a failover), when every
     * deployment can count; otherwise null, and the gateway uses its byte-based bound, which holds for any tokenizer.
     */
    async tokenBound(call: ModelCall): Promise<TokenBound | null> {
      if (!all.every((d) => typeof d.spec.service.tokenBound === "function")) return null;
      const bounds = await Promise.all(
        all.map((d) =>
          Promise.resolve()
            .then(() => d.spec.service.tokenBound!(callFor(call, d.spec.upstreamName)))
            .catch(() => null),
        ),
      );
      let input = 0;
      let output = 0;
      for (const b of bounds) {
        if (!b) return null;
        input = Math.max(input, b.input);
        output = Math.max(output, b.output);
      }
      return { input, output };
    },

    health(): RouterHealth {
      const now = nowMs();
      return {
        usable: !closed && all.some((d) => d.health.open(now)),
        waiting: queue.length,
        deployments: all.map((d) => {
          const engine = d.spec.service.status?.();
          return {
            name: d.name,
            state: d.health.state(now),
            outstanding: d.outstanding,
            fallback: d.fallback,
            retryInMs: d.health.retryInMs(now),
            ...(engine ? { engine } : {}),
          };
        }),
      };
    },

    start(): void {
      if (!closed) checks.start();
    },

    checkNow(): Promise<void> {
      return closed ? Promise.resolve() : checks.round();
    },

    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      checks.stop();
      queue.rejectAll("closed");
      if (ownsServices) {
        const services = [...new Set(all.map((d) => d.spec.service))];
        await Promise.all(services.map((s) => s.close()));
      }
    },
  };
  return router;
}

function copyList(models: UpstreamModel[]): UpstreamModel[] {
  return models.map((m) => (m.context ? { name: m.name, context: { ...m.context } } : { name: m.name }));
}

function safeObserver(o: RouterObserver | undefined): Required<RouterObserver> {
  const guard =
    <A extends unknown[]>(fn: ((...args: A) => void) | undefined) =>
    (...args: A) => {
      if (!fn) return;
      try {
        fn.apply(o, args);
      } catch {
        // An observer must not break routing.
      }
    };
  return { attempt: guard(o?.attempt), healthChanged: guard(o?.healthChanged), check: guard(o?.check) };
}
