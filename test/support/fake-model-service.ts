/**
 * An in-process ModelService that answers from memory: the answers of the fake model server
 * (test/fixtures/fake-model-server.ts, `fakeAnswers`: deterministic, valid distributions for choice, score and
 * noul) without a socket, for tests of the gateway that need no HTTP and no model.
 *
 * What a call does is chosen by (in order) the next scripted step (`script`, `failNext`, `holdNext`), else a state
 * that is an object with a string field `fake_behavior` (the fake server's vocabulary where it applies, see
 * `stepOfBehavior`), else the default step (`setDefault`), else a normal answer. A step may wait (a delay, a promise
 * the test settles, or forever) — always within the call's deadline ("timeout") and signal ("aborted") — and then
 * fail with any ModelErrorKind, report other token counts, or answer something else than the valid answers.
 *
 * Like the adapters it stands in for:
 * - an already-aborted signal fails "aborted" and a deadline that is not > 0 fails "timeout", before anything else;
 * - the published context is enforced (a state over max_state, or a state plus its longest question over
 *   max_branch, fails "context_rejected" before any wait), and so is the input limit of the fake server;
 * - usage: the fake server's token counts (input: UTF-8 bytes of {state, questions} / 4, output: one per question);
 * - after `close()` every call fails "unavailable"; `close()` lets the calls in flight finish first.
 */
import type { Question } from "../../src/contract/decision.ts";
import {
  type CallOptions,
  type ModelAnswerSet,
  type ModelCall,
  type ModelErrorKind,
  type ModelService,
  ModelServiceError,
  type PoolStats,
  type TokenBound,
  type UpstreamModel,
} from "../../src/models/model-service.ts";
import { DEFAULT_FAKE_MAX_INPUT_TOKENS, DEFAULT_FAKE_MODELS, fakeAnswers, fakeInputTokens } from "../fixtures/fake-model-server.ts";

export const MODEL_ERROR_KINDS: readonly ModelErrorKind[] = [
  "unavailable",
  "timeout",
  "bad_status",
  "overloaded",
  "invalid_response",
  "context_rejected",
  "refused",
  "aborted",
  "not_ready",
];

type Dict<T = unknown> = Record<string, T>;

/** What one call does. Every field is optional; `{}` is a normal answer. */
export interface FakeStep {
  /** Waits this long first. */
  delayMs?: number;
  /** Waits until this promise settles first (a test holds the call in flight, then lets it go). */
  until?: Promise<unknown>;
  /** Never answers: the call ends only by its deadline or its signal. */
  hang?: boolean;
  /** Then fails with this kind (a ModelServiceError, as an adapter throws it). */
  fail?: ModelErrorKind;
  message?: string;
  upstreamStatus?: number;
  /** Then throws this instead (a bug in an adapter: not a ModelServiceError). */
  throws?: unknown;
  /** Reports these token counts instead of the computed ones. */
  usage?: { input_tokens: number; output_tokens: number };
  /** Answers what this returns instead of the valid answers (given a copy of them). */
  answers?: (valid: Dict<Dict>, call: ModelCall) => unknown;
}

export interface FakeModelServiceOptions {
  /** The models listed (default: the fake server's: fake-small with a context, fake-large without). */
  models?: UpstreamModel[];
  /** Input tokens above which a call is "context_rejected" whatever the model (default: the fake server's 8192). */
  maxInputTokens?: number;
  /**
   * The tokens a call reports at most (`tokenBound` of the port): true = exactly what `decide` reports for a normal
   * answer; a function = its result. Default: no `tokenBound` (a service that cannot count, as over HTTP).
   */
  tokenBound?: boolean | ((call: ModelCall) => TokenBound | null);
  /** With a pool: at most this many calls run at once, the others wait (FIFO) within their deadline; `poolStats` is present. */
  poolSize?: number;
  /** Calls that may wait for a slot; one more is "overloaded" at once (default 16). */
  queueLimit?: number;
}

