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
    try {
      done(null, JSON.parse(text));
    } catch (err) {
      done(new HttpError("invalid_json", `Request body is not valid JSON: ${(err as Error).message}`), undefined);
    }
  });
}
