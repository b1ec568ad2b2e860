import type { FastifyInstance } from "fastify";

declare module "fastify" {
  interface FastifyRequest {
    /** performance.now() when the request arrived. */
    startedAt: number;
  }
}

/**
 * Every response carries the request id as x-service-request-id (the spec's header) and as
 * x-typesafe-request-id (the header the official SDKs read).
 */
export function installRequestContext(app: FastifyInstance): void {
  app.decorateRequest("startedAt", 0);
  app.decorateRequest("auth", null);
  app.addHook("onRequest", async (request, reply) => {
    request.startedAt = performance.now();
    reply.header("x-service-request-id", request.id);
    reply.header("x-typesafe-request-id", request.id);
  });
}
