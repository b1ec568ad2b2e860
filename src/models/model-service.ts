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
  close(): Promise<void>;
}
