import { createHash, timingSafeEqual } from "node:crypto";
import type { FastifyRequest } from "fastify";
import { keyIdOf } from "../domain/api-keys.ts";
import { ServiceError } from "../domain/errors.ts";

const BEARER = /^Bearer[ \t]+(\S+)[ \t]*$/i;

function digest(text: string): Buffer {
  return createHash("sha256").update(text, "utf8").digest();
}

/**
 * onRequest hook of the admin routes: `Authorization: Bearer <admin token>`, compared in constant time (both sides
 * hashed first, so the comparison does not depend on the length either). API keys are never accepted here.
 */
export function authenticateAdmin(token: string) {
  const expected = digest(token);
  return async function adminAuthHook(request: FastifyRequest): Promise<void> {
    const header = request.headers.authorization;
    if (!header) throw new ServiceError("missing_admin_token");
    const given = BEARER.exec(header)?.[1];
    if (!given) throw new ServiceError("missing_admin_token", "Authorization header must be of the form: Bearer <admin token>.");
    if (!timingSafeEqual(digest(given), expected)) {
      request.log.warn({ remote_address: request.ip }, "admin request with a wrong token");
      const apiKey = keyIdOf(given) !== null;
      throw new ServiceError(
        "invalid_admin_token",
        apiKey ? "API keys are not accepted by the admin API; send the admin token (TDS_ADMIN_TOKEN)." : undefined,
      );
    }
  };
}
