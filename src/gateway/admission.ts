import type { Config } from "../config.ts";
import type { RateLimiter } from "../limits/rate-limiter.ts";
import type { ResolvedModel } from "../models/registry.ts";
import type { StoredResponse } from "../store/store.ts";
import type { Books } from "./books.ts";
import type { Clock } from "./clock.ts";
import type { DecisionContext, IdempotencyRequest } from "./decision-context.ts";
import { GatewayError } from "./errors.ts";
import { formatUsd, tokenCost } from "./money.ts";
import { type DecisionObserver, silentObserver } from "./observer.ts";
import { msUntilUtcMidnight, utcDay } from "./utc-day.ts";

export const IDEMPOTENCY_WINDOW_MS = 24 * 60 * 60 * 1000;

/** An accepted request: from here it is recorded, and its reservation resolved, exactly once. */
export interface Admitted {
  kind: "admitted";
  acceptedAtMs: number;
  /** Paid mode: the credits set aside (the reservation's id is the request id). */
  reservedMicrousd: number | null;
}

/** A retry with the Idempotency-Key of a request that succeeded: its response again, nothing counted. */
export interface Replayed {
  kind: "replay";
  response: StoredResponse;
}

export interface AdmissionDeps {
  books: Books;
  limiter: RateLimiter;
  clock: Clock;
  config: Pick<Config, "serviceMode" | "limits" | "reservationTtlSeconds">;
  observer?: DecisionObserver;
}

/**
 * The checks that decide whether a request is accepted: the per-minute rate (429), then, in one durable step with
 * the in-flight usage record, the Idempotency-Key (replay, 422, 409) and the preview day quotas (429) or the
 * credit reservation (402).
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

  async admit(ctx: DecisionContext, model: ResolvedModel, idempotency: IdempotencyRequest | null): Promise<Admitted | Replayed> {
    const { books, limiter, clock, config } = this.deps;
    const rate = await limiter.consume(ctx.org.id, config.limits.requestsPerMinute);
    if (!rate.allowed) {
      this.observer.rejected("rate_limited");
      throw new GatewayError(
        "rate_limited",
        `Per-minute request limit of the organization reached (requests_per_minute = ${config.limits.requestsPerMinute}); retry in ${Math.ceil(rate.retryAfterMs / 1000)} s.`,
        { retryAfterMs: rate.retryAfterMs },
      );
    }

    const now = clock.nowMs();
    const paid = config.serviceMode === "paid";
    const amount = paid ? this.reservationAmount(model) : null;
    const result = await books.admit({
      requestId: ctx.requestId,
      orgId: ctx.org.id,
      keyId: ctx.keyId,
      source: ctx.source,
      model: model.name,
      mode: config.serviceMode,
      nowMs: now,
      idempotency: idempotency && {
        key: idempotency.key,
        requestHash: idempotency.requestHash,
        // A claim blocks other attempts this long if its process dies: beyond any model call.
        lockUntilMs: now + config.reservationTtlSeconds * 1000,
        expiresAtMs: now + IDEMPOTENCY_WINDOW_MS,
      },
      quota: paid
        ? null
        : { day: utcDay(now), orgLimit: config.limits.previewRequestLimit, globalLimit: config.limits.previewGlobalRequestLimit },
      reservation: amount === null ? null : { amountMicrousd: amount, expiresAtMs: now + config.reservationTtlSeconds * 1000 },
    });

    switch (result.kind) {
      case "admitted":
        if (paid) this.observer.reservation("reserved");
        return { kind: "admitted", acceptedAtMs: now, reservedMicrousd: amount };
      case "replay":
        return { kind: "replay", response: result.response };
      case "replay_not_kept":
        throw new GatewayError(
          "idempotency_response_not_kept",
          `A request with this Idempotency-Key already succeeded (request_id ${result.requestId}), but its response was too large to keep for replays; find it in Usage by request_id.`,
        );
      case "idempotency_mismatch":
        throw new GatewayError("idempotency_key_reused");
      case "idempotency_in_progress":
        throw new GatewayError("idempotency_in_progress");
      case "quota_exhausted": {
        const org = result.scope === "org";
        this.observer.rejected(org ? "preview_quota_org" : "preview_quota_global");
        throw new GatewayError(
          org ? "preview_quota_org" : "preview_quota_global",
          org
            ? `Daily preview request limit of the organization reached (preview_request_limit = ${config.limits.previewRequestLimit}); it resets at 00:00 UTC.`
            : `Daily preview capacity of the service reached (preview_global_request_limit = ${config.limits.previewGlobalRequestLimit}); it resets at 00:00 UTC.`,
          { retryAfterMs: msUntilUtcMidnight(now) },
        );
      }
      case "insufficient_credits":
        this.observer.reservation("insufficient");
        this.observer.rejected("insufficient_credits");
        throw new GatewayError(
          "insufficient_credits",
          `Available credits (${formatUsd(result.availableMicrousd)} USD) cannot cover the token reservation of this request (${formatUsd(amount ?? 0)} USD for reserve_tokens = ${config.limits.reserveTokens}).`,
        );
    }
  }
}
