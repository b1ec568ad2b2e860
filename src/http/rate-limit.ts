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
  /**
   * The limiter's key for an API key with a per-minute limit of its own (requests_per_minute), counted before its
   * organization's, by the key's lineage (ApiKeyRecord.lineageId): a key and the keys that replaced it by rotation
   * count together. Absent: keys' own limits do not apply to these requests.
   */
  apiKey?: (lineageId: string) => string;
  /** The setting that sets the limit, for the 429 detail. */
  setting: string;
  /** What is limited, for the 429 detail: "request" or "usage read". */
  what: string;
  observer?: DecisionObserver;
}

const seconds = (ms: number) => Math.ceil(ms / 1000);

/**
 * onRequest hook, after authentication: counts the request against its key's own per-minute limit, if it has one,
 * then against its organization's, before its body is read, so that an invalid request (413, 422) costs as much of
 * the limits as a valid one. A request refused by its key's limit is not counted in its organization's: one key over
 * its limit leaves the organization's other keys their share.
 */
export function rateLimit(rule: RateLimitRule) {
  return async function rateLimitHook(request: FastifyRequest, reply: FastifyReply): Promise<void> {
    if (reply.sent || !request.auth) return;
    const { org, key } = request.auth;
    const own = key?.requestsPerMinute ?? null;
    if (rule.apiKey && own !== null) {
      const rate = await rule.limiter.consume(rule.apiKey(key.lineageId), own);
      if (!rate.allowed) {
        rule.observer?.rejected("key_rate_limited");
        throw new ServiceError(
          "key_rate_limited",
          `Per-minute ${rule.what} limit of this API key reached (its requests_per_minute = ${own}); retry in ${seconds(rate.retryAfterMs)} s. ` +
            "Other keys of the organization are not affected.",
          { retryAfterMs: rate.retryAfterMs },
        );
      }
    }
    const rate = await rule.limiter.consume(rule.key(org.id), rule.limit);
    if (rate.allowed) return;
    rule.observer?.rejected("rate_limited");
    throw new ServiceError(
      "rate_limited",
      `Per-minute ${rule.what} limit of the organization reached (${rule.setting} = ${rule.limit}); retry in ${seconds(rate.retryAfterMs)} s.`,
      { retryAfterMs: rate.retryAfterMs },
    );
  };
}
