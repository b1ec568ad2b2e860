import type { Config } from "../config.ts";
import type { DecisionRequest, DecisionResponse } from "../contract/decision.ts";
import type { CompleteCommand, CompleteResult } from "../domain/bookkeeping.ts";
import type { Clock } from "../domain/clock.ts";
import { ServiceError } from "../domain/errors.ts";
import { type CallOptions, type ModelAnswerSet, type ModelCall, ModelServiceError } from "../models/model-service.ts";
import type { AdmissionPolicy } from "./admission.ts";
import { checkAnswers } from "./answer-check.ts";
import type { Books } from "./books.ts";
import { type Charging, chargeOf } from "./charging.ts";
import { type CompletionBase, failedCompletion, round3, storageFailedCompletion, succeededCompletion } from "./completion.ts";
import type { DecisionContext, DecisionReply, IdempotencyRequest } from "./decision-context.ts";
import { answersMismatch, modelServiceFailure } from "./model-failure.ts";
import { answersMismatchReport, type ModelFailureReport, modelFailureReport } from "./model-failure-report.ts";
import { ModelLookupFailed, type ModelRegistry, type ResolvedModel } from "./model-registry.ts";
import { type DecisionObserver, type DecisionTracer, silentObserver, type TraceAttributes, type TraceStep } from "./observer.ts";
import { tokenBoundOf } from "./token-bound.ts";

export type { DecisionContext, DecisionReply, IdempotencyRequest } from "./decision-context.ts";

/** How long the completion of a request that could not be stored keeps trying in the background. */
export const FALLBACK_COMPLETION_WAIT_MS = 30_000;
/** The pauses between its tries while storage is unavailable: doubling from the first to the most. */
const FALLBACK_FIRST_PAUSE_MS = 100;
const FALLBACK_MAX_PAUSE_MS = 2_000;

export interface PipelineDeps {
  books: Books;
  registry: ModelRegistry;
  admission: AdmissionPolicy;
  clock: Clock;
  config: Pick<Config, "limits" | "modelTimeoutMs">;
  /** Monotonic milliseconds, for latencies. */
  monotonicMs?: () => number;
  observer?: DecisionObserver;
  /** Spans of the steps (OpenTelemetry tracing); absent while tracing is off. */
  tracer?: DecisionTracer;
  /** Work that outlives the response (the completion of a request whose first completion failed); tracked for shutdown. */
  background?: (work: Promise<unknown>) => void;
  /** Told of an unexpected error after admission (it is answered 500 and recorded as gateway_error). */
  onUnexpected?: (err: unknown, requestId: string) => void;
  /**
   * Told of every failed model call of an accepted request (and of a model service that failed while the request's
   * model was being found, before admission), with the model service's own words (for the server log;
   * the client and the usage record get the fixed message of model-failure.ts).
   */
  onModelFailure?: (report: ModelFailureReport) => void;
}

/** An accepted request on its way to completion. */
interface Accepted {
  ctx: DecisionContext;
  model: ResolvedModel;
  /** How it is charged, as its admission decided. */
  charging: Charging;
  idempotency: IdempotencyRequest | null;
  /** Wall time of the model call, once it has ended. */
  callMs: number;
}

/** How an accepted request ended before it is recorded: its completion, and the reply or the error to answer with. */
type Ending =
  | { command: CompleteCommand; reply: DecisionReply; error?: undefined }
  | { command: CompleteCommand; error: unknown; reply?: undefined };

/**
 * (max_questions, before the schema: checkQuestionCount) model → the key's models → admission (one durable step) → model call → answer checks → completion (one durable step)
 * → the reply, sent only after the completion committed. Every admitted request gets a completion attempt
 * whatever happens after admission (model failure, bad answers, an exception, shutdown); when that attempt
 * cannot be stored, a second one (nothing charged) runs in the background, and the expiry sweep is the last resort.
 */
export class DecisionPipeline {
  private readonly monotonicMs: () => number;
  private readonly observer: DecisionObserver;
  private readonly tracer: DecisionTracer | null;

  constructor(private readonly deps: PipelineDeps) {
    this.monotonicMs = deps.monotonicMs ?? (() => performance.now());
    this.observer = deps.observer ?? silentObserver;
    this.tracer = deps.tracer ?? null;
  }

  /**
   * max_questions, checked on the parsed body before the schema is (the route's preValidation), so that a body with
   * thousands of questions is refused after one count instead of a validation of each question. Anything that is
   * not an object of questions is left to the schema.
   */
  checkQuestionCount(body: unknown): void {
    const max = this.deps.config.limits.maxQuestions;
    if (body === null || typeof body !== "object" || Array.isArray(body)) return;
    const questions = (body as Record<string, unknown>).questions;
    if (!Object.hasOwn(body, "questions") || questions === null || typeof questions !== "object" || Array.isArray(questions)) return;
    const count = Object.keys(questions).length;
    if (count > max) {
      throw new ServiceError("invalid_body", undefined, {
        errors: [{ field: "questions", message: `must have at most ${max} questions (max_questions); got ${count}` }],
      });
    }
  }

