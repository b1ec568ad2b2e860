import { createHash } from "node:crypto";
import type { FastifyInstance, FastifyRequest } from "fastify";
import { parseJsonText } from "../contract/json-text.ts";
import { ServiceError } from "../domain/errors.ts";
import { createOnePerTurn } from "./one-per-turn.ts";

declare module "fastify" {
  interface FastifyRequest {
    /** sha256 (hex) of the body bytes; computed only for requests that send an Idempotency-Key. */
    bodySha256: string | null;
    /** The original text of the body's top-level `state` and `questions`, for forwarding them exactly (json-members.ts). */
    jsonMembers: Map<string, string> | null;
  }
}

/** The charset parameter of a Content-Type, lowercased; null when there is none. */
function charsetOf(contentType: string | undefined): string | null {
  const match = /;\s*charset\s*=\s*"?([^";\s]*)"?/i.exec(contentType ?? "");
  return match ? match[1]!.toLowerCase() : null;
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: false });

/** Bodies from this size on are parsed one per turn of the event loop (one-per-turn.ts); smaller ones at once. */
const LARGE_BODY_BYTES = 64 * 1024;

/** Whether the request's route reads a body (has a body schema); 404s and body-less routes do not. */
function takesBody(request: FastifyRequest): boolean {
  return request.routeOptions.schema?.body !== undefined;
}

/**
 * The only body parser: application/json, strict UTF-8, plain JSON.parse (so `__proto__` and
 * `constructor` stay ordinary keys). Size is enforced by each route's bodyLimit while streaming.
 * An empty body is no body: refused where the route needs one, accepted where it takes none (many clients send
 * Content-Type: application/json on every request, a DELETE included).
 */
export function installJsonBodyParser(app: FastifyInstance): void {
  app.removeAllContentTypeParsers();
  app.decorateRequest("bodySha256", null);
  app.decorateRequest("jsonMembers", null);
  // Parsing and checking a body of 1 MiB takes tens of milliseconds: ten arriving together are taken one per turn,
  // so that other requests are answered between them.
  const onePerTurn = createOnePerTurn();
  app.addContentTypeParser("application/json", { parseAs: "buffer" }, (request, body, done) => {
    const bytes = body as Buffer;
    if (bytes.length === 0 && !takesBody(request)) return done(null, undefined);
    const parse = () => {
      const result = parseJsonBody(request, bytes);
      if (result instanceof ServiceError) done(result, undefined);
      else done(null, result.body);
    };
    if (bytes.length < LARGE_BODY_BYTES) parse();
    else onePerTurn(parse);
  });
}

/** The parsed body, or the error that refuses it. */
function parseJsonBody(request: FastifyRequest, bytes: Buffer): { body: unknown } | ServiceError {
  const charset = charsetOf(request.headers["content-type"]);
  if (charset !== null && charset !== "utf-8" && charset !== "utf8") {
    return new ServiceError("unsupported_media_type", `Request bodies must be UTF-8 JSON; Content-Type declares charset=${charset}.`);
  }
  if (request.headers["idempotency-key"] !== undefined) request.bodySha256 = createHash("sha256").update(bytes).digest("hex");
  if (bytes.length === 0) return new ServiceError("invalid_json", "Request body is empty; send a JSON object.");
  let text: string;
  try {
    text = utf8.decode(bytes);
  } catch {
    return new ServiceError("invalid_utf8");
  }
  const parsed = parseJsonText(text);
  if ("problem" in parsed) return new ServiceError("invalid_json", `Request body ${parsed.problem}`);
  request.jsonMembers = parsed.members;
  return { body: parsed.body };
}
