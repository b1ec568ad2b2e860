import type { FastifyInstance } from "fastify";
import { auditEntryJson } from "../../../admin/admin-json.ts";
import { AuditPageJson, AuditQuery } from "../../../contract/admin.ts";
import { pageQuery } from "../../query.ts";
import { type AdminContext, errors, security } from "./admin-context.ts";

/** The audit log: every administrative change, newest first. */
export function adminAuditRoutes(app: FastifyInstance, { route, admin }: AdminContext): void {
  app.get<{ Querystring: AuditQuery }>(
    "/admin/v1/audit",
    {
      ...route,
      schema: {
        operationId: "adminListAudit",
        summary: "Every administrative change, newest first: time, action, target and source",
        security,
        querystring: AuditQuery,
        response: { 200: AuditPageJson, ...errors },
      },
    },
    async (request) => {
      const { org } = request.query;
      const page = await admin(request).audit({ ...pageQuery(request.query), ...(org ? { org } : {}) });
      return { data: page.entries.map(auditEntryJson), next_cursor: page.nextCursor };
    },
  );
}
