import type { FastifyInstance, RouteOptions } from "fastify";
import { SERVICE_LICENSE } from "../version.ts";

interface RouteDoc {
  method: string;
  url: string;
  schema: Record<string, unknown>;
}

const STATUS_TEXT: Record<string, string> = {
  "200": "Success",
  "202": "Accepted",
  "400": "Malformed request: its URL, request line, headers or body framing cannot be parsed",
  "401": "Missing, invalid, revoked, expired or retired (rotated, grace over) API key",
  "402": "Credits, or the API key's budget, cannot cover the reservation (paid mode)",
  "403": "Organization paused pending billing review, or a model the API key may not use",
  "404": "Not found in this organization",
  "409": "Reservation expired, or the same Idempotency-Key is still running",
  "413": "Body over max_request_bytes (a batch: over max_batch_bytes, or a line over max_request_bytes)",
  "422": "Invalid body or query, unknown model, or context rejected",
  "429": "Per-minute limit (the organization's or the API key's) or daily preview quota reached",
  "502": "Model unavailable, timed out or invalid; nothing charged",
  "503": "Model service not configured, or storage unavailable",
};

/** The admin API's statuses mean other things than the public API's. */
const ADMIN_STATUS_TEXT: Record<string, string> = {
  "200": "Success",
  "201": "Created",
  "204": "Done (also when it was already revoked)",
  "401": "Missing or invalid admin token (API keys are not accepted)",
  "404": "No such organization or key",
  "409": "The name is already in use, or the key is revoked, rotated or expired and cannot be changed or rotated",
  "422": "Invalid body, query or header, or an Idempotency-Key reused with another grant",
  "503": "Storage unavailable",
};

/** A response documented per media type, as Fastify takes it: `{ content: { "<type>": { schema } } }`. */
function isMediaTypeMap(body: unknown): body is { content: Record<string, unknown> } {
  return typeof body === "object" && body !== null && !("type" in body) && typeof (body as { content?: unknown }).content === "object";
}

function toOpenApiPath(url: string): string {
  return url.replace(/:([A-Za-z0-9_]+)/g, "{$1}");
}

function parameters(schema: Record<string, unknown>): unknown[] {
  const out: unknown[] = [];
  for (const [where, key] of [
    ["query", "querystring"],
    ["path", "params"],
  ] as const) {
    const s = schema[key] as { properties?: Record<string, unknown>; required?: string[] } | undefined;
    for (const [name, prop] of Object.entries(s?.properties ?? {})) {
      out.push({ name, in: where, required: where === "path" || (s?.required ?? []).includes(name), schema: prop });
    }
  }
  return out;
}

/**
 * Collects every route's TypeBox schemas (the same objects that validate requests) into an
 * OpenAPI 3.1 document served at GET /openapi.json. Call before the routes are registered.
 */
export function installOpenApi(app: FastifyInstance, info: { title: string; version: string; description: string }): void {
  const routes: RouteDoc[] = [];
  app.addHook("onRoute", (route: RouteOptions) => {
    if (!route.schema || (route.schema as { hide?: boolean }).hide) return;
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    for (const method of methods) {
      if (method === "HEAD") continue;
      routes.push({ method: method.toLowerCase(), url: route.url, schema: route.schema as Record<string, unknown> });
    }
  });

  let document: unknown = null;
  app.get("/openapi.json", { schema: { hide: true } }, async () => {
    document ??= build(routes, info);
    return document;
  });
}