export interface FakeModelService extends ModelService {
  /** Calls made so far (including those that failed). */
  readonly calls: { decide: number; listModels: number; tokenBound: number };
  /** Every decide call, in arrival order. */
  readonly received: ModelCall[];
  /** Calls running now (answering, waiting, or queued for a slot). */
  readonly inFlight: number;
  readonly closed: boolean;
  /** Steps for the next calls, one each, in order (before the state's `fake_behavior` and the default). */
  script(...steps: FakeStep[]): void;
  /** The next `times` calls fail with `kind`. */
  failNext(kind: ModelErrorKind, times?: number, message?: string): void;
  /** The next call waits until `release()` (then answers normally, or as `then` says); resolves `started` when it is in flight. */
  holdNext(then?: FakeStep): { release(): void; started: Promise<void> };
  /** Lets every call held by `holdNext` go on (a test that failed midway must not leave one waiting for its deadline). */
  releaseHeld(): void;
  /** The step of every call that has none scripted and no `fake_behavior`; null = a normal answer. */
  setDefault(step: FakeStep | null): void;
  /** listModels fails with `kind` from now on; null = answers again. */
  failListModels(kind: ModelErrorKind | null): void;
}

/** State- and text-based token counts, as the fake server counts them (UTF-8 bytes / 4, at least 1). */
export function fakeTokens(json: string): number {
  return Math.max(1, Math.ceil(Buffer.byteLength(json, "utf8") / 4));
}

/** The step a `fake_behavior` names (the fake server's names that make sense without a socket, and `fail:KIND`). */
export function stepOfBehavior(behavior: string): FakeStep | null {
  const b = behavior.trim();
  if (b === "" || b === "ok") return {};
  if (b === "hang" || b === "hang-mid-body") return { hang: true };
  if (b === "reset" || b === "reset-mid-body") return { fail: "unavailable", message: "connection reset (fake)" };
  if (b === "garbage" || b === "truncated-json" || b === "html" || b === "no-usage")
    return { fail: "invalid_response", message: `${b} (fake)` };
  if (b === "context-rejected") return { fail: "context_rejected", message: "context length exceeded (fake)" };
  let m = /^delay:(\d+)$/.exec(b);
  if (m) return { delayMs: Number(m[1]) };
  m = /^fail:([a-z_]+)$/.exec(b);
  if (m && (MODEL_ERROR_KINDS as readonly string[]).includes(m[1] as string))
    return { fail: m[1] as ModelErrorKind, message: `scripted ${m[1]} (fake)` };
  m = /^status:(\d{3})$/.exec(b);
  if (m) {
    const status = Number(m[1]);
    const kind: ModelErrorKind =
      status === 429 || status === 529
        ? "overloaded"
        : status === 400 || status === 413 || status === 422
          ? "context_rejected"
          : "bad_status";
    return { fail: kind, upstreamStatus: status, message: `fake status ${status}` };
  }
  m = /^tokens:(\d+):(\d+)$/.exec(b);
  if (m) return { usage: { input_tokens: Number(m[1]), output_tokens: Number(m[2]) } };
  const mutation = ANSWER_MUTATIONS[b];
  if (mutation) return { answers: mutation };
  return null;
}

/** Answer mutations of the fake server that the gateway must refuse (a subset, by the same names). */
export const ANSWER_MUTATIONS: Record<string, (valid: Dict<Dict>, call: ModelCall) => unknown> = {
  "missing-answer": (valid) => {
    delete valid[Object.keys(valid)[0] as string];
    return valid;
  },
  "extra-answer": (valid) => ({ ...valid, __fake_not_supplied__: { type: "noul", noul: 0.5 } }),
  "wrong-type": (valid, call) => {
    const first = Object.keys(call.questions)[0] as string;
    valid[first] =
      call.questions[first]?.type === "noul"
        ? { type: "choice", choice: "true", probabilities: { true: 1 }, confidence: 1 }
        : { type: "noul", noul: 0.5 };
    return valid;
  },
  "bad-probabilities": (valid) => {
    for (const answer of Object.values(valid)) {
      const ps = answer.probabilities as Dict<number> | undefined;
      if (ps) for (const k of Object.keys(ps)) ps[k] = (ps[k] as number) * 1.3;
      else answer.noul = 1.3;
    }
    return valid;
  },
};

