import type { FastifyInstance, onRequestHookHandler } from "fastify";
import type { Config } from "../../config.ts";
import { OrganizationResponse, UsageSummaryQuery, UsageSummaryResponse } from "../../contract/organization.ts";
import type { Clock } from "../../domain/clock.ts";
import { previewUse } from "../../gateway/preview-use.ts";
import { usageSummary } from "../../gateway/usage-summary.ts";
import { creditsJson, previewQuotaJson } from "../../presentation/organization-json.ts";
import { usageSummaryJson } from "../../presentation/usage-summary-json.ts";
import type { Store } from "../../store/store.ts";
import { authenticate, authOf } from "../auth.ts";
import { API_KEY_ERRORS, errorResponses } from "../error-responses.ts";
import { summaryDays } from "../query.ts";

export interface OrganizationRouteDeps {
  config: Pick<Config, "serviceMode" | "limits">;
  store: Store;
  clock: Clock;
  /** The organization's read limit (runs after authentication). */
  rateLimit: onRequestHookHandler;
}

/**
 * Read endpoints for the console: the key's organization (mode, credits or today's preview quota,
 * rate limit) and its usage per UTC day. Scoped to the key's organization; a paused organization
 * can still read them.
 */
export function organizationRoutes(app: FastifyInstance, deps: OrganizationRouteDeps) {
  const auth = [authenticate(deps.store, { rejectPaused: false }), deps.rateLimit];
  const { config, store, clock } = deps;

  app.get(
    "/v1/organization",
    {
      onRequest: auth,
      schema: {
        operationId: "getOrganization",
        summary: "The key's organization: service mode, credits or today's preview quota, and rate limit",
        security: [{ bearer: [] }],
        response: { 200: OrganizationResponse, ...errorResponses(...API_KEY_ERRORS) },
      },
    },
    async (request): Promise<OrganizationResponse> => {
      const { org } = authOf(request);
      const paid = config.serviceMode === "paid";
      return {
        id: org.id,
        name: org.name,
        service_mode: config.serviceMode,
        paused: org.paused,
        balance: paid ? creditsJson(await store.getBalance(org.id)) : null,
        preview: paid
          ? null
          : previewQuotaJson(await previewUse(store, { orgId: org.id, limit: config.limits.previewRequestLimit, nowMs: clock.nowMs() })),
        rate_limit: { requests_per_minute: config.limits.requestsPerMinute },
      };
    },
  );

  app.get<{ Querystring: UsageSummaryQuery }>(
    "/v1/usage/summary",
    {
      onRequest: auth,
      schema: {
        operationId: "getUsageSummary",
        summary: "Requests, tokens and cost per UTC day for the last N days (today included, oldest first)",
        security: [{ bearer: [] }],
        querystring: UsageSummaryQuery,
        response: { 200: UsageSummaryResponse, ...errorResponses(...API_KEY_ERRORS, "invalid_query") },
      },
    },
    async (request): Promise<UsageSummaryResponse> => {
      const days = summaryDays(request.query.days);
      return usageSummaryJson(await usageSummary(store, { nowMs: clock.nowMs(), days, orgId: authOf(request).org.id }));
    },
  );
}