function build(routes: RouteDoc[], info: { title: string; version: string; description: string }) {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const route of routes) {
    const { schema } = route;
    const responses: Record<string, unknown> = {};
    const texts = route.url.startsWith("/admin/") ? ADMIN_STATUS_TEXT : STATUS_TEXT;
    for (const [status, body] of Object.entries((schema.response as Record<string, unknown>) ?? {})) {
      const description = texts[status] ?? "Response";
      const content = isMediaTypeMap(body) ? body.content : { "application/json": { schema: body } };
      responses[status] = status === "204" ? { description } : { description, content };
    }
    const operation: Record<string, unknown> = {
      operationId: schema.operationId,
      summary: schema.summary,
      ...(schema.description ? { description: schema.description } : {}),
      ...(schema.security ? { security: schema.security } : {}),
      parameters: parameters(schema),
      responses,
    };
    // `bodyOptional`: the route takes no body as an empty one (a rotation's default grace).
    if (schema.body)
      operation.requestBody = { required: schema.bodyOptional !== true, content: { "application/json": { schema: schema.body } } };
    if (schema.streamedBody) {
      const { mediaType, schema: lineSchema, description } = schema.streamedBody as StreamedBody;
      operation.requestBody = { required: true, ...(description ? { description } : {}), content: { [mediaType]: { schema: lineSchema } } };
    }
    if (schema.headers) {
      const headers = schema.headers as { properties?: Record<string, unknown> };
      for (const [name, prop] of Object.entries(headers.properties ?? {})) {
        (operation.parameters as unknown[]).push({ name, in: "header", required: false, schema: prop });
      }
    }
    const openApiPath = toOpenApiPath(route.url);
    const byMethod = paths[openApiPath] ?? {};
    byMethod[route.method] = operation;
    paths[openApiPath] = byMethod;
  }
  const documented = JSON.parse(JSON.stringify(paths)) as typeof paths;
  const schemas = hoistDiscriminatedVariants(documented);
  return {
    openapi: "3.1.0",
    info: { ...info, license: { name: SERVICE_LICENSE, identifier: SERVICE_LICENSE } },
    servers: [{ url: "/" }],
    components: {
      schemas,
      securitySchemes: {
        bearer: { type: "http", scheme: "bearer", description: "Organization API key (tds_…)" },
        admin: {
          type: "http",
          scheme: "bearer",
          description: "The admin token (TDS_ADMIN_TOKEN); only for /admin/v1, where API keys are not accepted",
        },
      },
    },
    paths: documented,
  };
}

/**
 * A discriminator can only select variants that are named schemas: the titled variants of every `oneOf` with a
 * discriminator become `#/components/schemas/<title>`, with the mapping from their tag. Changes `paths` in place: give
 * it a copy, never the route schemas (they are the validators).
 */
function hoistDiscriminatedVariants(paths: Record<string, unknown>): Record<string, unknown> {
  const schemas: Record<string, unknown> = {};
  const textByTitle = new Map<string, string>();
  const visit = (node: unknown): void => {
    if (typeof node !== "object" || node === null) return;
    const schema = node as { oneOf?: unknown[]; discriminator?: { propertyName: string; mapping?: Record<string, string> } };
    for (const child of Object.values(schema)) visit(child);
    if (!schema.discriminator || !Array.isArray(schema.oneOf)) return;
    const { propertyName } = schema.discriminator;
    const mapping: Record<string, string> = {};
    schema.oneOf = schema.oneOf.map((variant) => {
      const { title, properties } = variant as { title?: string; properties?: Record<string, { const?: unknown }> };
      const tag = properties?.[propertyName]?.const;
      if (typeof title !== "string" || typeof tag !== "string") throw new Error(`OpenAPI: a ${propertyName}-tagged variant needs a title`);
      const text = JSON.stringify(variant);
      if (textByTitle.has(title) && textByTitle.get(title) !== text) throw new Error(`OpenAPI: two different schemas are titled ${title}`);
      textByTitle.set(title, text);
      schemas[title] = variant;
      mapping[tag] = `#/components/schemas/${title}`;
      return { $ref: mapping[tag] };
    });
    schema.discriminator = { ...schema.discriminator, mapping };
  };
  visit(paths);
  return schemas;
}

declare module "fastify" {
  interface FastifySchema {
    /** The operation's stable camelCase name in /openapi.json (generated clients name their methods after it). */
    operationId?: string;
    summary?: string;
    description?: string;
    security?: Array<Record<string, string[]>>;
    hide?: boolean;
    /** A body the route reads as a stream (not parsed as JSON): documented only, never validated by Fastify. */
    streamedBody?: StreamedBody;
    /** The route takes a request without a body as an empty one: its requestBody is documented as not required. */
    bodyOptional?: boolean;
  }
}

/** The media type of a streamed body and the schema of each of its lines. */
export interface StreamedBody {
  mediaType: string;
  schema: unknown;
  description?: string;
}
