import { Type } from "@sinclair/typebox";
import type { FastifyInstance, onRequestHookHandler } from "fastify";
import { UsageListQuery, UsagePageJson, UsageRecordJson } from "../../contract/usage.ts";
import { ServiceError } from "../../domain/errors.ts";
import { usageRecordJson } from "../../presentation/usage-json.ts";
import type { Store } from "../../store/store.ts";
import { authenticate, authOf } from "../auth.ts";
import { API_KEY_ERRORS, errorResponses } from "../error-responses.ts";
import { usageListQuery } from "../query.ts";

/** The organization's usage history; every lookup is scoped to the key's organization. */
export function usageRoutes(app: FastifyInstance, deps: { store: Store; rateLimit: onRequestHookHandler }) {
  const auth = [authenticate(deps.store, { rejectPaused: false }), deps.rateLimit];

  app.get<{ Params: { request_id: string } }>(
    "/v1/usage/:request_id",
    {
      onRequest: auth,
      schema: {
        operationId: "getUsageRecord",
        summary: "One usage record by request_id (404 for another organization's request)",
        security: [{ bearer: [] }],
        params: Type.Object({ request_id: Type.String({ minLength: 1, maxLength: 200 }) }),
        response: { 200: UsageRecordJson, ...errorResponses(...API_KEY_ERRORS, "not_found") },
      },
    },
    async (request) => {
      const record = await deps.store.getUsage(authOf(request).org.id, request.params.request_id);
      if (!record)
        throw new ServiceError(
          "not_found",
          `No usage record with request_id ${JSON.stringify(request.params.request_id)} in this organization.`,
        );
      return usageRecordJson(record);
    },
  );

  app.get<{ Querystring: UsageListQuery }>(
    "/v1/usage",
    {
      onRequest: auth,
      schema: {
        operationId: "listUsage",
        summary: "The organization's usage records, newest first, with cursor paging and filters",
        security: [{ bearer: [] }],
        querystring: UsageListQuery,
        response: { 200: UsagePageJson, ...errorResponses(...API_KEY_ERRORS, "invalid_query") },
      },
    },
    async (request) => {
      const page = await deps.store.listUsage(authOf(request).org.id, usageListQuery(request.query));
      return { data: page.records.map(usageRecordJson), next_cursor: page.nextCursor };
    },
  );
}
