import type { FastifyInstance } from "fastify";
import type { ModelRegistry } from "../../models/registry.ts";
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
    return err instanceof Error ? (err as { detail?: string }).detail ?? err.message : String(err);
  } finally {
    clearTimeout(timer);
  }
}

/** Per model: "ok" (every deployment healthy), "degraded" (some), or "unavailable" (none takes calls). */
function modelStates(registry: ModelRegistry): Record<string, { state: "ok" | "degraded" | "unavailable"; healthy: number; deployments: number }> {
  const out: Record<string, { state: "ok" | "degraded" | "unavailable"; healthy: number; deployments: number }> = {};
  for (const m of registry.health()) {
    const healthy = m.deployments.filter((d) => d.state === "healthy").length;
    const state = !m.usable ? "unavailable" : healthy === m.deployments.length ? "ok" : "degraded";
    out[m.model] = { state, healthy, deployments: m.deployments.length };
  }
  return out;
}

/**
 * GET /healthz: the process is up. GET /readyz: the database answers and every model has a deployment that takes
 * calls (503 otherwise), with each model's state.
 */
export function healthRoutes(app: FastifyInstance, deps: { store: Store; registry: ModelRegistry }) {
  app.get("/healthz", { schema: { hide: true } }, async () => ({ status: "ok" }));
  app.get("/readyz", { schema: { hide: true } }, async (_request, reply) => {
    const [database, listed] = await Promise.all([check(() => deps.store.countOrganizations()), check(() => deps.registry.list())]);
    const models = modelStates(deps.registry);
    const down = Object.entries(models).filter(([, m]) => m.state === "unavailable").map(([name]) => name);
    const modelsCheck = listed !== "ok" ? listed : down.length > 0 ? `no healthy deployment of ${down.map((n) => JSON.stringify(n)).join(", ")}` : "ok";
    const ready = database === "ok" && modelsCheck === "ok";
    return reply.code(ready ? 200 : 503).send({ status: ready ? "ready" : "not_ready", checks: { database, models: modelsCheck }, models });
  });
}
