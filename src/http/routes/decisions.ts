import type { FastifyInstance } from "fastify";
import { DecisionRequest, DecisionResponse } from "../../contract/decision.ts";
import { ErrorResponse } from "../../contract/errors.ts";
import type { DecisionPipeline } from "../../gateway/decision-pipeline.ts";
import type { Store, UsageSource } from "../../store/store.ts";
import { authenticate, authOf } from "../auth.ts";

const errorStatuses = [401, 402, 403, 409, 413, 422, 429, 502, 503] as const;

/** Playground requests identify themselves; they share every quota with the API. */
function sourceOf(header: string | string[] | undefined): UsageSource {
  return header === "playground" ? "playground" : "api";
}

export function decisionRoutes(app: FastifyInstance, deps: { store: Store; pipeline: DecisionPipeline; maxRequestBytes: number }) {
  app.post<{ Body: DecisionRequest }>(
    "/v1/systemone",
    {
      bodyLimit: deps.maxRequestBytes,
      onRequest: authenticate(deps.store, { rejectPaused: true }),
      schema: {
        summary: "Answer typed questions about one state",
        security: [{ bearer: [] }],
        body: DecisionRequest,
        response: { 200: DecisionResponse, ...Object.fromEntries(errorStatuses.map((s) => [s, ErrorResponse])) },
      },
    },
    async (request) => {
      const auth = authOf(request);
      return deps.pipeline.decide(
        {
          requestId: request.id,
          org: auth.org,
          keyId: auth.keyId,
          source: sourceOf(request.headers["x-tds-source"]),
          startedAt: request.startedAt,
        },
        request.body,
      );
    },
  );
}
