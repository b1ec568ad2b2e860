import type { FastifyBaseLogger, FastifyReply, FastifyRequest } from "fastify";
import { keyIdOf } from "../domain/api-keys.ts";
import { ServiceError } from "../domain/errors.ts";
import { ADMIN_AUTH_THROTTLE, AdminAuthThrottle, type ThrottleWarning } from "./admin-auth-throttle.ts";
import { tokenMatcher } from "./token-match.ts";

const BEARER = /^Bearer[ \t]+(\S+)[ \t]*$/i;

export interface AdminAuthOptions {
  /** Default: ADMIN_AUTH_THROTTLE on the system clock. */
  throttle?: AdminAuthThrottle;
}

/**
 * onRequest hook of the admin routes: `Authorization: Bearer <admin token>`, compared in constant time (token-match.ts).
 * API keys are never accepted here. Failures are throttled per client address (request.ip): past the limit every
 * request from it gets 429 with Retry-After, a correct token too. Failed and throttled requests log one warning per
 * address per window, and no request line of their own beyond Fastify's "incoming request".
 */
export function authenticateAdmin(token: string, options: AdminAuthOptions = {}) {
  const matches = tokenMatcher(token);
  const throttle = options.throttle ?? new AdminAuthThrottle({ ...ADMIN_AUTH_THROTTLE, nowMs: Date.now });
  return async function adminAuthHook(request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const address = request.ip ?? "unknown";
    const retryAfterMs = throttle.retryAfterMs(address);
    if (retryAfterMs !== null) {
      quiet(reply);
      warn(request.log, address, throttle.refused(address));
      throw new ServiceError("admin_auth_throttled", undefined, { retryAfterMs });
    }
    const header = request.headers.authorization;
    const given = header ? BEARER.exec(header)?.[1] : undefined;
    if (given !== undefined && matches(given)) {
      throttle.succeeded(address);
      return;
    }
    quiet(reply);
    warn(request.log, address, throttle.failed(address));
    if (!header) throw new ServiceError("missing_admin_token");
    if (given === undefined)
      throw new ServiceError("missing_admin_token", "Authorization header must be of the form: Bearer <admin token>.");
    throw new ServiceError(
      "invalid_admin_token",
      keyIdOf(given) !== null ? "API keys are not accepted by the admin API; send the admin token (TDS_ADMIN_TOKEN)." : undefined,
    );
  };
}

/** No "request completed" line for a refused admin request: the throttled warning speaks for all of them. */
function quiet(reply: FastifyReply): void {
  if (VERBOSE_LEVELS.has(reply.log.level)) reply.log = reply.log.child({}, { level: "warn" });
}

/** Levels at which Fastify's "request completed" (info) is written. */
const VERBOSE_LEVELS = new Set(["trace", "debug", "info"]);

function warn(log: FastifyBaseLogger, address: string, warning: ThrottleWarning | null): void {
  if (!warning) return;
  const throttled = warning.throttledForMs !== null;
  log.warn(
    {
      remote_address: address,
      failed: warning.failed,
      refused_while_throttled: warning.refused,
      ...(throttled ? { throttled_for_ms: warning.throttledForMs } : {}),
    },
    throttled
      ? "admin authentication failures from this address: throttled; further ones are summarised once a minute"
      : "admin request without the right token; further ones from this address are summarised once a minute",
  );
}
