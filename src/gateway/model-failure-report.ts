import { type ModelAnswerSet, ModelServiceError } from "../models/model-service.ts";

/** The model service's words are logged this far (in characters, before escaping). */
export const MAX_LOGGED_REASON_CHARS = 500;

/** One failed model call of an accepted decision, for the server log (at warn): what the client is never told. */
export interface ModelFailureReport {
  request_id: string;
  /** The public model name. */
  model: string;
  /** The deployment that failed last (null when none was tried). */
  deployment: string | null;
  attempts: number;
  /** The ModelErrorKind, "answers_mismatch" (the answers failed the gateway's checks) or "unexpected" (not a ModelServiceError). */
  failure: string;
  /** The HTTP status the model service answered with, when it answered. */
  upstream_status?: number;
  /** The adapter's description and the model service's own words: bounded, control characters escaped. */
  reason: string;
}

export interface ReportContext {
  requestId: string;
  model: string;
}

export function modelFailureReport(err: unknown, context: ReportContext): ModelFailureReport {
  if (!(err instanceof ModelServiceError)) {
    const reason = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
    return base(context, undefined, "unexpected", reason);
  }
  const reason = err.upstreamText !== undefined ? `${err.message}: ${err.upstreamText}` : err.message;
  return {
    ...base(context, err.route, err.kind, reason),
    ...(err.upstreamStatus !== undefined ? { upstream_status: err.upstreamStatus } : {}),
  };
}

/** `problem`: what the answer check found (it may quote the model's answer). */
export function answersMismatchReport(problem: string, route: ModelAnswerSet["route"], context: ReportContext): ModelFailureReport {
  return base(context, route, "answers_mismatch", problem);
}

function base(
  context: ReportContext,
  route: ModelServiceError["route"] | ModelAnswerSet["route"],
  failure: string,
  reason: string,
): ModelFailureReport {
  return {
    request_id: context.requestId,
    model: context.model,
    deployment: route?.deployment ?? null,
    attempts: route?.attempts ?? 1,
    failure,
    reason: logSafe(reason, MAX_LOGGED_REASON_CHARS),
  };
}

// biome-ignore lint/suspicious/noControlCharactersInRegex: these are the characters to escape
const UNSAFE = /[\\\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const NAMED: Record<string, string> = { "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t" };

/**
 * At most `max` characters (code points; "…" marks a cut) with control, line-separator and bidi characters — and
 * the backslash — escaped (`\n`, `\u001b`), so that a model service's text cannot forge log lines or terminal output.
 */
export function logSafe(text: string, max: number): string {
  const chars = Array.from(text);
  const bounded = chars.length > max ? `${chars.slice(0, max - 1).join("")}…` : text;
  return bounded.replace(UNSAFE, (c) => NAMED[c] ?? `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/**
 * The level of a report in the server log. `not_ready` (an in-process engine still loading, or failed to load) is
 * debug: it repeats with every request while nothing changes, and what changes is logged once where it happens (the
 * engine's own lines, the router's "deployment failing" and "deployment healthy again"). Every other failure is warn.
 */
export function modelFailureLevel(report: Pick<ModelFailureReport, "failure">): "warn" | "debug" {
  return report.failure === "not_ready" ? "debug" : "warn";
}
