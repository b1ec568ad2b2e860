import type { FastifyInstance } from "fastify";
import { adminOrganizationJson } from "../../../admin/admin-json.ts";
import {
  AdminOrganization,
  AdminOrganizationPage,
  AdminPageQuery,
  CreateOrganizationBody,
  OrgParams,
  UpdateOrganizationBody,
} from "../../../contract/admin.ts";
import { errorResponses } from "../../error-responses.ts";
import { pageQuery } from "../../query.ts";
import { type AdminContext, AdminHeaders, errors, security } from "./admin-context.ts";

/** Organizations: list, create, show, pause and resume. */
export function adminOrganizationRoutes(app: FastifyInstance, { route, admin }: AdminContext): void {
  app.get<{ Querystring: AdminPageQuery }>(
    "/admin/v1/organizations",
    {
      ...route,
      schema: {
        operationId: "adminListOrganizations",
        summary: "Organizations, oldest first, with credits, today's preview use and key counts",
        security,
        querystring: AdminPageQuery,
        response: { 200: AdminOrganizationPage, ...errors },
      },
    },
    async (request) => {
      const a = admin(request);
      const page = await a.listOrganizations(pageQuery(request.query));
      const data = await Promise.all(page.organizations.map(async (org) => adminOrganizationJson(await a.status(org))));
      return { data, next_cursor: page.nextCursor };
    },
  );

  app.post<{ Body: CreateOrganizationBody; Headers: { "x-tds-client"?: string } }>(
    "/admin/v1/organizations",
    {
      ...route,
      schema: {
        operationId: "adminCreateOrganization",
        summary: "Create an organization (names are unique)",
        security,
        headers: AdminHeaders,
        body: CreateOrganizationBody,
        response: { 201: AdminOrganization, ...errorResponses("name_taken"), ...errors },
      },
    },
    async (request, reply) => {
      const a = admin(request);
      const org = await a.createOrganization(request.body.name);
      return reply.code(201).send(adminOrganizationJson(await a.status(org)));
    },
  );

  app.get<{ Params: OrgParams }>(
    "/admin/v1/organizations/:org",
    {
      ...route,
      schema: {
        operationId: "adminGetOrganization",
        summary: "One organization (id or name) with credits, today's preview use and key counts",
        security,
        params: OrgParams,
        response: { 200: AdminOrganization, ...errors },
      },
    },
    async (request) => adminOrganizationJson(await admin(request).organization(request.params.org)),
  );

  app.patch<{ Params: OrgParams; Body: UpdateOrganizationBody; Headers: { "x-tds-client"?: string } }>(
    "/admin/v1/organizations/:org",
    {
      ...route,
      schema: {
        operationId: "adminUpdateOrganization",
        summary: "Pause or resume an organization",
        security,
        params: OrgParams,
        headers: AdminHeaders,
        body: UpdateOrganizationBody,
        response: { 200: AdminOrganization, ...errors },
      },
    },
    async (request) => {
      const a = admin(request);
      const { org } = await a.setPaused(request.params.org, request.body.paused);
      return adminOrganizationJson(await a.status(org));
    },
  );
}
