import { join } from "node:path";
import type { FastifyInstance } from "fastify";
import { DEFAULT_WEB_ROOT, staticFileHandler } from "./console.ts";

/** The API reference page: web/docs/, rendered in the browser from /openapi.json. */
export const DEFAULT_DOCS_ROOT = join(DEFAULT_WEB_ROOT, "docs");

/**
 * GET /docs → 301 to /docs/; GET /docs/* → the files of web/docs/ served like the console's (same
 * Content-Security-Policy and headers). The routes are left out of /openapi.json.
 */
export function apiDocsRoutes(app: FastifyInstance, deps: { root?: string } = {}) {
  const serve = staticFileHandler(deps.root ?? DEFAULT_DOCS_ROOT, "No such docs file.");
  const hidden = { schema: { hide: true } };

  // Relative, like the console's: the page's relative URLs (its assets, ../openapi.json) need the trailing slash.
  app.get("/docs", hidden, async (_request, reply) => reply.redirect("docs/", 301));
  app.get<{ Params: { "*": string } }>("/docs/*", hidden, (request, reply) => serve(request, reply, request.params["*"] ?? ""));
}
