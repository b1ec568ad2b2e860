import type { FastifyInstance } from "fastify";
import { ModelsResponse } from "../../contract/models.ts";
import type { ModelRegistry } from "../../gateway/model-registry.ts";
import type { Store } from "../../store/store.ts";
import { authenticate } from "../auth.ts";
import { API_KEY_ERRORS, errorResponses } from "../error-responses.ts";

export function modelRoutes(app: FastifyInstance, deps: { store: Store; registry: ModelRegistry }) {
  app.get(
    "/v1/models",
    {
      onRequest: authenticate(deps.store, { rejectPaused: false }),
      schema: {
        operationId: "listModels",
        summary: "List the models offered",
        security: [{ bearer: [] }],
        response: {
          200: ModelsResponse,
          // The key lookup needs the database: a store that does not answer is 503 storage_unavailable (error-handler.ts).
          ...errorResponses(...API_KEY_ERRORS, "model_unavailable", "model_not_configured", "storage_unavailable"),
        },
      },
    },
    async (): Promise<ModelsResponse> => ({ models: await deps.registry.list() }),
  );
}