  /** `text`: the request's own JSON text of `state` and `questions`, forwarded as is when given. */
  async decide(
    ctx: DecisionContext,
    request: DecisionRequest,
    idempotency: IdempotencyRequest | null,
    text?: { state: string; questions: string },
  ): Promise<DecisionReply> {
    const model = await this.resolve(ctx, request.model);
    this.tracer?.annotate({ "tds.request_id": ctx.requestId, "tds.organization_id": ctx.org.id, "tds.model": model.name });
    this.deps.admission.checkModel(ctx, model, request.model);
    const call: ModelCall = text
      ? { model: model.upstreamName, state: request.state, questions: request.questions, text }
      : { model: model.upstreamName, state: request.state, questions: request.questions };
    const step = this.tracer?.step("admission") ?? null;
    const admitting = this.deps.admission.admit(ctx, model, idempotency, () => tokenBoundOf(model, call));
    const admitted = step === null ? await admitting : await ended(step, admitting, (a) => ({ "tds.outcome": a.kind }));
    if (admitted.kind === "replay") {
      this.tracer?.annotate({ "tds.outcome": "replayed" });
      return { status: 200, body: admitted.response.body, requestId: admitted.response.requestId, replayed: true };
    }
    const accepted: Accepted = { ctx, model, charging: admitted.charging, idempotency, callMs: 0 };
    return this.complete(accepted, await this.run(accepted, request, call));
  }

  /**
   * The requested model. A model service that fails while it is being found (502/503, before admission) is logged
   * like a failed model call and recorded (failure-before-admission.ts), so that the request id leads to a record.
   * Refusals (an unknown model, 422) and a gateway with no model service configured (503) are not recorded.
   */
  private async resolve(ctx: DecisionContext, requested: string | null | undefined): Promise<ResolvedModel> {
    try {
      return await this.deps.registry.resolve(requested);
    } catch (err) {
      if (!(err instanceof ModelLookupFailed) || err.status < 500) throw err;
      // The default model may be what could not be found.
      const model = requested ?? this.deps.registry.configuredDefault ?? "(default)";
      this.observer.modelFailed(err.failure instanceof ModelServiceError ? err.failure.kind : "unexpected");
      this.deps.onModelFailure?.(modelFailureReport(err.failure, { requestId: ctx.requestId, model }));
      const error = modelServiceFailure(err.failure, { requestId: ctx.requestId });
      const gatewayLatencyMs = round3(this.monotonicMs() - ctx.startedAt);
      const recorded = await this.deps.admission.recordFailureBeforeAdmission(ctx, { model, error, gatewayLatencyMs });
      throw recorded ? error : err;
    }
  }

  /** The model call and everything up to the reply; never throws (an error becomes the request's ending). */
  private async run(accepted: Accepted, request: DecisionRequest, call: ModelCall): Promise<Ending> {
    const { ctx, model } = accepted;
    const callStart = this.monotonicMs();
    const timeoutMs = this.deps.config.modelTimeoutMs;
    const options: CallOptions = ctx.signal ? { timeoutMs, signal: ctx.signal } : { timeoutMs };
    const step = this.tracer?.step("model call", { "tds.model": model.name }) ?? null;
    let answerSet: ModelAnswerSet;
    try {
      answerSet = await (step === null ? model.service.decide(call, options) : step.within(() => model.service.decide(call, options)));
    } catch (err) {
      step?.end(err, routeAttributes(err instanceof ModelServiceError ? err.route : undefined));
      accepted.callMs = this.monotonicMs() - callStart;
      this.observer.modelFailed(err instanceof ModelServiceError ? err.kind : "unexpected");
      this.deps.onModelFailure?.(modelFailureReport(err, { requestId: ctx.requestId, model: model.name }));
      const route = err instanceof ModelServiceError ? err.route : undefined;
      return this.failed(accepted, modelServiceFailure(err, { requestId: ctx.requestId }), undefined, route);
    }
    accepted.callMs = this.monotonicMs() - callStart;
    step?.end(undefined, routeAttributes(answerSet.route));
    try {
      const checked = checkAnswers(request.questions, answerSet.answers);
      if (!checked.ok) {
        this.observer.modelFailed("answers_mismatch");
        const where = { requestId: ctx.requestId, model: model.name };
        this.deps.onModelFailure?.(answersMismatchReport(checked.problem, answerSet.route, where));
        return this.failed(accepted, answersMismatch(answerSet.route, where), answerSet);
      }
      return this.succeeded(accepted, answerSet, checked.answers);
    } catch (err) {
      this.deps.onUnexpected?.(err, ctx.requestId);
      return this.failed(accepted, err, answerSet);
    }
  }