function isObject(v: unknown): v is Dict {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** A deep copy through JSON that keeps own keys such as `__proto__` (JSON.parse makes them own properties). */
function copy<T>(value: T): T {
  return JSON.parse(JSON.stringify(value)) as T;
}

/** The call's deadline and signal: `stopped` rejects with "timeout" or "aborted" once either fires. */
class Stop {
  readonly stopped: Promise<never>;
  private timer: NodeJS.Timeout | undefined;
  private readonly onAbort: () => void;

  constructor(
    private readonly options: CallOptions,
    what: string,
  ) {
    let reject!: (e: ModelServiceError) => void;
    this.stopped = new Promise<never>((_, r) => (reject = r));
    this.stopped.catch(() => {});
    this.onAbort = () => reject(new ModelServiceError("aborted", `${what} aborted`));
    options.signal?.addEventListener("abort", this.onAbort, { once: true });
    this.timer = setTimeout(
      () => reject(new ModelServiceError("timeout", `the fake model service did not answer within ${options.timeoutMs} ms`)),
      Math.min(Math.ceil(options.timeoutMs), 2 ** 31 - 1),
    );
  }

  /** Resolves when `work` does, or rejects as soon as the deadline passes or the signal fires. */
  race<T>(work: Promise<T>): Promise<T> {
    return Promise.race([work, this.stopped]);
  }

  dispose(): void {
    clearTimeout(this.timer);
    this.options.signal?.removeEventListener("abort", this.onAbort);
  }
}

function precheck(options: CallOptions, what: string): void {
  if (options.signal?.aborted) throw new ModelServiceError("aborted", `${what} aborted before it started`);
  if (!(options.timeoutMs > 0)) throw new ModelServiceError("timeout", `${what} deadline already passed (timeoutMs ${options.timeoutMs})`);
}

export function createFakeModelService(options: FakeModelServiceOptions = {}): FakeModelService {
  const models = options.models ?? DEFAULT_FAKE_MODELS;
  const maxInputTokens = options.maxInputTokens ?? DEFAULT_FAKE_MAX_INPUT_TOKENS;
  const queueLimit = options.queueLimit ?? 16;
  if (options.poolSize !== undefined && !(Number.isInteger(options.poolSize) && options.poolSize >= 1))
    throw new TypeError("poolSize must be an integer >= 1");
  const calls = { decide: 0, listModels: 0, tokenBound: 0 };
  const received: ModelCall[] = [];
  const steps: FakeStep[] = [];
  let defaultStep: FakeStep | null = null;
  let listFailure: ModelErrorKind | null = null;
  let closed = false;
  let closing: Promise<void> | undefined;
  const running = new Set<Promise<unknown>>();
  const held = new Set<() => void>();

  // The pool: `busy` slots in use, FIFO waiters for one.
  let busy = 0;
  const waiters: Array<() => void> = [];
  async function acquire(stop: Stop): Promise<() => void> {
    const size = options.poolSize;
    const release = () => {
      const next = waiters.shift();
      if (next) next();
      else busy--;
    };
    if (size === undefined) return () => {};
    if (busy < size) {
      busy++;
      return release;
    }
    if (waiters.length >= queueLimit) {
      throw new ModelServiceError(
        "overloaded",
        `the fake model service is busy: ${size} running and ${waiters.length} waiting (queue limit ${queueLimit})`,
      );
    }
    let granted!: () => void;
    const slot = new Promise<void>((r) => (granted = r));
    waiters.push(granted);
    try {
      await stop.race(slot);
    } catch (err) {
      const at = waiters.indexOf(granted);
      if (at >= 0) waiters.splice(at, 1);
      else release(); // granted at the moment the deadline passed: give the slot on
      throw err;
    }
    return release;
  }

  function contextProblem(call: ModelCall): string | null {
    const stateText = call.text?.state ?? JSON.stringify(call.state === undefined ? null : call.state);
    const stateTokens = fakeTokens(stateText);
    const context = models.find((m) => m.name === call.model)?.context;
    if (context?.max_state !== undefined && stateTokens > context.max_state) {
      return `state is ${stateTokens} tokens; the model's max_state is ${context.max_state}`;
    }
    if (context?.max_branch !== undefined) {
      for (const [id, q] of Object.entries(call.questions)) {
        const branch = stateTokens + fakeTokens(JSON.stringify(q));
        if (branch > context.max_branch)
          return `question ${JSON.stringify(id)}: the state plus the question is ${branch} tokens; the model's max_branch is ${context.max_branch}`;
      }
    }
    const input = fakeInputTokens(call.state ?? null, call.questions);
    if (input > maxInputTokens) return `context length exceeded: ${input} tokens > ${maxInputTokens}`;
    return null;
  }

  function usageOf(call: ModelCall): { input_tokens: number; output_tokens: number } {
    return { input_tokens: fakeInputTokens(call.state ?? null, call.questions), output_tokens: Object.keys(call.questions).length };
  }

  function stepFor(call: ModelCall): FakeStep {
    const scripted = steps.shift();
    if (scripted) return scripted;
    if (isObject(call.state) && typeof call.state.fake_behavior === "string") {
      const step = stepOfBehavior(call.state.fake_behavior);
      if (step === null)
        throw new ModelServiceError("bad_status", `fake model service: unknown behaviour ${JSON.stringify(call.state.fake_behavior)}`, 500);
      return step;
    }
    return defaultStep ?? {};
  }

  async function answer(call: ModelCall, callOptions: CallOptions): Promise<ModelAnswerSet> {
    const started = performance.now();
    const stop = new Stop(callOptions, "model call");
    try {
      const step = stepFor(call);
      if (step.fail === undefined && step.throws === undefined) {
        const problem = contextProblem(call);
        if (problem !== null) throw new ModelServiceError("context_rejected", problem, 422);
      }
      const release = await acquire(stop);
      try {
        if (step.delayMs !== undefined) await stop.race(new Promise((r) => setTimeout(r, step.delayMs)));
        if (step.until) await stop.race(step.until);
        if (step.hang) await stop.stopped;
      } finally {
        release();
      }
      if (step.throws !== undefined) throw step.throws;
      if (step.fail !== undefined)
        throw new ModelServiceError(step.fail, step.message ?? `scripted ${step.fail} (fake)`, step.upstreamStatus);
      const valid = fakeAnswers(call.model, call.state ?? null, call.questions as Dict) as Dict<Dict>;
      return {
        answers: step.answers ? step.answers(copy(valid), call) : valid,
        usage: step.usage ?? usageOf(call),
        latencyMs: performance.now() - started,
      };
    } finally {
      stop.dispose();
    }
  }

  function closedError(what: string): ModelServiceError {
    return new ModelServiceError("unavailable", `the fake model service is closed (${what})`);
  }

  const service: FakeModelService = {
    calls,
    received,
    get inFlight() {
      return running.size;
    },
    get closed() {
      return closed;
    },

    async listModels(callOptions: CallOptions): Promise<UpstreamModel[]> {
      calls.listModels++;
      if (closed) throw closedError("listModels");
      precheck(callOptions, "model list");
      if (listFailure !== null) throw new ModelServiceError(listFailure, `scripted ${listFailure} of listModels (fake)`);
      return copy(models);
    },

    decide(call: ModelCall, callOptions: CallOptions): Promise<ModelAnswerSet> {
      calls.decide++;
      received.push(call);
      if (closed) return Promise.reject(closedError("decide"));
      try {
        precheck(callOptions, "model call");
      } catch (err) {
        return Promise.reject(err);
      }
      const work = answer(call, callOptions);
      running.add(work);
      const done = () => running.delete(work);
      work.then(done, done);
      return work;
    },

    close(): Promise<void> {
      closed = true;
      closing ??= Promise.allSettled([...running]).then(() => undefined);
      return closing;
    },

    script(...more: FakeStep[]) {
      steps.push(...more);
    },
    failNext(kind, times = 1, message) {
      for (let i = 0; i < times; i++) steps.push({ fail: kind, ...(message !== undefined ? { message } : {}) });
    },
    holdNext(then = {}) {
      let resolve!: () => void;
      const until = new Promise<void>((r) => (resolve = r));
      const release = () => {
        held.delete(release);
        resolve();
      };
      held.add(release);
      let started!: () => void;
      const startedPromise = new Promise<void>((r) => (started = r));
      // Resolves `started` when the call reaches its wait (the step is taken by the next call).
      steps.push({
        ...then,
        get until() {
          started();
          return until;
        },
      });
      return { release, started: startedPromise };
    },
    releaseHeld() {
      for (const release of [...held]) release();
    },
    setDefault(step) {
      defaultStep = step;
    },
    failListModels(kind) {
      listFailure = kind;
    },
  };

  if (options.tokenBound) {
    const bound = options.tokenBound;
    service.tokenBound = async (call: ModelCall): Promise<TokenBound | null> => {
      calls.tokenBound++;
      if (typeof bound === "function") return bound(call);
      const usage = usageOf(call);
      return { input: usage.input_tokens, output: usage.output_tokens };
    };
  }
  if (options.poolSize !== undefined) {
    const size = options.poolSize;
    service.poolStats = (): PoolStats => ({ busy, size, waiting: waiters.length });
  }
  return service;
}

/** A question of each type, for tests that need any valid call. */
export const MIXED_QUESTIONS: Record<string, Question> = {
  topic: {
    type: "choice",
    instructions: "What is the ticket about?",
    criteria: { billing: "Payments and invoices", bug: "Something broken", other: null },
  },
  urgency: { type: "score", instructions: "How urgent is it?", criteria: ["not urgent", "soon", "today", "now"] },
  refund: { type: "noul", instructions: "Does the customer ask for a refund?" },
};
