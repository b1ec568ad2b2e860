import type { FastifyInstance, onRequestHookHandler } from "fastify";
import type { Config } from "../../config.ts";
import {
  OrganizationResponse,
  USAGE_SUMMARY_DEFAULT_DAYS,
  USAGE_SUMMARY_MAX_DAYS,
  USAGE_SUMMARY_MAX_RECORDS,
  type UsageDay,
  UsageSummaryQuery,
  UsageSummaryResponse,
} from "../../contract/organization.ts";
import type { Clock } from "../../domain/clock.ts";
import { ServiceError } from "../../domain/errors.ts";
import { formatUsd } from "../../domain/money.ts";
import { msUntilUtcMidnight, utcDay } from "../../domain/utc-day.ts";
import type { Store, UsageQuery } from "../../store/store.ts";
import { authenticate, authOf } from "../auth.ts";
import { API_KEY_ERRORS, errorResponses } from "../error-responses.ts";

const DAY_MS = 86_400_000;
const PAGE = 200;

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
      const days = request.query.days === undefined ? USAGE_SUMMARY_DEFAULT_DAYS : Number(request.query.days);
      if (!Number.isInteger(days) || days < 1 || days > USAGE_SUMMARY_MAX_DAYS) {
        throw new ServiceError("invalid_query", undefined, {
          errors: [{ field: "query.days", message: `must be from 1 to ${USAGE_SUMMARY_MAX_DAYS}` }],
        });
      }
      const { org } = authOf(request);
      const now = clock.nowMs();
      const tomorrowMs = now + msUntilUtcMidnight(now);
      const fromMs = tomorrowMs - days * DAY_MS;

      const totals: { date: string; requests: number; input_tokens: number; output_tokens: number; cost: bigint }[] = [];
      for (let i = 0; i < days; i++) {
        const date = utcDay(fromMs + i * DAY_MS);
        totals.push({ date, requests: 0, input_tokens: 0, output_tokens: 0, cost: 0n });
      }
      const index = new Map(totals.map((t, i) => [t.date, i]));

      let seen = 0;
      let truncated = false;
      let cursor: string | null = null;
      do {
        const query: UsageQuery = { fromMs, toMs: tomorrowMs, limit: Math.min(PAGE, USAGE_SUMMARY_MAX_RECORDS - seen) };
        if (cursor) query.cursor = cursor;
        const page = await store.listUsage(org.id, query);
        for (const record of page.records) {
          const i = index.get(utcDay(record.createdAtMs));
          if (i === undefined) continue;
          const t = totals[i]!;
          t.requests += 1;
          t.input_tokens += record.inputTokens;
          t.output_tokens += record.outputTokens;
          t.cost += BigInt(record.costMicrousd);
        }
        seen += page.records.length;
        cursor = page.nextCursor;
        if (cursor && seen >= USAGE_SUMMARY_MAX_RECORDS) {
          truncated = true;
          break;
        }
      } while (cursor);

      const out: UsageDay[] = totals.map((t) => ({
        date: t.date,
        requests: t.requests,
        input_tokens: t.input_tokens,
        output_tokens: t.output_tokens,
        cost_microusd: Number(t.cost),
        cost_usd: formatUsd(t.cost),
      }));
      return { days: out, truncated };
    },
  );
}
