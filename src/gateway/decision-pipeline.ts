import type { Config } from "../config.ts";
import type { DecisionRequest, DecisionResponse, Usage } from "../contract/decision.ts";
import type { ModelRegistry, ResolvedModel } from "../models/registry.ts";
import { modelServiceFailure } from "../models/registry.ts";
import { type ModelAnswerSet, ModelServiceError } from "../models/model-service.ts";
import type { Organization, Store, UsageOutcome, UsageRecord, UsageSource } from "../store/store.ts";
import type { Admission, AdmissionPolicy } from "./admission.ts";
import { checkAnswers } from "./answer-check.ts";
import type { Clock } from "./clock.ts";
import { GatewayError } from "./errors.ts";
import { formatUsd, tokenCost } from "./money.ts";
import { type DecisionObserver, silentObserver } from "./observer.ts";

export interface DecisionContext {
  requestId: string;
  org: Organization;
  keyId: string;
  source: UsageSource;
  /** performance.now() when the request arrived. */
  startedAt: number;
  /** Fires when the server gives up on the request (shutdown). */
  signal?: AbortSignal;
}

export interface PipelineDeps {
  store: Store;
  registry: ModelRegistry;
  admission: AdmissionPolicy;
  clock: Clock;
  config: Pick<Config, "serviceMode" | "limits" | "modelTimeoutMs">;
  /** Monotonic milliseconds, for latencies. */
  monotonicMs?: () => number;
  observer?: DecisionObserver;
}

/** What an accepted request's record needs besides its outcome. */
interface Accepted {
  ctx: DecisionContext;
  model: ResolvedModel;
  admission: Admission;
  acceptedAtMs: number;
  /** Wall time of the model call, once it has ended. */
  callMs: number;
}

const round3 = (ms: number) => Math.max(0, Math.round(ms * 1000) / 1000);

/**
 * validate limits → resolve model → admit (rate, quota or reservation) → call the model →
 * check answers → settle or release → record. Every accepted request is recorded exactly once
 * and its reservation resolved exactly once; no store transaction spans the model call.
 */
export class DecisionPipeline {
  private readonly monotonicMs: () => number;
  private readonly observer: DecisionObserver;

  constructor(private readonly deps: PipelineDeps) {
    this.monotonicMs = deps.monotonicMs ?? (() => performance.now());
    this.observer = deps.observer ?? silentObserver;
  }

  async decide(ctx: DecisionContext, request: DecisionRequest): Promise<DecisionResponse> {
    const { config, clock } = this.deps;
    const questionCount = Object.keys(request.questions).length;
    if (questionCount > config.limits.maxQuestions) {
      throw new GatewayError("invalid_body", undefined, {
        errors: [{ field: "questions", message: `must have at most ${config.limits.maxQuestions} questions (max_questions); got ${questionCount}` }],
      });
    }
    const model = await this.deps.registry.resolve(request.model);
    const admission = await this.deps.admission.admit(ctx.org, ctx.requestId, model);

    const accepted: Accepted = { ctx, model, admission, acceptedAtMs: clock.nowMs(), callMs: 0 };
    const callStart = this.monotonicMs();
    let answerSet: ModelAnswerSet;
    try {
      answerSet = await model.service.decide(
        { model: model.upstreamName, state: request.state, questions: request.questions },
        { timeoutMs: config.modelTimeoutMs, ...(ctx.signal ? { signal: ctx.signal } : {}) },
      );
    } catch (err) {
      accepted.callMs = this.monotonicMs() - callStart;
      this.observer.modelFailed(err instanceof ModelServiceError ? err.kind : "unexpected");
      throw await this.fail(accepted, modelServiceFailure(err));
    }
    accepted.callMs = this.monotonicMs() - callStart;

    const checked = checkAnswers(request.questions, answerSet.answers);
    if (!checked.ok) {
      this.observer.modelFailed("answers_mismatch");
      const failure = new GatewayError("model_invalid_response", `The model service returned answers that do not match the questions: ${checked.problem}`);
      throw await this.fail(accepted, failure, answerSet);
    }
    return this.succeed(accepted, answerSet, checked.answers);
  }