  private succeeded(accepted: Accepted, answerSet: ModelAnswerSet, answers: DecisionResponse["answers"]): Ending {
    const { ctx, model, charging } = accepted;
    const charge = chargeOf(charging, answerSet.usage.input_tokens, answerSet.usage.output_tokens);
    const latencyMs = round3(answerSet.latencyMs);
    const gatewayLatencyMs = this.gatewayLatency(accepted);
    const response: DecisionResponse = {
      model: model.name,
      request_id: ctx.requestId,
      service_mode: charging.mode,
      answers,
      usage: charge.usage,
      latency_ms: latencyMs,
      gateway_latency_ms: gatewayLatencyMs,
    };
    const body = JSON.stringify(response);
    const base = this.completionBase(accepted, answerSet.route, gatewayLatencyMs);
    return {
      reply: { status: 200, body, requestId: ctx.requestId, replayed: false },
      command: succeededCompletion(base, charge, latencyMs, { status: 200, body, requestId: ctx.requestId }),
    };
  }

  /** The ending of a request that failed after admission: nothing charged, its reservation released. */
  private failed(accepted: Accepted, error: unknown, answerSet?: ModelAnswerSet, route?: ModelServiceError["route"]): Ending {
    const base = this.completionBase(accepted, route ?? answerSet?.route, this.gatewayLatency(accepted));
    return { error, command: failedCompletion(base, error, answerSet) };
  }

  /** `route`: the deployment that answered (or was tried last) and the attempts, when a router served the call. */
  private completionBase(accepted: Accepted, route: ModelServiceError["route"] | undefined, gatewayLatencyMs: number): CompletionBase {
    return {
      requestId: accepted.ctx.requestId,
      orgId: accepted.ctx.org.id,
      nowMs: this.deps.clock.nowMs(),
      reserved: accepted.charging.mode === "paid",
      keyBudget: accepted.charging.mode === "paid" ? accepted.charging.keyBudget : null,
      deployment: route?.deployment ?? null,
      attempts: route?.attempts ?? 1,
      gatewayLatencyMs,
      idempotencyKey: accepted.idempotency?.key ?? null,
    };
  }

  /** Records the ending in one durable step; answers only once it committed. */
  private async complete(accepted: Accepted, ending: Ending): Promise<DecisionReply> {
    let result: CompleteResult;
    this.tracer?.annotate({ "tds.outcome": ending.command.outcome });
    const step = this.tracer?.step("completion", { "tds.outcome": ending.command.outcome }) ?? null;
    try {
      const completing = this.deps.books.complete(ending.command);
      result = step === null ? await completing : await ended(step, completing);
    } catch (err) {
      this.completeInBackground(ending.command);
      throw this.deps.books.classifyFailure(err) !== "other" ? new ServiceError("storage_unavailable") : err;
    }
    const reserved = ending.command.reserved;
    if (result.kind === "reservation_expired" || result.kind === "not_in_flight") {
      if (reserved) this.observer.reservation("expired");
      throw new ServiceError("reservation_expired");
    }
    if (reserved) this.observer.reservation(ending.command.outcome === "succeeded" ? "settled" : "released");
    if (!ending.reply) throw ending.error;
    this.observer.decided(ending.command.gatewayLatencyMs, accepted.callMs);
    return ending.reply;
  }

  /**
   * The first completion did not commit: complete the request again (storageFailedCompletion) if it is still in
   * flight, for up to FALLBACK_COMPLETION_WAIT_MS. Busy storage is waited for by the books; unavailable storage (a
   * lost connection, a database restarting) fails at once there, so it is tried again here after a growing pause.
   * What is still not stored then is left to the expiry sweep.
   */
  private completeInBackground(first: CompleteCommand): void {
    const command = storageFailedCompletion(first, this.deps.clock.nowMs());
    const deadline = this.monotonicMs() + FALLBACK_COMPLETION_WAIT_MS;
    const work = (async () => {
      for (let pause = FALLBACK_FIRST_PAUSE_MS; ; pause = Math.min(pause * 2, FALLBACK_MAX_PAUSE_MS)) {
        try {
          const result = await this.deps.books.complete(command, Math.max(1, deadline - this.monotonicMs()));
          if (result.kind !== "not_in_flight" && command.reserved) this.observer.reservation("released");
          return;
        } catch (err) {
          const left = deadline - this.monotonicMs();
          if (this.deps.books.classifyFailure(err) !== "unavailable" || left <= 0) return;
          await new Promise((resolve) => setTimeout(resolve, Math.min(pause, left)));
        }
      }
    })();
    this.deps.background?.(work);
  }

  private gatewayLatency(accepted: Accepted): number {
    return round3(this.monotonicMs() - accepted.ctx.startedAt - accepted.callMs);
  }
}

/** Ends the step's span when `work` settles (with its error, or the attributes of its value). */
async function ended<T>(step: TraceStep, work: Promise<T>, attributes?: (value: T) => TraceAttributes): Promise<T> {
  let value: T;
  try {
    value = await work;
  } catch (err) {
    step.end(err);
    throw err;
  }
  step.end(undefined, attributes?.(value));
  return value;
}

/** Which deployment served the call (or was tried last) and after how many attempts. */
function routeAttributes(route: { deployment: string | null; attempts: number } | undefined): TraceAttributes | undefined {
  if (route === undefined) return undefined;
  return route.deployment === null
    ? { "tds.attempts": route.attempts }
    : { "tds.deployment": route.deployment, "tds.attempts": route.attempts };
}
