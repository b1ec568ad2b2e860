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

/** GET /healthz: the process is up. GET /readyz: the database and the model services answer (503 otherwise). */
export function healthRoutes(app: FastifyInstance, deps: { store: Store; registry: ModelRegistry }) {
  app.get("/healthz", { schema: { hide: true } }, async () => ({ status: "ok" }));
  app.get("/readyz", { schema: { hide: true } }, async (_request, reply) => {
    const [database, models] = await Promise.all([
      check(() => deps.store.countOrganizations()),
      check(() => deps.registry.list()),
    ]);
    const ready = database === "ok" && models === "ok";
    return reply.code(ready ? 200 : 503).send({ status: ready ? "ready" : "not_ready", checks: { database, models } });
  });
}
