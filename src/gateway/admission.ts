import type { Config } from "../config.ts";
import type { AdmitCommand, AdmitResult, StoredResponse } from "../domain/bookkeeping.ts";
import type { Clock } from "../domain/clock.ts";
import { ServiceError } from "../domain/errors.ts";
import { IDEMPOTENCY_WINDOW_MS } from "../domain/idempotency.ts";
import { formatUsd, scaledPrice, tokenCost } from "../domain/money.ts";
import type { KeyBudget } from "../domain/organizations.ts";
import { msUntilPeriodEnd, msUntilUtcMidnight, utcDay, utcPeriod } from "../domain/utc-day.ts";
import type { TokenBound } from "../models/model-service.ts";
import type { Books } from "./books.ts";
import type { Charging, Reservation } from "./charging.ts";
import type { DecisionContext, IdempotencyRequest } from "./decision-context.ts";
import { type FailureBeforeAdmission, recordFailureBeforeAdmission } from "./failure-before-admission.ts";
import { checkModelAllowed } from "./key-controls.ts";
import type { ResolvedModel } from "./model-registry.ts";
import { type DecisionObserver, silentObserver } from "./observer.ts";
import type { RequestBound } from "./token-bound.ts";

/** How a bound was found, in the words of a refusal's detail. */
function basisOf(bound: TokenBound | RequestBound): string {
  if (!("basis" in bound) || bound.basis === "counted") return "counted by the model service";
  return bound.basis === "context"
    ? "the bytes of its state and questions, limited by the model's context"
    : "one token per UTF-8 byte of its state and questions plus the prompt template; no context of the model lowers it";
}

/** An accepted request: from here it is recorded, and its reservation resolved, exactly once. */
export interface Admitted {
  kind: "admitted";
  acceptedAtMs: number;
  charging: Charging;
}

/** A retry with the Idempotency-Key of a request that succeeded: its response again, nothing counted. */
export interface Replayed {
  kind: "replay";
  response: StoredResponse;
}

export interface AdmissionDeps {
  books: Books;
  clock: Clock;
  config: Pick<Config, "serviceMode" | "limits" | "reservationTtlSeconds"> & { batches: Pick<Config["batches"], "priceFactorMillionths"> };
  observer?: DecisionObserver;
  /** This gateway process, recorded on what it admits: if it dies, its work is released by the others. */
  instanceId?: string;
  /** Completes now the requests of gateway processes that are gone (an Idempotency-Key claim of one blocks a retry). */
  releaseAbandoned?: () => Promise<unknown>;
}

/** A request's token bound, or how to find it. */
export type BoundSource = TokenBound | RequestBound | (() => Promise<TokenBound | RequestBound>);

/** A retry finding its key held by a request of a stopped process that could not be released at once retries after this. */
const ABANDONED_RETRY_MS = 1000;

/**
 * The checks that decide whether a request is accepted, in one durable step with its in-flight usage record: the
 * Idempotency-Key (replay, 422, 409) and the preview day quotas (429) or the credit reservation (402; 413 for a token
 * bound over reserve_tokens, before the durable step), set aside in the key's budget too when it has one (402). Before
 * them, the models the key may use (403). (The per-minute rates are counted earlier, when the request is
 * authenticated: src/http/rate-limit.ts.)
 */
export class AdmissionPolicy {
  private readonly observer: DecisionObserver;

  constructor(private readonly deps: AdmissionDeps) {
    this.observer = deps.observer ?? silentObserver;
  }

  /**
   * The credit reservation of one paid request: what it can cost at most, its token bound at the model's prices. A
   * bound over reserve_tokens is refused here, before anything is recorded: no request runs at a price below what it
   * may honestly cost.
   */
  reservationAmount(model: ResolvedModel, bound: TokenBound | RequestBound): Reservation {
    const cap = this.deps.config.limits.reserveTokens;
    if (bound.input > cap || bound.output > cap) {
      this.observer.rejected("token_bound_over_reserve");
      throw new ServiceError(
        "token_bound_over_reserve",
        `This request may use up to ${bound.input} input and ${bound.output} output tokens (its token bound: ${basisOf(bound)}), ` +
          `more than reserve_tokens (${cap}), the most one paid request may reserve; it was not sent to the model and nothing was charged. ` +
          "Send a smaller state, or ask the operator to raise reserve_tokens.",
      );
    }
    const tokens = { input: bound.input, output: bound.output };
    return { amount: tokenCost(model.price, tokens.input, tokens.output), tokens };
  }

