import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyRequest } from "fastify";
import { adminOrganizationJson, apiKeyJson, auditEntryJson, balanceJson } from "../../admin/admin-json.ts";
import { StoreAdministration } from "../../admin/store-administration.ts";
import type { Config } from "../../config.ts";
import {
  ADMIN_PAGE_DEFAULT,
  ADMIN_PAGE_MAX,
  AdminApiKey,
  AdminApiKeyList,
  AdminBalance,
  AdminOrganization,
  AdminOrganizationPage,
  AdminPageQuery,
  AdminUsageSummary,
  AdminUsageSummaryQuery,
  AuditPageJson,
  AuditQuery,
  CreatedApiKey,
  CreateKeyBody,
  CreateOrganizationBody,
  GrantCreditsBody,
  KeyParams,
  OrgParams,
  UpdateOrganizationBody,
} from "../../contract/admin.ts";
import { UsageListQuery, UsagePageJson, UsageRecordJson } from "../../contract/usage.ts";
import type { Clock } from "../../domain/clock.ts";
import { ServiceError } from "../../domain/errors.ts";
import { parseUsd } from "../../domain/money.ts";
import { summaryDays, usageSummary } from "../../gateway/usage-summary.ts";
import { usageRecordJson } from "../../presentation/usage-json.ts";
import { adminUsageSummaryJson } from "../../presentation/usage-summary-json.ts";
import type { Store } from "../../store/store.ts";
import { authenticateAdmin } from "../admin-auth.ts";
import { errorResponses } from "../error-responses.ts";
import { usageQuery } from "./usage.ts";

const ADMIN_BODY_LIMIT = 16 * 1024;
const security = [{ admin: [] }];
const errors = errorResponses(
  "missing_admin_token",
  "invalid_admin_token",
  "admin_auth_throttled",
  "not_found",
  "invalid_body",
  "invalid_query",
);

const AdminHeaders = Type.Object({
  "x-tds-client": Type.Optional(
    Type.String({ maxLength: 50, description: "Recorded in the audit log as the client, such as console or cli" }),
  ),
});
const GrantHeaders = Type.Object({
  "x-tds-client": Type.Optional(Type.String({ maxLength: 50 })),
  "idempotency-key": Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 255,
      pattern: "^[\\x21-\\x7E]+$",
      description:
        "The same key with the same grant within 24 h answers the first grant's balance (Idempotent-Replayed: true) and grants nothing again",
    }),
  ),
});

export interface AdminRouteDeps {
  config: Pick<Config, "adminToken" | "limits">;
  store: Store;
  clock: Clock;
}

function pageLimit(text: string | undefined): number {
  const limit = text === undefined ? ADMIN_PAGE_DEFAULT : Number(text);
  if (limit < 1 || limit > ADMIN_PAGE_MAX)
    throw new ServiceError("invalid_query", undefined, {
      errors: [{ field: "query.limit", message: `must be from 1 to ${ADMIN_PAGE_MAX}` }],
    });
  return limit;
}

/**
 * The admin API under /admin/v1, for `Authorization: Bearer <admin token>` only; registered only when an admin token
 * is configured (otherwise every path here is an unknown route: 404). Every change is recorded in the audit log with
 * the caller's address and `x-tds-client`.
 */
