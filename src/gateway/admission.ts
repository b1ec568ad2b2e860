import type { Config } from "../config.ts";
import type { RateLimiter } from "../limits/rate-limiter.ts";
import type { ResolvedModel } from "../models/registry.ts";
import type { Organization, Store } from "../store/store.ts";
import type { Clock } from "./clock.ts";
import { GatewayError } from "./errors.ts";
import { formatUsd, tokenCost } from "./money.ts";
import type { DecisionObserver } from "./observer.ts";
import { silentObserver } from "./observer.ts";
import { msUntilUtcMidnight, utcDay } from "./utc-day.ts";

/** What admitting a request set aside: in paid mode, its credit reservation. */
export interface Admission {
  reservation: { id: string; amountMicrousd: number } | null;
}

export interface AdmissionDeps {
  store: Store;
  limiter: RateLimiter;
  clock: Clock;
  config: Pick<Config, "serviceMode" | "limits" | "reservationTtlSeconds">;
  observer?: DecisionObserver;
}

/**
 * The checks that decide whether a request is accepted: the per-minute rate (429), then the
 * preview day quotas (429) or the credit reservation (402). Each is one atomic step in its port.
 */
export class AdmissionPolicy {
  private readonly observer: DecisionObserver;

  constructor(private readonly deps: AdmissionDeps) {
    this.observer = deps.observer ?? silentObserver;
  }

  /** The credit reservation of one paid request: reserve_tokens × (input price + output price). */
  reservationAmount(model: ResolvedModel): number {
    const tokens = this.deps.config.limits.reserveTokens;
    return tokenCost(model.price, tokens, tokens);
  }

  async admit(org: Organization, requestId: string, model: ResolvedModel): Promise<Admission> {
    const { store, limiter, clock, config } = this.deps;
    const rate = await limiter.consume(org.id, config.limits.requestsPerMinute);
    if (!rate.allowed) {
      this.observer.rejected("rate_limited");
      throw new GatewayError(
        "rate_limited",
        `Per-minute request limit of the organization reached (requests_per_minute = ${config.limits.requestsPerMinute}); retry in ${Math.ceil(rate.retryAfterMs / 1000)} s.`,
        { retryAfterMs: rate.retryAfterMs },
      );
    }

    const now = clock.nowMs();
    if (config.serviceMode === "preview") {
      const quota = await store.consumePreviewQuota({
        orgId: org.id,
        day: utcDay(now),
        orgLimit: config.limits.previewRequestLimit,
        globalLimit: config.limits.previewGlobalRequestLimit,
      });
      if (quota !== "ok") {
        const orgLimit = quota === "org_exhausted";
        this.observer.rejected(orgLimit ? "preview_quota_org" : "preview_quota_global");
        throw new GatewayError(
          orgLimit ? "preview_quota_org" : "preview_quota_global",
          orgLimit
            ? `Daily preview request limit of the organization reached (preview_request_limit = ${config.limits.previewRequestLimit}); it resets at 00:00 UTC.`
            : `Daily preview capacity of the service reached (preview_global_request_limit = ${config.limits.previewGlobalRequestLimit}); it resets at 00:00 UTC.`,
          { retryAfterMs: msUntilUtcMidnight(now) },
        );
      }
      return { reservation: null };
    }

    const amount = this.reservationAmount(model);
    const reserved = await store.reserveCredits({
      reservationId: requestId,
      orgId: org.id,
      requestId,
      amountMicrousd: amount,
      nowMs: now,
      expiresAtMs: now + config.reservationTtlSeconds * 1000,
    });
    this.observer.reservation(reserved);
    if (reserved === "insufficient") {
      this.observer.rejected("insufficient_credits");
      const balance = await store.getBalance(org.id);
      throw new GatewayError(
        "insufficient_credits",
        `Available credits (${formatUsd(balance.available)} USD) cannot cover the token reservation of this request (${formatUsd(amount)} USD for reserve_tokens = ${this.deps.config.limits.reserveTokens}).`,
      );
    }
    return { reservation: { id: requestId, amountMicrousd: amount } };
  }
}