  /**
   * 403 model_not_allowed when the request's key may not use the model (`requested`: the name the request gave),
   * before anything is recorded or charged.
   */
  checkModel(ctx: DecisionContext, model: ResolvedModel, requested: string | null | undefined): void {
    try {
      checkModelAllowed(ctx.key?.models ?? null, model.name, requested);
    } catch (err) {
      this.observer.rejected("model_not_allowed");
      throw err;
    }
  }

  /**
   * Admits the request in one durable step, charged as `chargingOf` decides. `bound`: the request's token bound, or
   * how to find it (asked for only when the request is paid).
   */
  async admit(
    ctx: DecisionContext,
    model: ResolvedModel,
    idempotency: IdempotencyRequest | null,
    bound: BoundSource,
  ): Promise<Admitted | Replayed> {
    const { books, clock, config } = this.deps;
    const priced = await this.chargingOf(ctx.source === "batch" ? this.batchPriced(model) : model, bound);
    const now = clock.nowMs();
    // The period is fixed here: the completion settles in the same period's spend, whenever it runs.
    const budget = priced.mode === "paid" ? (ctx.key?.budget ?? null) : null;
    const keyPeriod = budget && utcPeriod(budget.period, now);
    // A key and the keys that replaced it by rotation spend in one row: their lineage's.
    const keySpend = keyPeriod ? { keyId: ctx.key?.lineageId ?? ctx.keyId, period: keyPeriod } : null;
    const charging: Charging = priced.mode === "paid" && keySpend ? { ...priced, keyBudget: keySpend } : priced;
    const command: AdmitCommand = {
      requestId: ctx.requestId,
      orgId: ctx.org.id,
      keyId: ctx.keyId,
      source: ctx.source,
      model: model.name,
      mode: charging.mode,
      nowMs: now,
      instanceId: this.deps.instanceId ?? null,
      idempotency: idempotency && {
        key: idempotency.key,
        requestHash: idempotency.requestHash,
        // A claim blocks other attempts this long if its process dies: beyond any model call.
        lockUntilMs: now + config.reservationTtlSeconds * 1000,
        expiresAtMs: now + IDEMPOTENCY_WINDOW_MS,
      },
      quota:
        charging.mode === "preview"
          ? {
              day: utcDay(now),
              orgLimit: config.limits.previewRequestLimit,
              globalLimit: config.limits.previewGlobalRequestLimit,
              globalBlock: config.limits.previewGlobalBlock,
            }
          : null,
      reservation:
        charging.mode === "paid"
          ? { amountMicrousd: charging.reservation.amount, expiresAtMs: now + config.reservationTtlSeconds * 1000 }
          : null,
      keyBudget: budget && keySpend ? { ...keySpend, limitMicrousd: budget.limitMicrousd } : null,
    };
    let result = await books.admit(command);
    if (result.kind === "idempotency_abandoned" && this.deps.releaseAbandoned) {
      // The key's request will never finish (its process is gone): complete it now, nothing charged, and claim the key.
      const released = await this.deps.releaseAbandoned().then(
        () => true,
        () => false,
      );
      if (released) result = await books.admit(command);
    }
    if (result.kind === "admitted") {
      if (charging.mode === "paid") this.observer.reservation("reserved");
      return { kind: "admitted", acceptedAtMs: now, charging };
    }
    if (result.kind === "replay") return { kind: "replay", response: result.response };
    throw this.refusal(result, now, charging, budget);
  }

  /**
   * A request that a model service failed before it could be admitted, recorded with the service's mode and nothing
   * charged (failure-before-admission.ts); resolves to whether it was recorded.
   */
  recordFailureBeforeAdmission(ctx: DecisionContext, failure: FailureBeforeAdmission): Promise<boolean> {
    const { books, clock, config } = this.deps;
    return recordFailureBeforeAdmission(books, clock, config.serviceMode, ctx, failure);
  }

  /**
   * How the request is charged: the one place that asks whether the service is paid. Paid: its token bound reserved
   * at the model's prices (413 over reserve_tokens, before anything is recorded); preview: counted in the day quotas.
   */
  private async chargingOf(model: ResolvedModel, bound: BoundSource): Promise<Charging> {
    if (this.deps.config.serviceMode !== "paid") return { mode: "preview" };
    const reservation = this.reservationAmount(model, typeof bound === "function" ? await bound() : bound);
    return { mode: "paid", price: model.price, priceInputUsd: model.priceInputUsd, reservation, keyBudget: null };
  }