export function adminRoutes(app: FastifyInstance, deps: AdminRouteDeps): void {
  const token = deps.config.adminToken;
  if (token === null) return;
  const onRequest = authenticateAdmin(token);
  const admin = (request: FastifyRequest) => {
    const client = request.headers["x-tds-client"];
    return new StoreAdministration({
      store: deps.store,
      previewRequestLimit: deps.config.limits.previewRequestLimit,
      nowMs: () => deps.clock.nowMs(),
      actor: { source: "http", client: typeof client === "string" && client !== "" ? client : null, remoteAddress: request.ip ?? null },
    });
  };
  const route = { onRequest, bodyLimit: ADMIN_BODY_LIMIT };

  app.get<{ Querystring: AdminPageQuery }>(
    "/admin/v1/organizations",
    {
      ...route,
      schema: {
        summary: "Organizations, oldest first, with credits, today's preview use and key counts",
        security,
        querystring: AdminPageQuery,
        response: { 200: AdminOrganizationPage, ...errors },
      },
    },
    async (request) => {
      const a = admin(request);
      const page = await a.listOrganizations({
        limit: pageLimit(request.query.limit),
        ...(request.query.cursor ? { cursor: request.query.cursor } : {}),
      });
      const data = await Promise.all(page.organizations.map(async (org) => adminOrganizationJson(await a.status(org))));
      return { data, next_cursor: page.nextCursor };
    },
  );

  app.post<{ Body: CreateOrganizationBody; Headers: { "x-tds-client"?: string } }>(
    "/admin/v1/organizations",
    {
      ...route,
      schema: {
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

  app.post<{ Params: OrgParams; Body: CreateKeyBody; Headers: { "x-tds-client"?: string } }>(
    "/admin/v1/organizations/:org/keys",
    {
      ...route,
      schema: {
        summary: "Create an API key; the key is in this answer only",
        security,
        params: OrgParams,
        headers: AdminHeaders,
        body: CreateKeyBody,
        response: { 201: CreatedApiKey, ...errors },
      },
    },
    async (request, reply) => {
      const { key, raw } = await admin(request).createKey(request.params.org, request.body.name ?? null);
      reply.header("cache-control", "no-store");
      return reply
        .code(201)
        .send({ id: key.id, org_id: key.orgId, name: key.name, key: raw, created_at: new Date(key.createdAtMs).toISOString() });
    },
  );

  app.get<{ Params: OrgParams }>(
    "/admin/v1/organizations/:org/keys",
    {
      ...route,
      schema: {
        summary: "An organization's API keys: ids, names, created and revoked times",
        security,
        params: OrgParams,
        response: { 200: AdminApiKeyList, ...errors },
      },
    },
    async (request) => ({ data: (await admin(request).listKeys(request.params.org)).keys.map(apiKeyJson) }),
  );

  app.get<{ Params: KeyParams }>(
    "/admin/v1/keys/:key_id",
    {
      ...route,
      schema: {
        summary: "One API key by id: its organization, name, created and revoked times",
        security,
        params: KeyParams,
        response: { 200: AdminApiKey, ...errors },
      },
    },
    async (request) => apiKeyJson((await admin(request).key(request.params.key_id)).key),
  );

  app.delete<{ Params: KeyParams; Headers: { "x-tds-client"?: string } }>(
    "/admin/v1/keys/:key_id",
    {
      ...route,
      schema: {
        summary: "Revoke an API key (its next request gets 401, on every instance)",
        security,
        params: KeyParams,
        headers: AdminHeaders,
        response: { 204: Type.Null(), ...errors },
      },
    },
    async (request, reply) => {
      await admin(request).revokeKey(request.params.key_id);
      return reply.code(204).send();
    },
  );

  app.post<{ Params: OrgParams; Body: GrantCreditsBody; Headers: { "x-tds-client"?: string; "idempotency-key"?: string } }>(
    "/admin/v1/organizations/:org/credits",
    {
      ...route,
      schema: {
        summary: "Grant credits; answers the new balance. With Idempotency-Key, a retried grant is applied once",

        security,
        params: OrgParams,
        headers: GrantHeaders,
        body: GrantCreditsBody,
        response: { 200: AdminBalance, ...errors },
      },
    },
    async (request, reply) => {
      const text = request.body.amount_usd;
      const amount = text === text.trim() ? parseUsd(text) : null;
      const problem =
        amount === null ? "must be a decimal USD amount such as 12.50 (at most 6 decimals)" : amount <= 0n ? "must be more than 0" : null;
      if (problem !== null)
        throw new ServiceError("invalid_body", `Invalid request body: amount_usd: ${problem}`, {
          errors: [{ field: "amount_usd", message: problem }],
        });
      const key = request.headers["idempotency-key"];
      const { org, balance, replayed } = await admin(request).grantCredits(request.params.org, {
        amountMicrousd: Number(amount),
        ...(request.body.note !== undefined ? { note: request.body.note } : {}),
        ...(key !== undefined ? { idempotencyKey: key } : {}),
      });
      if (replayed) reply.header("idempotent-replayed", "true");
      return balanceJson(org.id, balance);
    },
  );

  app.get<{ Params: OrgParams; Querystring: UsageListQuery }>(
    "/admin/v1/organizations/:org/usage",
    {
      ...route,
      schema: {
        summary: "An organization's usage records, newest first (the filters of GET /v1/usage)",
        security,
        params: OrgParams,
        querystring: UsageListQuery,
        response: { 200: UsagePageJson, ...errors },
      },
    },
    async (request) => {
      const { page } = await admin(request).usage(request.params.org, usageQuery(request.query));
      return { data: page.records.map(usageRecordJson), next_cursor: page.nextCursor };
    },
  );

  app.get<{ Params: OrgParams & { request_id: string } }>(
    "/admin/v1/organizations/:org/usage/:request_id",
    {
      ...route,
      schema: {
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
        summary: "Every organization's usage per UTC day and per organization over the last N days",
        security,
        querystring: AdminUsageSummaryQuery,
        response: { 200: AdminUsageSummary, ...errors },
      },
    },
    async (request) =>
      adminUsageSummaryJson(await usageSummary(deps.store, { nowMs: deps.clock.nowMs(), days: summaryDays(request.query.days) })),
  );

  app.get<{ Querystring: AuditQuery }>(
    "/admin/v1/audit",
    {
      ...route,
      schema: {
        summary: "Every administrative change, newest first: time, action, target and source",
        security,
        querystring: AuditQuery,
        response: { 200: AuditPageJson, ...errors },
      },
    },
    async (request) => {
      const q = request.query;
      const page = await admin(request).audit({
        limit: pageLimit(q.limit),
        ...(q.org ? { org: q.org } : {}),
        ...(q.cursor ? { cursor: q.cursor } : {}),
      });
      return { data: page.entries.map(auditEntryJson), next_cursor: page.nextCursor };
    },
  );
}
