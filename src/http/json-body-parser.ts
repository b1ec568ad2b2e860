import { createHash } from "node:crypto";
import type { FastifyInstance } from "fastify";
import { ServiceError } from "../domain/errors.ts";
import { scanJson } from "./json-members.ts";

/** The members of a decision request that are forwarded to the model service as the client wrote them. */
const FORWARDED_MEMBERS = ["state", "questions"] as const;

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

/** Deeper JSON is refused (422): no state needs it, and recursive code downstream (serialisers, prompts) would overflow. */
export const MAX_JSON_DEPTH = 256;

/**
 * The only body parser: application/json, strict UTF-8, plain JSON.parse (so `__proto__` and
 * `constructor` stay ordinary keys). Size is enforced by each route's bodyLimit while streaming.
 */
export function installJsonBodyParser(app: FastifyInstance): void {
  app.removeAllContentTypeParsers();
  app.decorateRequest("bodySha256", null);
  app.decorateRequest("jsonMembers", null);
  app.addContentTypeParser("application/json", { parseAs: "buffer" }, (request, body, done) => {
    const bytes = body as Buffer;
    const charset = charsetOf(request.headers["content-type"]);
    if (charset !== null && charset !== "utf-8" && charset !== "utf8") {
      return done(
        new ServiceError("unsupported_media_type", `Request bodies must be UTF-8 JSON; Content-Type declares charset=${charset}.`),
        undefined,
      );
    }
    if (request.headers["idempotency-key"] !== undefined) request.bodySha256 = createHash("sha256").update(bytes).digest("hex");
    if (bytes.length === 0) return done(new ServiceError("invalid_json", "Request body is empty; send a JSON object."), undefined);
    let text: string;
    try {
      text = utf8.decode(bytes);
    } catch {
      return done(new ServiceError("invalid_utf8"), undefined);
    }
    // Before parsing: a body nested too deep is refused without building it (JSON.parse would recurse into it).
    const scanned = scanJson(text, MAX_JSON_DEPTH, FORWARDED_MEMBERS);
    if (scanned.deeperThanLimit) {
      return done(
        new ServiceError("invalid_json", `Request body nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels.`),
        undefined,
      );
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      const detail = err instanceof RangeError ? `JSON nests deeper than ${MAX_JSON_DEPTH} levels` : (err as Error).message;
      return done(new ServiceError("invalid_json", `Request body is not valid JSON: ${detail}`), undefined);
    }
    request.jsonMembers = scanned.members;
    done(null, parsed);
  });
}
