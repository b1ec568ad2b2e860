import type { FastifyInstance } from "fastify";
import { ErrorResponse } from "../../contract/errors.ts";
import { ModelsResponse } from "../../contract/models.ts";
import type { ModelRegistry } from "../../models/registry.ts";
import type { Store } from "../../store/store.ts";
import { authenticate } from "../auth.ts";

export function modelRoutes(app: FastifyInstance, deps: { store: Store; registry: ModelRegistry }) {
  app.get(
    "/v1/models",
    {
      onRequest: authenticate(deps.store, { rejectPaused: false }),
      schema: {
        summary: "List the models offered",
        security: [{ bearer: [] }],
        response: { 200: ModelsResponse, 401: ErrorResponse, 502: ErrorResponse, 503: ErrorResponse },
      },
    },
    async (): Promise<ModelsResponse> => ({ models: await deps.registry.list() }),
  );
}
