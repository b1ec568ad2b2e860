import type { Config } from "../config.ts";
import type { Clock } from "../domain/clock.ts";
import { ServiceError } from "../domain/errors.ts";
import { formatUsd, tokenCost } from "../domain/money.ts";
import { msUntilUtcMidnight, utcDay } from "../domain/utc-day.ts";
import type { TokenBound } from "../models/model-service.ts";
import type { StoredResponse } from "../store/store.ts";
import type { Books } from "./books.ts";
import type { DecisionContext, IdempotencyRequest } from "./decision-context.ts";
import type { ResolvedModel } from "./model-registry.ts";
import { type DecisionObserver, silentObserver } from "./observer.ts";

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
  clock: Clock;
  config: Pick<Config, "serviceMode" | "limits" | "reservationTtlSeconds">;
  observer?: DecisionObserver;
}

/**
 * The checks that decide whether a request is accepted, in one durable step with its in-flight usage record: the
 * Idempotency-Key (replay, 422, 409) and the preview day quotas (429) or the credit reservation (402). (The
 * per-minute rate is counted earlier, when the request is authenticated: src/http/rate-limit.ts.)
 */
export class AdmissionPolicy {
  private readonly observer: DecisionObserver;

  constructor(private readonly deps: AdmissionDeps) {
    this.observer = deps.observer ?? silentObserver;
  }

  /**
   * The credit reservation of one paid request: what it can cost at most — its token bound, each count capped at
   * reserve_tokens (the gateway's bound for accounting: no request is charged more, none is refused for its bound).
   */
  reservationAmount(model: ResolvedModel, bound: TokenBound): { amount: number; tokens: TokenBound } {
    const cap = this.deps.config.limits.reserveTokens;
    const tokens = { input: Math.min(bound.input, cap), output: Math.min(bound.output, cap) };
    return { amount: tokenCost(model.price, tokens.input, tokens.output), tokens };
  }

  /** `bound`: the request's token bound (paid mode; ignored in preview). */
  async admit(
    ctx: DecisionContext,
    model: ResolvedModel,
    idempotency: IdempotencyRequest | null,
    bound: TokenBound | null,
  ): Promise<Admitted | Replayed> {
    const { books, clock, config } = this.deps;
    const now = clock.nowMs();
    const paid = config.serviceMode === "paid";
    const reservation = paid && bound ? this.reservationAmount(model, bound) : null;
    const amount = reservation?.amount ?? null;
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
        throw new ServiceError(
          "idempotency_response_not_kept",
          `A request with this Idempotency-Key already succeeded (request_id ${result.requestId}), but its response was too large to keep for replays; find it in Usage by request_id.`,
        );
      case "idempotency_mismatch":
        throw new ServiceError("idempotency_key_reused");
      case "idempotency_in_progress":
        throw new ServiceError("idempotency_in_progress");
      case "quota_exhausted": {
        const org = result.scope === "org";
        this.observer.rejected(org ? "preview_quota_org" : "preview_quota_global");
        throw new ServiceError(
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
        throw new ServiceError(
          "insufficient_credits",
          `Available credits (${formatUsd(result.availableMicrousd)} USD) cannot cover the reservation of this request: ` +
            `${formatUsd(amount ?? 0)} USD for at most ${reservation?.tokens.input ?? 0} input and ${reservation?.tokens.output ?? 0} output tokens.`,
        );
    }
  }
}
