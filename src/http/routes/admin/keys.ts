import { Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { apiKeyJson } from "../../../admin/admin-json.ts";
import { AdminApiKey, AdminApiKeyList, CreatedApiKey, CreateKeyBody, KeyParams, OrgParams } from "../../../contract/admin.ts";
import { type AdminContext, AdminHeaders, errors, security } from "./admin-context.ts";

/** API keys: create (the key is answered once), list, show, revoke. */
export function adminKeyRoutes(app: FastifyInstance, { route, admin }: AdminContext): void {
  app.post<{ Params: OrgParams; Body: CreateKeyBody; Headers: { "x-tds-client"?: string } }>(
    "/admin/v1/organizations/:org/keys",
    {
      ...route,
      schema: {
        operationId: "adminCreateKey",
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
        operationId: "adminListKeys",
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
        operationId: "adminGetKey",
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
        operationId: "adminRevokeKey",
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
}
