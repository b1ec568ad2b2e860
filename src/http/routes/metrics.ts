import type { FastifyInstance } from "fastify";
import type { Metrics } from "../../observability/metrics.ts";
import { sendError } from "../error-handler.ts";
import { tokenMatcher } from "../token-match.ts";

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
  const matches = deps.token === null ? null : tokenMatcher(deps.token);
  app.get("/metrics", { schema: { hide: true } }, async (request, reply) => {
    if (matches !== null) {
      const presented = /^Bearer[ \t]+(\S+)$/i.exec(request.headers.authorization ?? "")?.[1];
      if (!presented || !matches(presented))
        return sendError(reply, "invalid_api_key", { detail: "GET /metrics needs Authorization: Bearer <TDS_METRICS_TOKEN>." });
    }
    reply.type(deps.metrics.registry.contentType);
    return deps.metrics.registry.metrics();
  });
}
