import { timingSafeEqual } from "node:crypto";
import type { FastifyInstance } from "fastify";
import type { Metrics } from "../../observability/metrics.ts";
import { sendError } from "../error-handler.ts";

function sameToken(presented: string, expected: string): boolean {
  const a = Buffer.from(presented);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/**
 * Prometheus metrics; open on the main port unless TDS_METRICS_TOKEN is set (the server does not start on a
 * non-loopback HOST without it: servingProblems in config.ts). Requests are counted per route and status.
 */
export function metricsRoutes(app: FastifyInstance, deps: { metrics: Metrics; token: string | null }) {
  app.addHook("onResponse", async (request, reply) => {
    deps.metrics.httpRequests.inc({
      method: request.method,
      route: request.routeOptions.url ?? "unmatched",
      status: String(reply.statusCode),
    });
  });
  app.get("/metrics", { schema: { hide: true } }, async (request, reply) => {
    if (deps.token !== null) {
      const presented = /^Bearer[ \t]+(\S+)$/i.exec(request.headers.authorization ?? "")?.[1];
      if (!presented || !sameToken(presented, deps.token))
        return sendError(reply, "invalid_api_key", { detail: "GET /metrics needs Authorization: Bearer <TDS_METRICS_TOKEN>." });
    }
    reply.type(deps.metrics.registry.contentType);
    return deps.metrics.registry.metrics();
  });
}
