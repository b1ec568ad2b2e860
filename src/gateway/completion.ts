import type { CompleteCommand, StoredResponse } from "../domain/bookkeeping.ts";
import { ServiceError, statusOf } from "../domain/errors.ts";
import type { ModelAnswerSet } from "../models/model-service.ts";
import type { Charge } from "./charging.ts";

/** The usage record keeps this much of an error's detail. */
const MAX_ERROR_DETAIL_CHARS = 500;

/** Milliseconds to three decimals, never negative. */
export const round3 = (ms: number) => Math.max(0, Math.round(ms * 1000) / 1000);

/** What every completion of one request names: the request, when, how it was routed and charged, and its Idempotency-Key. */
export interface CompletionBase
  extends Pick<
    CompleteCommand,
    "requestId" | "orgId" | "nowMs" | "reserved" | "keyBudget" | "deployment" | "attempts" | "gatewayLatencyMs"
  > {
  idempotencyKey: string | null;
}

/** What a completion says of its ending, beside what its base names. */
type EndingFields = Pick<
  CompleteCommand,
  "outcome" | "httpStatus" | "inputTokens" | "outputTokens" | "costMicrousd" | "latencyMs" | "errorDetail" | "overReservation"
>;

/**
 * The command, field by field: every request builds one, and a copy by rest and spread (`{ idempotencyKey, ...named }`
 * then `{ ...named }`) takes V8 a slow path: several microseconds per request.
 */
function commandOf(base: CompletionBase, ending: EndingFields, response: StoredResponse | null): CompleteCommand {
  return {
    requestId: base.requestId,
    orgId: base.orgId,
    nowMs: base.nowMs,
    reserved: base.reserved,
    keyBudget: base.keyBudget,
    deployment: base.deployment,
    attempts: base.attempts,
    gatewayLatencyMs: base.gatewayLatencyMs,
    outcome: ending.outcome,
    httpStatus: ending.httpStatus,
    inputTokens: ending.inputTokens,
    outputTokens: ending.outputTokens,
    costMicrousd: ending.costMicrousd,
    latencyMs: ending.latencyMs,
    errorDetail: ending.errorDetail,
    overReservation: ending.overReservation,
    idempotency: base.idempotencyKey === null ? null : { key: base.idempotencyKey, response },
  };
}

/** A success: its charge settled from the reservation, its response kept for its Idempotency-Key. */
export function succeededCompletion(base: CompletionBase, charge: Charge, latencyMs: number, response: StoredResponse): CompleteCommand {
  const { input_tokens, output_tokens, cost_microusd } = charge.usage;
  return commandOf(
    base,
    {
      outcome: "succeeded",
      httpStatus: 200,
      inputTokens: input_tokens,
      outputTokens: output_tokens,
      costMicrousd: cost_microusd,
      latencyMs,
      errorDetail: charge.capped
        ? `model reported ${input_tokens} input and ${output_tokens} output tokens, more than reserved; charged the reservation`
        : null,
      overReservation: charge.capped,
    },
    response,
  );
}

/**
 * A failure: nothing charged, the reservation released, the Idempotency-Key claim dropped. `error`: a ServiceError
 * (its status and detail recorded; context_rejected, else model_error), anything else is gateway_error (500).
 * `answerSet`: answers that failed the checks (their tokens and latency are recorded).
 */
export function failedCompletion(base: CompletionBase, error: unknown, answerSet?: ModelAnswerSet): CompleteCommand {
  const known = error instanceof ServiceError;
  return commandOf(
    base,
    {
      outcome: !known ? "gateway_error" : error.code === "context_rejected" ? "context_rejected" : "model_error",
      httpStatus: statusOf(known ? error.code : "internal"),
      inputTokens: answerSet?.usage.input_tokens ?? 0,
      outputTokens: answerSet?.usage.output_tokens ?? 0,
      costMicrousd: 0,
      latencyMs: answerSet ? round3(answerSet.latencyMs) : null,
      errorDetail: (known ? (error.detail ?? error.code) : "internal error after admission; nothing was charged").slice(
        0,
        MAX_ERROR_DETAIL_CHARS,
      ),
      overReservation: false,
    },
    null,
  );
}

/**
 * The second completion of a request whose first did not commit (its outcome may be unknown, e.g. a lost connection
 * during COMMIT): gateway_error, nothing charged, its Idempotency-Key released.
 */
export function storageFailedCompletion(first: CompleteCommand, nowMs: number): CompleteCommand {
  return {
    ...first,
    nowMs,
    outcome: "gateway_error",
    httpStatus: statusOf("storage_unavailable"),
    inputTokens: 0,
    outputTokens: 0,
    costMicrousd: 0,
    latencyMs: null,
    errorDetail: "the outcome could not be stored (storage unavailable); nothing was charged",
    overReservation: false,
    idempotency: first.idempotency && { key: first.idempotency.key, response: null },
  };
}
