import type { Config } from "../config.ts";
import type { DecisionRequest, DecisionResponse, Usage } from "../contract/decision.ts";
import type { ModelRegistry, ResolvedModel } from "../models/registry.ts";
import { modelServiceFailure } from "../models/registry.ts";
import type { ModelAnswerSet } from "../models/model-service.ts";
import type { Organization, Store, UsageOutcome, UsageRecord, UsageSource } from "../store/store.ts";
import { checkAnswers } from "./answer-check.ts";
import type { Clock } from "./clock.ts";
import { GatewayError } from "./errors.ts";
import { formatUsd, tokenCost } from "./money.ts";

export interface DecisionContext {
  requestId: string;
  org: Organization;
  keyId: string;
  source: UsageSource;
  /** performance.now() when the request arrived. */
  startedAt: number;
  /** Fires when the client has gone away or the server is shutting down. */
  signal?: AbortSignal;
}

export interface PipelineDeps {
  store: Store;
  registry: ModelRegistry;
  clock: Clock;
  config: Pick<Config, "serviceMode" | "limits" | "modelTimeoutMs">;
  /** Monotonic milliseconds, for latencies. */
  monotonicMs?: () => number;
}

const round3 = (ms: number) => Math.max(0, Math.round(ms * 1000) / 1000);

/** admit → resolve model → call → check answers → settle → record. Pure logic over injected ports. */
export class DecisionPipeline {
  private readonly monotonicMs: () => number;

  constructor(private readonly deps: PipelineDeps) {
    this.monotonicMs = deps.monotonicMs ?? (() => performance.now());
  }

  async decide(ctx: DecisionContext, request: DecisionRequest): Promise<DecisionResponse> {
    const { config, clock } = this.deps;
    const questionCount = Object.keys(request.questions).length;
    if (questionCount > config.limits.maxQuestions) {
      throw new GatewayError("invalid_body", undefined, {
        errors: [{ field: "questions", message: `must have at most ${config.limits.maxQuestions} questions (max_questions); got ${questionCount}` }],
      });
    }
    if (ctx.org.paused) throw new GatewayError("org_paused");
    const model = await this.deps.registry.resolve(request.model);

    // Accepted from here on: every outcome below is recorded exactly once.
    const acceptedAtMs = clock.nowMs();
    let answerSet: ModelAnswerSet;
    try {
      answerSet = await model.service.decide(
        { model: model.upstreamName, state: request.state, questions: request.questions },
        { timeoutMs: config.modelTimeoutMs, ...(ctx.signal ? { signal: ctx.signal } : {}) },
      );
    } catch (err) {
      const failure = modelServiceFailure(err);
      await this.recordFailure(ctx, model, acceptedAtMs, failure);
      throw failure;
    }

    const checked = checkAnswers(request.questions, answerSet.answers);
    if (!checked.ok) {
      const failure = new GatewayError("model_invalid_response", `The model service returned answers that do not match the questions: ${checked.problem}`);
      await this.recordFailure(ctx, model, acceptedAtMs, failure, answerSet);
      throw failure;
    }

    const { input_tokens, output_tokens } = answerSet.usage;
    const usage = this.usageFor(model, input_tokens, output_tokens);
    const latencyMs = round3(answerSet.latencyMs);
    const gatewayLatencyMs = round3(this.monotonicMs() - ctx.startedAt - answerSet.latencyMs);
    await this.deps.store.insertUsage(
      this.record(ctx, model, acceptedAtMs, "succeeded", 200, {
        inputTokens: input_tokens,
        outputTokens: output_tokens,
        costMicrousd: usage.cost_microusd,
        latencyMs,
        gatewayLatencyMs,
        errorDetail: null,
      }),
    );
    return {
      model: model.name,
      request_id: ctx.requestId,
      service_mode: config.serviceMode,
      answers: checked.answers,
      usage,
      latency_ms: latencyMs,
      gateway_latency_ms: gatewayLatencyMs,
    };
  }

  private usageFor(model: ResolvedModel, inputTokens: number, outputTokens: number): Usage {
    if (this.deps.config.serviceMode === "preview") {
      return { input_tokens: inputTokens, output_tokens: outputTokens, cost_microusd: 0, cost_usd: "0", price_per_million_input_usd: null };
    }
    const cost = tokenCost(model.price, inputTokens, outputTokens);
    return {
      input_tokens: inputTokens,
      output_tokens: outputTokens,
      cost_microusd: cost,
      cost_usd: formatUsd(cost),
      price_per_million_input_usd: model.priceInputUsd,
    };
  }

  private async recordFailure(
    ctx: DecisionContext,
    model: ResolvedModel,
    acceptedAtMs: number,
    failure: GatewayError,
    answerSet?: ModelAnswerSet,
  ): Promise<void> {
    const outcome: UsageOutcome = failure.code === "context_rejected" ? "context_rejected" : "model_error";
    await this.deps.store.insertUsage(
      this.record(ctx, model, acceptedAtMs, outcome, failure.code === "context_rejected" ? 422 : 502, {
        inputTokens: answerSet?.usage.input_tokens ?? 0,
        outputTokens: answerSet?.usage.output_tokens ?? 0,
        costMicrousd: 0,
        latencyMs: answerSet ? round3(answerSet.latencyMs) : null,
        gatewayLatencyMs: round3(this.monotonicMs() - ctx.startedAt - (answerSet?.latencyMs ?? 0)),
        errorDetail: (failure.detail ?? failure.code).slice(0, 500),
      }),
    );
  }

  private record(
    ctx: DecisionContext,
    model: ResolvedModel,
    createdAtMs: number,
    outcome: UsageOutcome,
    httpStatus: number,
    numbers: Pick<UsageRecord, "inputTokens" | "outputTokens" | "costMicrousd" | "latencyMs" | "gatewayLatencyMs" | "errorDetail">,
  ): UsageRecord {
    return {
      requestId: ctx.requestId,
      orgId: ctx.org.id,
      keyId: ctx.keyId,
      createdAtMs,
      source: ctx.source,
      model: model.name,
      mode: this.deps.config.serviceMode,
      outcome,
      httpStatus,
      overReservation: false,
      ...numbers,
    };
  }
}
