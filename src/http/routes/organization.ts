import type { FastifyInstance, onRequestHookHandler } from "fastify";
import type { Config } from "../../config.ts";
import { OrganizationResponse, UsageSummaryQuery, UsageSummaryResponse } from "../../contract/organization.ts";
import type { Clock } from "../../domain/clock.ts";
import { formatUsd } from "../../domain/money.ts";
import { msUntilUtcMidnight, utcDay } from "../../domain/utc-day.ts";
import { summaryDays, usageSummary } from "../../gateway/usage-summary.ts";
import { usageSummaryJson } from "../../presentation/usage-summary-json.ts";
import type { Store } from "../../store/store.ts";
import { authenticate, authOf } from "../auth.ts";
import { API_KEY_ERRORS, errorResponses } from "../error-responses.ts";

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
        summary: "The key's organization: service mode, credits or today's preview quota, and rate limit",
        security: [{ bearer: [] }],
        response: { 200: OrganizationResponse, ...errorResponses(...API_KEY_ERRORS) },
      },
    },
    async (request): Promise<OrganizationResponse> => {
      const { org } = authOf(request);
      const now = clock.nowMs();
      const paid = config.serviceMode === "paid";
      let balance: OrganizationResponse["balance"] = null;
      let preview: OrganizationResponse["preview"] = null;
      if (paid) {
        const b = await store.getBalance(org.id);
        balance = {
          available_microusd: b.available,
          available_usd: formatUsd(b.available),
          reserved_microusd: b.reserved,
          reserved_usd: formatUsd(b.reserved),
          spent_microusd: b.spent,
          spent_usd: formatUsd(b.spent),
        };
      } else {
        const day = utcDay(now);
        const used = (await store.previewUsage(org.id, day)).org;
        const limit = config.limits.previewRequestLimit;
        preview = {
          date: day,
          used,
          limit,
          remaining: Math.max(0, limit - used),
          resets_at: new Date(now + msUntilUtcMidnight(now)).toISOString(),
        };
      }
      return {
        id: org.id,
        name: org.name,
        service_mode: config.serviceMode,
        paused: org.paused,
        balance,
        preview,
        rate_limit: { requests_per_minute: config.limits.requestsPerMinute },
      };
    },
  );

  app.get<{ Querystring: UsageSummaryQuery }>(
    "/v1/usage/summary",
    {
      onRequest: auth,
      schema: {
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
