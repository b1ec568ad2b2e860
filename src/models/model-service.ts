import type { Question } from "../contract/decision.ts";
import type { ModelContext } from "../contract/models.ts";

/** A model as a model service lists it (GET {url}/v1/models). */
export interface UpstreamModel {
  name: string;
  context?: ModelContext;
}

export interface ModelCall {
  /** The model name the model service knows (after alias resolution). */
  model: string;
  state: unknown;
  questions: Record<string, Question>;
  /**
   * The request's own JSON text of `state` and `questions`, when known: what adapters send, so that every value —
   * numbers above 2^53 or beyond the double range included — reaches the model exactly as the client wrote it.
   */
  text?: { state: string; questions: string };
}

/**
 * The call for another model name (a deployment's upstream name), field by field: `{ ...call, model }` costs V8 a
 * slow path on every request.
 */
export function callFor(call: ModelCall, model: string): ModelCall {
  return { model, state: call.state, questions: call.questions, text: call.text };
}

/** At most this many tokens a call will be reported to use. */
export interface TokenBound {
  input: number;
  output: number;
}

export interface CallOptions {
  /** The call fails with kind "timeout" when the whole answer has not arrived by then. */
  timeoutMs: number;
  /** Aborts the call early (client gone, shutdown); the call then fails with kind "aborted". */
  signal?: AbortSignal;
}

/** What a model service answered. `answers` is unchecked: the gateway checks it against the questions. */
export interface ModelAnswerSet {
  answers: unknown;
  usage: { input_tokens: number; output_tokens: number };
  /** Wall time of the model call as measured by the adapter, in milliseconds. */
  latencyMs: number;
  /** Set by a router over several deployments: the one that answered, and after how many attempts (1 = first try). */
  route?: { deployment: string; attempts: number };
}

export type ModelErrorKind =
  | "unavailable" // connection refused, reset, DNS, socket closed mid-body
  | "timeout" // deadline passed
  | "bad_status" // 5xx or another unexpected status
  | "overloaded" // 429 / 529 from the model service
  | "invalid_response" // not JSON, wrong envelope, bad usage numbers
  | "context_rejected" // the request is longer than the model's context: 413, or a 400/422 whose text says so
  | "refused" // a 400/422 from the model service for a reason of its own (not the context)
  | "aborted" // our own signal fired
  | "not_ready"; // model still loading or failed to load

export interface ModelFailureDetails {
  /** The HTTP status the model service answered with, when it answered. */
  upstreamStatus?: number;
  /** Set by a router on the error it finally throws: the last deployment tried (null when none was) and the attempts made. */
  route?: { deployment: string | null; attempts: number };
  /**
   * The model service's own words (the message of its error body, the start of an unreadable body): they may name
   * hosts, paths, credentials, so they go to the server log only, never to a client or a usage record.
   */
  upstreamText?: string;
  /** Our own words a client may read besides the gateway's fixed message: an engine's loading state, the context limit it enforces. */
  note?: string;
  /** The wait the model service asked for (Retry-After of a 429 / 529), in seconds. */
  retryAfterSeconds?: number;
}

/**
 * A failed model call. `message` is the adapter's own description for the server log (it may name addresses and
 * codes); clients get the gateway's fixed wording per kind (src/gateway/model-failure.ts), plus `note` when set.
 */
export class ModelServiceError extends Error {
  readonly route?: { deployment: string | null; attempts: number };
  readonly upstreamText?: string;
  readonly note?: string;
  readonly retryAfterSeconds?: number;

  constructor(
    readonly kind: ModelErrorKind,
    message: string,
    readonly upstreamStatus?: number,
    details: Omit<ModelFailureDetails, "upstreamStatus"> = {},
  ) {
    super(message);
    this.name = "ModelServiceError";
    if (details.route !== undefined) this.route = details.route;
    if (details.upstreamText !== undefined) this.upstreamText = details.upstreamText;
    if (details.note !== undefined) this.note = details.note;
    if (details.retryAfterSeconds !== undefined) this.retryAfterSeconds = details.retryAfterSeconds;
  }

  /** The same failure with other message, route or details (the rest kept). */
  with(changes: { message?: string } & Omit<ModelFailureDetails, "upstreamStatus">): ModelServiceError {
    const { message, ...details } = changes;
    return new ModelServiceError(this.kind, message ?? this.message, this.upstreamStatus, { ...this.details(), ...details });
  }

  private details(): Omit<ModelFailureDetails, "upstreamStatus"> {
    return {
      ...(this.route !== undefined ? { route: this.route } : {}),
      ...(this.upstreamText !== undefined ? { upstreamText: this.upstreamText } : {}),
      ...(this.note !== undefined ? { note: this.note } : {}),
      ...(this.retryAfterSeconds !== undefined ? { retryAfterSeconds: this.retryAfterSeconds } : {}),
    };
  }
}

/** The evaluation pool of a service that runs the model itself (an in-process engine), at one moment. */
export interface PoolStats {
  /** Contexts evaluating a call. */
  busy: number;
  /** Contexts in all (0 until the model is ready). */
  size: number;
  /** Calls queued for a free context. */
  waiting: number;
}

/**
 * What an in-process engine is doing, as /readyz and the start-up summary show it per model. Never a file-system
 * path (API clients see it).
 */
export interface EngineStatus {
  /**
   * `loading` (an attempt is running), `retrying` (an attempt failed with a problem that can heal; the next one
   * is scheduled), `ready`, `failed` (a problem that cannot heal: no retry), `not_installed` (node-llama-cpp is
   * not installed).
   */
  state: "loading" | "retrying" | "ready" | "failed" | "not_installed";
  /** What is happening, or what went wrong and what to do: the `detail` of the 503 its calls get. */
  detail?: string;
  /** 0 … 1 while loading: the download's, then the model load's progress. */
  progress?: number;
  /** After a failed attempt, until the model is ready: what went wrong the last time. */
  lastError?: string;
  /** Attempts that failed so far (set with `lastError`). */
  failedAttempts?: number;
  /** While retrying: when the next attempt starts (ms since the epoch). */
  nextAttemptAtMs?: number;
  /** Set while the last attempt could not reach the model's download server at all (no DNS, refused, unreachable). */
  offline?: true;
}

export interface ModelService {
  listModels(options: CallOptions): Promise<UpstreamModel[]>;
  decide(call: ModelCall, options: CallOptions): Promise<ModelAnswerSet>;
  /** The tokens `decide` will report at most for this call, when this service can count them (an in-process engine); null otherwise. */
  tokenBound?(call: ModelCall): Promise<TokenBound | null>;
  /**
   * Its evaluation pool, when the service has one (an in-process engine; all zeros until the model is ready).
   * Synchronous and cheap: read at every metrics scrape (`tds_model_pool_busy`, `tds_model_pool_size`, `tds_model_queue_waiting`).
   */
  poolStats?(): PoolStats;
  /**
   * What its engine is doing, when the service runs one in process (loading, retrying, ready, …). Synchronous and
   * cheap: read at every /readyz probe and metrics scrape (through the router's health of each deployment).
   */
  status?(): EngineStatus;
  close(): Promise<void>;
}
