import { ServiceError } from "../domain/errors.ts";
import { type ModelAnswerSet, ModelServiceError } from "../models/model-service.ts";

/** Where a failure happened, as far as the gateway knows it. */
export interface FailureContext {
  /** The decision's request id, once it was accepted: the message then says that nothing was charged, and names it. */
  requestId?: string;
}

type Route = ModelServiceError["route"] | ModelAnswerSet["route"];

/**
 * Maps a model service failure to the gateway's error, for the client and the usage record: one fixed sentence per
 * kind, naming the deployment, the status class of the model service's answer (5xx, 4xx) and the request. Never the
 * model service's own words, nor the adapter's description (addresses, codes): those go to the server log
 * (model-failure-report.ts). Only `note` — our own words, set by an in-process engine or a router — is added.
 */
export function modelServiceFailure(err: unknown, context: FailureContext = {}): ServiceError {
  if (!(err instanceof ModelServiceError))
    return failure("model_invalid_response", `${theService(undefined)} failed unexpectedly`, context);
  const service = theService(err.route);
  const answered = err.upstreamStatus !== undefined ? `HTTP ${statusClass(err.upstreamStatus)}` : null;
  switch (err.kind) {
    case "timeout":
      return failure("model_timeout", `${service} did not answer in time`, context);
    case "not_ready":
      return failure("model_not_ready", `The model${deploymentOf(err.route)} is not ready${noteOf(err, ": ")}`, context);
    case "context_rejected":
      return failure(
        "context_rejected",
        `The request is longer than the context of the model${deploymentOf(err.route)}${noteOf(err, ": ")}; shorten the state or the questions`,
        context,
      );
    case "invalid_response":
      return failure("model_invalid_response", `${service} sent an answer that cannot be read${answered ? ` (${answered})` : ""}`, context);
    case "refused":
      return failure("model_invalid_response", `${service} refused the request${answered ? ` (${answered})` : ""}`, context);
    case "bad_status":
      return failure("model_unavailable", `${service} answered ${answered ?? "with an error"}`, context);
    case "overloaded": {
      const wait = err.retryAfterSeconds !== undefined ? `; retry in ${err.retryAfterSeconds} s` : "; retry later";
      const extra = err.retryAfterSeconds !== undefined ? { retryAfterMs: err.retryAfterSeconds * 1000 } : {};
      const why = answered ? ` (${answered})` : noteOf(err, " (", ")");
      return failure("model_unavailable", `${service} is overloaded${why}${wait}`, context, extra);
    }
    case "aborted":
      return failure("model_unavailable", `The call to ${theService(err.route, "the")} was stopped before it finished`, context);
    case "unavailable":
      return failure("model_unavailable", `${service} is unavailable${noteOf(err, " (", ")")}`, context);
  }
}

/** Answers that the gateway's checks refused (what was wrong goes to the server log). */
export function answersMismatch(route: Route, context: FailureContext = {}): ServiceError {
  return failure("model_invalid_response", `${theService(route)} sent answers that do not match the questions`, context);
}

function failure(code: ServiceError["code"], what: string, context: FailureContext, extra: { retryAfterMs?: number } = {}): ServiceError {
  const end = context.requestId !== undefined ? `; no credits were charged (request ${context.requestId}).` : ".";
  return new ServiceError(code, `${what}${end}`, extra);
}

/** `The model service (deployment "gpu-a")`, `… (deployment "gpu-b", after 3 attempts)`, or without a deployment when none was tried. */
function theService(route: Route, article: "The" | "the" = "The"): string {
  return `${article} model service${deploymentOf(route)}`;
}

function deploymentOf(route: Route): string {
  if (!route || route.deployment === null) return "";
  const after = route.attempts > 1 ? `, after ${route.attempts} attempts` : "";
  return ` (deployment ${JSON.stringify(route.deployment)}${after})`;
}

function noteOf(err: ModelServiceError, before: string, after = ""): string {
  const note = err.note?.trim().replace(/\.+$/, "");
  return note ? `${before}${note}${after}` : "";
}

/** 503 → "5xx": which kind of answer it was, without the upstream's exact code. */
function statusClass(status: number): string {
  return `${Math.floor(status / 100)}xx`;
}