  /** The model at batch prices: its prices times batch_price_factor. */
  private batchPriced(model: ResolvedModel): ResolvedModel {
    const factor = this.deps.config.batches.priceFactorMillionths;
    if (factor === 1_000_000n) return model;
    const price = scaledPrice(model.price, factor);
    return {
      ...model,
      price,
      priceInputUsd: formatUsd(price.inputPerMillion),
      priceOutputUsd: model.priceOutputUsd === null ? null : formatUsd(price.outputPerMillion),
    };
  }

  /** The error of an admission the books refused. */
  private refusal(
    result: Exclude<AdmitResult, { kind: "admitted" | "replay" }>,
    now: number,
    charging: Charging,
    budget: KeyBudget | null,
  ): ServiceError {
    const { limits } = this.deps.config;
    const reservation = charging.mode === "paid" ? charging.reservation : { amount: 0, tokens: { input: 0, output: 0 } };
    const reserving = `${formatUsd(reservation.amount)} USD for at most ${reservation.tokens.input} input and ${reservation.tokens.output} output tokens`;
    switch (result.kind) {
      case "replay_not_kept":
        return new ServiceError(
          "idempotency_response_not_kept",
          `A request with this Idempotency-Key already succeeded (request_id ${result.requestId}), but its response was too large to keep for replays; find it in Usage by request_id.`,
        );
      case "idempotency_mismatch":
        return new ServiceError("idempotency_key_reused");
      case "idempotency_in_progress":
        if (result.ownerLeaseUntilMs === undefined) return new ServiceError("idempotency_in_progress");
        return new ServiceError(
          "idempotency_in_progress",
          "A request with this Idempotency-Key is still being processed by another gateway process; retry after the time in Retry-After: " +
            "by then it has finished and its stored response is replayed, or, if that process has stopped, the key is released and the retry runs.",
          { retryAfterMs: Math.max(ABANDONED_RETRY_MS, result.ownerLeaseUntilMs - now) },
        );
      case "idempotency_abandoned":
        return new ServiceError(
          "idempotency_in_progress",
          `The request holding this Idempotency-Key (request_id ${result.requestId}) was accepted by a gateway process that has stopped: ` +
            "it will never finish, and the key is being released; retry after the time in Retry-After.",
          { retryAfterMs: ABANDONED_RETRY_MS },
        );
      case "quota_exhausted": {
        const org = result.scope === "org";
        this.observer.rejected(org ? "preview_quota_org" : "preview_quota_global");
        return new ServiceError(
          org ? "preview_quota_org" : "preview_quota_global",
          org
            ? `Daily preview request limit of the organization reached (preview_request_limit = ${limits.previewRequestLimit}); it resets at 00:00 UTC.`
            : `Daily preview capacity of the service reached (preview_global_request_limit = ${limits.previewGlobalRequestLimit}); it resets at 00:00 UTC.`,
          { retryAfterMs: msUntilUtcMidnight(now) },
        );
      }
      case "insufficient_credits": {
        this.observer.reservation("insufficient");
        this.observer.rejected("insufficient_credits");
        return new ServiceError(
          "insufficient_credits",
          `Available credits (${formatUsd(result.availableMicrousd)} USD) cannot cover the reservation of this request: ${reserving}.`,
        );
      }
      case "key_budget_exhausted": {
        this.observer.rejected("key_budget_exhausted");
        const period = charging.mode === "paid" ? (charging.keyBudget?.period ?? "") : "";
        const per = budget?.period === "month" ? "UTC month" : "UTC day";
        const renews = budget ? ` It renews at ${new Date(now + msUntilPeriodEnd(budget.period, now)).toISOString()}.` : "";
        return new ServiceError(
          "key_budget_exhausted",
          `This API key's budget (${formatUsd(budget?.limitMicrousd ?? 0)} USD per ${per}; ${period}) has ${formatUsd(result.remainingMicrousd)} USD left, ` +
            `which cannot cover the reservation of this request: ${reserving}. The organization's credits were not touched.${renews}`,
        );
      }
    }
  }
}
