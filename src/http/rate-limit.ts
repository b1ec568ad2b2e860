import type { FastifyReply, FastifyRequest } from "fastify";
import { ServiceError } from "../domain/errors.ts";
import type { DecisionObserver } from "../gateway/observer.ts";
import type { RateLimiter } from "../limits/rate-limiter.ts";

export interface RateLimitRule {
  limiter: RateLimiter;
  /** Requests per organization per minute. */
  limit: number;
  /** The limiter's key for an organization (decisions and reads count apart). */
  key: (orgId: string) => string;
  /** The setting that sets the limit, for the 429 detail. */
  setting: string;
  /** What is limited, for the 429 detail: "request" or "usage read". */
  what: string;
  observer?: DecisionObserver;
}

/**
 * onRequest hook, after authentication: counts the request against its organization's per-minute limit before its
 * body is read, so an invalid request (413, 422) costs the organization as much of its limit as a valid one.
 */
export function rateLimit(rule: RateLimitRule) {
  return async function rateLimitHook(request: FastifyRequest, reply: FastifyReply): Promise<void> {
    if (reply.sent || !request.auth) return;
    const rate = await rule.limiter.consume(rule.key(request.auth.org.id), rule.limit);
    if (rate.allowed) return;
    rule.observer?.rejected("rate_limited");
    throw new ServiceError(
      "rate_limited",
      `Per-minute ${rule.what} limit of the organization reached (${rule.setting} = ${rule.limit}); retry in ${Math.ceil(rate.retryAfterMs / 1000)} s.`,
      { retryAfterMs: rate.retryAfterMs },
    );
  };
}
