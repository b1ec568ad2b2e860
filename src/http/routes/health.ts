import type { FastifyInstance } from "fastify";
import { IN_PROCESS } from "../../config-models.ts";
import type { ModelRegistry } from "../../gateway/model-registry.ts";
import { type EngineStatus, engineStatusOf } from "../../models/llama/engine-status.ts";
import type { ModelService } from "../../models/model-service.ts";
import type { Store } from "../../store/store.ts";

const CHECK_TIMEOUT_MS = 2000;

async function check(what: () => Promise<unknown>): Promise<string> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      what(),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer within ${CHECK_TIMEOUT_MS} ms`)), CHECK_TIMEOUT_MS);
      }),
    ]);
    return "ok";
  } catch (err) {
    return err instanceof Error ? ((err as { detail?: string }).detail ?? err.message) : String(err);
  } finally {
    clearTimeout(timer);
  }
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

/** Each model's engine status, by model (a model has at most one in-process deployment). */
function engineStatuses(engines: ReadonlyMap<string, ModelService>): Map<string, EngineStatus> {
  const byModel = new Map<string, EngineStatus>();
  for (const [key, service] of engines) {
    const status = engineStatusOf(service);
    if (status) byModel.set(key.replace(/#\d+$/, ""), status);
  }
  return byModel;
}

/**
 * Per model: "ok" (every deployment healthy), "degraded" (some), or "unavailable" (none takes calls). An in-process
 * deployment takes calls only once its engine is ready.
 */
function modelStates(registry: ModelRegistry, engines: ReadonlyMap<string, ModelService>): Record<string, ModelState> {
  const statuses = engineStatuses(engines);
  const out: Record<string, ModelState> = {};
  for (const m of registry.health()) {
    const engine = statuses.get(m.model);
    const takesCalls = (d: { name: string }) => d.name !== IN_PROCESS || engine === undefined || engine.state === "ready";
    const healthy = m.deployments.filter((d) => d.state === "healthy" && takesCalls(d)).length;
    const usable = m.usable && m.deployments.some((d) => d.state !== "cooling_down" && takesCalls(d));
    const state = !usable ? "unavailable" : healthy === m.deployments.length ? "ok" : "degraded";
    const notReady = engine && engine.state !== "ready";
    out[m.model] = { state, healthy, deployments: m.deployments.length, ...(notReady ? { engine: engineJson(engine) } : {}) };
  }
  return out;
}

/**
 * GET /healthz: the process is up. GET /readyz: the database answers and every model has a deployment that takes
 * calls (503 otherwise), with each model's state (and its in-process engine's while that is not ready).
 */
export function healthRoutes(
  app: FastifyInstance,
  deps: { store: Store; registry: ModelRegistry; engines?: ReadonlyMap<string, ModelService> | undefined },
) {
  app.get("/healthz", { schema: { hide: true } }, async () => ({ status: "ok" }));
  app.get("/readyz", { schema: { hide: true } }, async (_request, reply) => {
    const [database, listed] = await Promise.all([check(() => deps.store.countOrganizations()), check(() => deps.registry.list())]);
    const models = modelStates(deps.registry, deps.engines ?? new Map());
    const down = Object.entries(models)
      .filter(([, m]) => m.state === "unavailable")
      .map(([name]) => name);
    const modelsCheck =
      listed !== "ok" ? listed : down.length > 0 ? `no healthy deployment of ${down.map((n) => JSON.stringify(n)).join(", ")}` : "ok";
    const ready = database === "ok" && modelsCheck === "ok";
    return reply.code(ready ? 200 : 503).send({ status: ready ? "ready" : "not_ready", checks: { database, models: modelsCheck }, models });
  });
}
