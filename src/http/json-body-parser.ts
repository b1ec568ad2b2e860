import type { FastifyInstance } from "fastify";
import { HttpError } from "./http-error.ts";

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: false });

/**
 * The only body parser: application/json, strict UTF-8, plain JSON.parse (so `__proto__` and
 * `constructor` stay ordinary keys). Size is enforced by each route's bodyLimit while streaming.
 */
export function installJsonBodyParser(app: FastifyInstance): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("application/json", { parseAs: "buffer" }, (_request, body, done) => {
    const bytes = body as Buffer;
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
