import { createHash } from "node:crypto";
import { readFile, realpath, stat } from "node:fs/promises";
import { extname, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { sendError } from "../error-handler.ts";

/** The console's static files: plain HTML, CSS and browser ES modules, no build step. */
export const DEFAULT_WEB_ROOT = fileURLToPath(new URL("../../../web/", import.meta.url));

/** Only these kinds of files are served; anything else under the root is a 404. */
const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".json": "application/json; charset=utf-8",
  ".webmanifest": "application/manifest+json; charset=utf-8",
  ".txt": "text/plain; charset=utf-8",
};

/**
 * Same origin for everything, no inline scripts or styles (the console sets styles through the
 * CSSOM only), no plugins, not framable, no <base> rewriting.
 */
export const CONSOLE_CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self'",
  "connect-src 'self'",
  "font-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join("; ");

function securityHeaders(reply: FastifyReply): FastifyReply {
  return reply
    .header("content-security-policy", CONSOLE_CSP)
    .header("x-content-type-options", "nosniff")
    .header("referrer-policy", "no-referrer")
    .header("x-frame-options", "DENY")
    .header("cross-origin-opener-policy", "same-origin")
    .header("cross-origin-resource-policy", "same-origin");
}

/**
 * Maps the path after /console/ to a file inside the root, or null. Every segment must be a plain
 * name: no "..", ".", empty segments, dot-files, backslashes or NUL; the resolved real path must
 * still be inside the root (symlinks cannot lead out of it).
 */
async function resolveAsset(root: string, realRoot: string, rest: string): Promise<string | null> {
  const wanted = rest === "" || rest.endsWith("/") ? `${rest}index.html` : rest;
  const segments = wanted.split("/");
  for (const s of segments) {
    if (s === "" || s.startsWith(".") || s.includes("\\") || s.includes("\0") || s.includes(":")) return null;
  }
  if (!(extname(wanted).toLowerCase() in CONTENT_TYPES)) return null;
  const candidate = resolve(root, ...segments);
  const rel = relative(root, candidate);
  if (rel === "" || rel.startsWith("..") || rel.startsWith(sep)) return null;
  try {
    const real = await realpath(candidate);
    if (!(real === realRoot || real.startsWith(realRoot + sep))) return null;
    if (!(await stat(real)).isFile()) return null;
    return real;
  } catch {
    return null;
  }
}

/**
 * A handler that serves the file at a path below `rootDir` (as resolveAsset allows) with its content type, an ETag and
 * `Cache-Control: no-cache` (files are not fingerprinted, so browsers revalidate and get 304s) and the security
 * headers; anything else is a 404 with `notFoundDetail`.
 */
export function staticFileHandler(rootDir: string, notFoundDetail: string) {
  const root = resolve(rootDir);
  let realRoot: Promise<string> | null = null;
  return async (request: FastifyRequest, reply: FastifyReply, rest: string) => {
    realRoot ??= realpath(root).catch(() => root);
    const file = await resolveAsset(root, await realRoot, rest);
    if (!file) return sendError(reply, "route_not_found", { detail: notFoundDetail });
    const [body, info] = await Promise.all([readFile(file), stat(file)]);
    const etag = `"${createHash("sha256").update(body).digest("base64url").slice(0, 27)}"`;
    securityHeaders(reply).header("cache-control", "no-cache").header("etag", etag).header("last-modified", info.mtime.toUTCString());
    const ifNoneMatch = request.headers["if-none-match"];
    if (ifNoneMatch?.split(",").some((tag) => tag.trim().replace(/^W\//, "") === etag)) {
      return reply.code(304).send();
    }
    return reply.type(CONTENT_TYPES[extname(file).toLowerCase()]!).send(body);
  };
}

/**
 * GET / → the console; GET /console/* → its static files (see staticFileHandler) with a strict
 * Content-Security-Policy. The routes are left out of /openapi.json.
 */
export function consoleRoutes(app: FastifyInstance, deps: { root?: string } = {}) {
  const serve = staticFileHandler(deps.root ?? DEFAULT_WEB_ROOT, "No such console file.");
  const hidden = { schema: { hide: true } };

  // Relative locations, so the console also works when a proxy mounts the gateway under a path prefix.
  app.get("/", hidden, async (_request, reply) => reply.redirect("console/", 302));
  app.get("/console", hidden, async (_request, reply) => reply.redirect("console/", 301));

  app.get<{ Params: { "*": string } }>("/console/*", hidden, (request, reply) => serve(request, reply, request.params["*"] ?? ""));
}
