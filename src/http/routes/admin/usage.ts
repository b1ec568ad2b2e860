import { Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { AdminUsageSummary, AdminUsageSummaryQuery, OrgParams } from "../../../contract/admin.ts";
import { UsageListQuery, UsagePageJson, UsageRecordJson } from "../../../contract/usage.ts";
import { ServiceError } from "../../../domain/errors.ts";
import { usageSummary } from "../../../gateway/usage-summary.ts";
import { usageRecordJson } from "../../../presentation/usage-json.ts";
import { adminUsageSummaryJson } from "../../../presentation/usage-summary-json.ts";
import { summaryDays, usageListQuery } from "../../query.ts";
import { type AdminContext, errors, security } from "./admin-context.ts";

/** Usage: an organization's records (the filters of GET /v1/usage), one record, every organization's summary. */
export function adminUsageRoutes(app: FastifyInstance, { route, admin, store, nowMs }: AdminContext): void {
  app.get<{ Params: OrgParams; Querystring: UsageListQuery }>(
    "/admin/v1/organizations/:org/usage",
    {
      ...route,
      schema: {
        operationId: "adminListUsage",
        summary: "An organization's usage records, newest first (the filters of GET /v1/usage)",
        security,
        params: OrgParams,
        querystring: UsageListQuery,
        response: { 200: UsagePageJson, ...errors },
      },
    },
    async (request) => {
      const { page } = await admin(request).usage(request.params.org, usageListQuery(request.query));
      return { data: page.records.map(usageRecordJson), next_cursor: page.nextCursor };
    },
  );

  app.get<{ Params: OrgParams & { request_id: string } }>(
    "/admin/v1/organizations/:org/usage/:request_id",
    {
      ...route,
      schema: {
        operationId: "adminGetUsageRecord",
        summary: "One usage record of the organization by request_id",
        security,
        params: Type.Object(
          { org: OrgParams.properties.org, request_id: Type.String({ minLength: 1, maxLength: 200 }) },
          { additionalProperties: false },
        ),
        response: { 200: UsageRecordJson, ...errors },
      },
    },
    async (request) => {
      const { org, record } = await admin(request).usageRecord(request.params.org, request.params.request_id);
      if (!record)
        throw new ServiceError(
          "not_found",
          `No usage record with request_id ${JSON.stringify(request.params.request_id)} in organization ${org.id}.`,
        );
      return usageRecordJson(record);
    },
  );

  app.get<{ Querystring: AdminUsageSummaryQuery }>(
    "/admin/v1/usage/summary",
    {
      ...route,
      schema: {
        operationId: "adminGetUsageSummary",
        summary: "Every organization's usage per UTC day and per organization over the last N days",
        security,
        querystring: AdminUsageSummaryQuery,
        response: { 200: AdminUsageSummary, ...errors },
      },
    },
    async (request) => adminUsageSummaryJson(await usageSummary(store, { nowMs: nowMs(), days: summaryDays(request.query.days) })),
  );
}
