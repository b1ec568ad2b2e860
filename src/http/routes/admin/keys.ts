import { Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { apiKeyJson, createdApiKeyJson, rotatedApiKeyJson } from "../../../admin/admin-json.ts";
import {
  AdminApiKey,
  AdminApiKeyList,
  CreatedApiKey,
  CreateKeyBody,
  KeyParams,
  OrgParams,
  RotatedApiKey,
  RotateKeyBody,
  UpdateKeyBody,
} from "../../../contract/admin.ts";
import { errorResponses } from "../../error-responses.ts";
import { type AdminContext, AdminHeaders, errors, security } from "./admin-context.ts";

/** API keys: create (the key is answered once), list, show, change, rotate, revoke. */
export function adminKeyRoutes(app: FastifyInstance, { route, admin }: AdminContext): void {
  app.post<{ Params: OrgParams; Body: CreateKeyBody; Headers: { "x-tds-client"?: string } }>(
    "/admin/v1/organizations/:org/keys",
    {
      ...route,
      schema: {
        operationId: "adminCreateKey",
        summary: "Create an API key, with limits of its own if given; the key is in this answer only",
        security,
        params: OrgParams,
        headers: AdminHeaders,
        body: CreateKeyBody,
        response: { 201: CreatedApiKey, ...errors },
      },
    },
    async (request, reply) => {
      const { name, ...settings } = request.body;
      const { key, raw } = await admin(request).createKey(request.params.org, name ?? null, settings);
      reply.header("cache-control", "no-store");
      return reply.code(201).send(createdApiKeyJson(key, raw));
    },
  );

  app.get<{ Params: OrgParams }>(
    "/admin/v1/organizations/:org/keys",
    {
      ...route,
      schema: {
        operationId: "adminListKeys",
        summary: "An organization's API keys: ids, names, times, limits, rotation and last use",
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
        summary: "One API key by id: its organization, name, times, limits, rotation and last use",
        security,
        params: KeyParams,
        response: { 200: AdminApiKey, ...errors },
      },
    },
    async (request) => apiKeyJson((await admin(request).key(request.params.key_id)).key),
  );

  app.patch<{ Params: KeyParams; Body: UpdateKeyBody; Headers: { "x-tds-client"?: string } }>(
    "/admin/v1/keys/:key_id",
    {
      ...route,
      schema: {
        operationId: "adminUpdateKey",
        summary: "Change an API key's name or limits (a field absent is kept, null clears it); 409 for a revoked key",
        security,
        params: KeyParams,
        headers: AdminHeaders,
        body: UpdateKeyBody,
        response: { 200: AdminApiKey, ...errorResponses("key_not_active"), ...errors },
      },
    },
    async (request) => apiKeyJson((await admin(request).updateKey(request.params.key_id, request.body)).key),
  );

  app.post<{ Params: KeyParams; Body: RotateKeyBody | undefined; Headers: { "x-tds-client"?: string } }>(
    "/admin/v1/keys/:key_id/rotate",
    {
      ...route,
      // No body at all is an empty one: the default grace.
      preValidation: async (request) => {
        request.body ??= {};
      },
      schema: {
        operationId: "adminRotateKey",
        summary: "Rotate an API key: a new key with the same limits (in this answer only); the old one works until its grace ends",
        security,
        params: KeyParams,
        headers: AdminHeaders,
        body: RotateKeyBody,
        bodyOptional: true,
        response: { 201: RotatedApiKey, ...errorResponses("key_not_active"), ...errors },
      },
    },
    async (request, reply) => {
      const { old, key, raw } = await admin(request).rotateKey(request.params.key_id, request.body?.grace_seconds);
      reply.header("cache-control", "no-store");
      return reply.code(201).send(rotatedApiKeyJson(old, key, raw));
    },
  );

  app.delete<{ Params: KeyParams; Headers: { "x-tds-client"?: string } }>(
    "/admin/v1/keys/:key_id",
    {
      ...route,
      schema: {
        operationId: "adminRevokeKey",
        summary: "Revoke an API key (its next request gets 401; on other instances within TDS_KEY_CACHE_MS when that is set)",
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
