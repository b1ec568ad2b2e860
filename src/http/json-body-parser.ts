import { createHash } from "node:crypto";
import type { FastifyInstance } from "fastify";
import { HttpError } from "./http-error.ts";

declare module "fastify" {
  interface FastifyRequest {
    /** sha256 (hex) of the body bytes; computed only for requests that send an Idempotency-Key. */
    bodySha256: string | null;
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: false });

/** Deeper JSON is refused (422): no state needs it, and recursive code downstream (serialisers, prompts) would overflow. */
export const MAX_JSON_DEPTH = 256;

/** True when arrays/objects nest deeper than `limit` (iterative: deep input cannot overflow the stack here). */
export function nestedDeeperThan(value: unknown, limit: number): boolean {
  const stack: Array<[unknown, number]> = [[value, 1]];
  while (stack.length > 0) {
    const [node, depth] = stack.pop()!;
    if (node === null || typeof node !== "object") continue;
    if (depth > limit) return true;
    for (const child of Array.isArray(node) ? node : Object.values(node)) {
      if (child !== null && typeof child === "object") stack.push([child, depth + 1]);
    }
  }
  return false;
}

/**
 * The only body parser: application/json, strict UTF-8, plain JSON.parse (so `__proto__` and
 * `constructor` stay ordinary keys). Size is enforced by each route's bodyLimit while streaming.
 */
export function installJsonBodyParser(app: FastifyInstance): void {
  app.removeAllContentTypeParsers();
  app.decorateRequest("bodySha256", null);
  app.addContentTypeParser("application/json", { parseAs: "buffer" }, (request, body, done) => {
    const bytes = body as Buffer;
    if (request.headers["idempotency-key"] !== undefined) request.bodySha256 = createHash("sha256").update(bytes).digest("hex");
    if (bytes.length === 0) return done(new HttpError("invalid_json", "Request body is empty; send a JSON object."), undefined);
    let text: string;
    try {
      text = utf8.decode(bytes);
    } catch {
      return done(new HttpError("invalid_utf8"), undefined);
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      const detail = err instanceof RangeError ? `JSON nests deeper than ${MAX_JSON_DEPTH} levels` : (err as Error).message;
      return done(new HttpError("invalid_json", `Request body is not valid JSON: ${detail}`), undefined);
    }
    if (nestedDeeperThan(parsed, MAX_JSON_DEPTH)) {
      return done(new HttpError("invalid_json", `Request body nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels.`), undefined);
    }
    done(null, parsed);
  });
}