  private async succeed(accepted: Accepted, answerSet: ModelAnswerSet, answers: DecisionResponse["answers"]): Promise<DecisionResponse> {
    const { ctx, model, admission } = accepted;
    const { input_tokens, output_tokens } = answerSet.usage;
    const paid = this.deps.config.serviceMode === "paid";
    const reservation = admission.reservation;
    const fullCost = paid ? tokenCost(model.price, input_tokens, output_tokens) : 0;
    const overReservation = reservation !== null && fullCost > reservation.amountMicrousd;
    const cost = overReservation ? reservation.amountMicrousd : fullCost;
    const latencyMs = round3(answerSet.latencyMs);
    const gatewayLatencyMs = this.gatewayLatency(accepted);
    const record = this.record(accepted, "succeeded", 200, {
      inputTokens: input_tokens,
      outputTokens: output_tokens,
      costMicrousd: cost,
      latencyMs,
      gatewayLatencyMs,
      errorDetail: overReservation ? `model reported ${input_tokens} input and ${output_tokens} output tokens, more than reserved; charged the reservation` : null,
      overReservation,
    });

    if (reservation) {
      const settled = await this.deps.store.settleReservation({ reservationId: reservation.id, costMicrousd: cost, nowMs: this.deps.clock.nowMs(), usage: record });
      this.observer.reservation(settled === "settled" ? "settled" : "expired");
      if (settled !== "settled") {
        const failure = new GatewayError("reservation_expired");
        await this.deps.store.insertUsage(
          this.record(accepted, "reservation_expired", 409, {
            inputTokens: input_tokens,
            outputTokens: output_tokens,
            costMicrousd: 0,
            latencyMs,
            gatewayLatencyMs,
            errorDetail: "the credit reservation expired before settlement; nothing was charged",
            overReservation: false,
          }),
        );
        throw failure;
      }
    } else {
      await this.deps.store.insertUsage(record);
    }
    this.observer.decided(gatewayLatencyMs, accepted.callMs);

    const usage: Usage = paid
      ? { input_tokens, output_tokens, cost_microusd: cost, cost_usd: formatUsd(cost), price_per_million_input_usd: model.priceInputUsd }
      : { input_tokens, output_tokens, cost_microusd: 0, cost_usd: "0", price_per_million_input_usd: null };
    return {
      model: model.name,
      request_id: ctx.requestId,
      service_mode: this.deps.config.serviceMode,
      answers,
      usage,
      latency_ms: latencyMs,
      gateway_latency_ms: gatewayLatencyMs,
    };
  }

  /** Records the failure of an accepted request and returns its whole reservation; returns the error to throw. */
  private async fail(accepted: Accepted, failure: GatewayError, answerSet?: ModelAnswerSet): Promise<GatewayError> {
    const contextRejected = failure.code === "context_rejected";
    const outcome: UsageOutcome = contextRejected ? "context_rejected" : "model_error";
    const status = contextRejected ? 422 : failure.code === "model_not_ready" ? 503 : 502;
    const record = this.record(accepted, outcome, status, {
      inputTokens: answerSet?.usage.input_tokens ?? 0,
      outputTokens: answerSet?.usage.output_tokens ?? 0,
      costMicrousd: 0,
      latencyMs: answerSet ? round3(answerSet.latencyMs) : null,
      gatewayLatencyMs: this.gatewayLatency(accepted),
      errorDetail: (failure.detail ?? failure.code).slice(0, 500),
      overReservation: false,
    });
    const reservation = accepted.admission.reservation;
    if (reservation) {
      const released = await this.deps.store.releaseReservation({ reservationId: reservation.id, nowMs: this.deps.clock.nowMs(), usage: record });
      this.observer.reservation(released === "released" ? "released" : "expired");
    } else {
      await this.deps.store.insertUsage(record);
    }
    return failure;
  }

  private gatewayLatency(accepted: Accepted): number {
    return round3(this.monotonicMs() - accepted.ctx.startedAt - accepted.callMs);
  }

  private record(
    accepted: Accepted,
    outcome: UsageOutcome,
    httpStatus: number,
    numbers: Pick<UsageRecord, "inputTokens" | "outputTokens" | "costMicrousd" | "latencyMs" | "gatewayLatencyMs" | "errorDetail" | "overReservation">,
  ): UsageRecord {
    const { ctx, model } = accepted;
    return {
      requestId: ctx.requestId,
      orgId: ctx.org.id,
      keyId: ctx.keyId,
      createdAtMs: accepted.acceptedAtMs,
      source: ctx.source,
      model: model.name,
      mode: this.deps.config.serviceMode,
      outcome,
      httpStatus,
      ...numbers,
    };
  }
}
