import type { FastifyBaseLogger, FastifyInstance } from "fastify";
import { ERROR_CATALOGUE, ServiceError } from "../../domain/errors.ts";
import { modelServiceFailure } from "../../gateway/model-failure.ts";
import { ModelLookupFailed, type ModelRegistry } from "../../gateway/model-registry.ts";
import { type EngineStatus, ModelServiceError } from "../../models/model-service.ts";
import type { Store, Writability, WriteCheck } from "../../store/store.ts";

const CHECK_TIMEOUT_MS = 2000;

/** What /readyz says of a database that does not answer; the driver's own words go to the log only. */
export const DATABASE_UNAVAILABLE = "database unavailable";

/** What /readyz says of the database in each state of its write check: fixed words, never the driver's. */
export const DATABASE_STATES: Readonly<Record<Writability, string>> = Object.freeze({
  ok: "ok",
  read_only: "database read-only",
  disk_full: "database disk full",
  cannot_write: "database cannot be written",
  unavailable: DATABASE_UNAVAILABLE,
});

/** What /readyz says when the models cannot be listed for a reason other than a model service's (our own words). */
export const MODELS_UNLISTED = "the models cannot be listed";

function withTimeout<T>(what: () => Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    what(),
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${CHECK_TIMEOUT_MS} ms`)), CHECK_TIMEOUT_MS);
    }),
  ]).finally(() => clearTimeout(timer));
}

function reasonOf(err: unknown): string {
  return err instanceof Error ? ((err as { detail?: string }).detail ?? err.message) : String(err);
}

/**
 * The store's write check (a read for a store without one), bounded in time; a failure to answer is `unavailable`.
 * The store runs it at most once a second whatever the number of probes (they share its result), unless one of its
 * calls failed since.
 */
async function writeCheck(store: Store): Promise<WriteCheck> {
  try {
    if (store.checkWritable) return await withTimeout(() => store.checkWritable!());
    await withTimeout(() => store.countOrganizations());
    return { state: "ok" };
  } catch (err) {
    return { state: "unavailable", reason: reasonOf(err) };
  }
}

/**
 * A check's result as /readyz shows it (anyone may call it, so never a driver's or model service's message, which can
 * name the database, its host or a model service's address), logging the real reason once each time the state
 * changes rather than at every probe. A state that its own component logs (`loggedElsewhere`), and the recovery
 * from it, go to debug only.
 */
function reporter<S extends string>(
  log: FastifyBaseLogger,
  messages: { failing: (state: S) => string; recovered: string; loggedElsewhere?: S },
): (state: S | "ok", reason: string | undefined) => void {
  let last: string = "ok";
  return (state, reason) => {
    if (state === last) return;
    const quiet = state === messages.loggedElsewhere || (state === "ok" && last === messages.loggedElsewhere);
    if (state === "ok") log[quiet ? "debug" : "info"]({ component: "readiness" }, messages.recovered);
    else log[quiet ? "debug" : "warn"]({ component: "readiness", reason }, messages.failing(state as S));
    last = state;
  };
}

const DATABASE_FAILING: Readonly<Record<Exclude<Writability, "ok">, string>> = {
  read_only: "readiness: the database does not take writes: it is read-only",
  disk_full: "readiness: the database does not take writes: its disk is full",
  cannot_write: "readiness: the database does not take writes",
  unavailable: "readiness: the database does not answer",
};

/**
 * The models check's words when the models cannot be listed: the gateway's fixed sentence (model-failure.ts, as a
 * client would get it), never the model service's own words nor the adapter's description.
 */
function listFailure(err: unknown): string {
  if (err instanceof ModelServiceError) return modelServiceFailure(err).detail ?? MODELS_UNLISTED;
  if (err instanceof ServiceError) return err.detail ?? ERROR_CATALOGUE[err.code].detail;
  return MODELS_UNLISTED;
}

/**
 * Whether a listing failure is an in-process engine that is not ready (loading, retrying, not installed): the engine
 * logs that state itself, so readiness does not repeat it.
 */
function isEngineState(err: unknown): boolean {
  const failure = err instanceof ModelLookupFailed ? err.failure : err;
  return failure instanceof ModelServiceError && failure.kind === "not_ready";
}

/** What the log is told of a listing failure: the model service's failure itself, with its words. */
function listReason(err: unknown): string {
  const failure = err instanceof ModelLookupFailed ? err.failure : err;
  if (failure instanceof ModelServiceError && failure.upstreamText !== undefined) return `${failure.message}: ${failure.upstreamText}`;
  return reasonOf(failure);
}

interface ModelState {
  state: "ok" | "degraded" | "unavailable";
  healthy: number;
  deployments: number;
  /** A model with an in-process deployment whose engine is not ready: what the engine is doing. */
  engine?: EngineJson;
}

interface EngineJson {
  state: EngineStatus["state"];
  detail?: string;
  progress?: number;
  last_error?: string;
  failed_attempts?: number;
  next_attempt_at?: string;
}

function engineJson(s: EngineStatus): EngineJson {
  return {
    state: s.state,
    ...(s.detail !== undefined ? { detail: s.detail } : {}),
    ...(s.progress !== undefined ? { progress: s.progress } : {}),
    ...(s.lastError !== undefined ? { last_error: s.lastError, failed_attempts: s.failedAttempts } : {}),
    ...(s.nextAttemptAtMs !== undefined ? { next_attempt_at: new Date(s.nextAttemptAtMs).toISOString() } : {}),
  };
}

/**
 * Per model: "ok" (every deployment healthy), "degraded" (some), or "unavailable" (none takes calls). An in-process
 * deployment takes calls only once its engine is ready (a model has at most one).
 */
function modelStates(registry: ModelRegistry): Record<string, ModelState> {
  const out: Record<string, ModelState> = {};
  for (const m of registry.health()) {
    const engine = m.deployments.find((d) => d.engine)?.engine;
    const takesCalls = (d: { engine?: EngineStatus }) => d.engine === undefined || d.engine.state === "ready";
    const healthy = m.deployments.filter((d) => d.state === "healthy" && takesCalls(d)).length;
    const usable = m.usable && m.deployments.some((d) => d.state !== "cooling_down" && takesCalls(d));
    const state = !usable ? "unavailable" : healthy === m.deployments.length ? "ok" : "degraded";
    const notReady = engine && engine.state !== "ready";
    out[m.model] = { state, healthy, deployments: m.deployments.length, ...(notReady ? { engine: engineJson(engine) } : {}) };
  }
  return out;
}

/**
 * GET /healthz: the process is up. GET /readyz: the database takes writes (the store's write check) and
 * every model has a deployment that takes calls (503 otherwise, naming the failing part in fixed words), with each
 * model's state (and its in-process engine's while that is not ready).
 */
export function healthRoutes(app: FastifyInstance, deps: { store: Store; registry: ModelRegistry }) {
  const reportDatabase = reporter<Exclude<Writability, "ok">>(app.log, {
    failing: (state) => DATABASE_FAILING[state],
    recovered: "the database takes writes again",
  });
  const reportList = reporter<"failing" | "engine_not_ready">(app.log, {
    failing: () => "readiness: the models cannot be listed",
    recovered: "the models can be listed again",
    loggedElsewhere: "engine_not_ready",
  });
  app.get("/healthz", { schema: { hide: true } }, async () => ({ status: "ok" }));
  app.get("/readyz", { schema: { hide: true } }, async (_request, reply) => {
    const [written, listed] = await Promise.all([
      writeCheck(deps.store),
      withTimeout(() => deps.registry.list()).then(
        () => null,
        (err: unknown) => err,
      ),
    ]);
    reportDatabase(written.state, written.reason);
    if (listed === null) reportList("ok", undefined);
    else reportList(isEngineState(listed) ? "engine_not_ready" : "failing", listReason(listed));
    const database = DATABASE_STATES[written.state];
    const models = modelStates(deps.registry);
    const down = Object.entries(models)
      .filter(([, m]) => m.state === "unavailable")
      .map(([name]) => name);
    const modelsCheck =
      listed !== null
        ? listFailure(listed)
        : down.length > 0
          ? `no healthy deployment of ${down.map((n) => JSON.stringify(n)).join(", ")}`
          : "ok";
    const ready = database === "ok" && modelsCheck === "ok";
    return reply.code(ready ? 200 : 503).send({ status: ready ? "ready" : "not_ready", checks: { database, models: modelsCheck }, models });
  });
}
