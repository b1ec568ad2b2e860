import { availableParallelism } from "node:os";
import type { LlamaContext, LlamaContextSequence, LlamaModel, Token } from "node-llama-cpp";
import type { Question } from "../../contract/decision.ts";
import {
  type CallOptions,
  type ModelAnswerSet,
  type ModelCall,
  type TokenBound,
  type ModelService,
  ModelServiceError,
  type UpstreamModel,
} from "../model-service.ts";
import { backendErrorsSince, backendLogMark, getBackend, type GpuSetting, onBackendLog } from "./backend.ts";
import { ChatPrompt, commonPrefixLength, lastPieceKey, memoTokenizer } from "./chat-prompt.ts";
import type { EngineStatus } from "./engine-status.ts";
import { type LabelKind, type LabelSet, NoUsableLabelsError, pickLabels } from "./labels.ts";
import { DEFAULT_MODEL_CACHE_DIR, ModelSourceError, modelSourceKind, publicSourceName, resolveModelSource } from "./model-source.ts";
import { Deadline, SlotPool } from "./pool.ts";
import { renderQuestionText, renderSystemText } from "./prompt.ts";
import { DEFAULT_RETRY_BACKOFF, pause, retryDelayMs, type RetryBackoff } from "./retry.ts";
import { buildAnswer, renormalise, restrictAndRenormalise, uniform } from "./scoring.ts";

export interface LlamaLogger {
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string): void;
}

export interface LlamaServiceOptions {
  /** The model's public name, as `listModels` reports it. */
  name: string;
  /** A local GGUF path, or a hub reference (`hf:owner/repo:quant`, `hf:owner/repo/file.gguf`) or URL. */
  source: string;
  /** Download folder of hub references. Default "./data/models". */
  cacheDir?: string;
  /** The setting that names `source`, for the failure message (default "TDS_MODEL_PATH"). */
  sourceSetting?: string;
  /** CPU threads per context. Default: the available cores divided by `poolSize` (at least 1). */
  threads?: number;
  /** Tokens per context. Default: the model's training context, at most 4096. */
  contextSize?: number;
  /** Contexts, i.e. requests evaluated at the same time. Default: a quarter of the cores, at least 1. */
  poolSize?: number;
  /** Requests that may wait for a context; one more is "overloaded". Default 16. */
  queueLimit?: number;
  /** Tokens per evaluation batch. Results depend on it slightly: keep it fixed. Default 512 (at most contextSize). */
  batchSize?: number;
  /** Lowers the published and enforced max_state (tokens of the state part). */
  maxState?: number;
  /** Lowers the published and enforced max_branch (state plus the longest single question). */
  maxBranch?: number;
  logger?: LlamaLogger;
  /** Model hub base URL (mirrors, tests). Default: node-llama-cpp's (`HF_ENDPOINT`, else the public hub). */
  hubEndpoint?: string;
  /** Waits between load attempts after a failure that can heal. Default 1 s, doubling up to 60 s. */
  retry?: RetryBackoff;
  /** "auto": the best GPU build the install has, with as many layers on the GPU as fit; false (default): CPU only. */
  gpu?: GpuSetting;
}

export type LlamaServiceStatus = EngineStatus;

/** The exact tokens the engine evaluates for a call (for tests and debugging). */
export interface RenderedDecision {
  /** Tokens of the state part: the prompt tokens every question shares (system text with the state). */
  stateTokens: Token[];
  questions: RenderedQuestion[];
  maxState: number;
  maxBranch: number;
}

export interface RenderedQuestion {
  id: string;
  question: Question;
  /** The user message shown to the model. */
  text: string;
  /** The whole prompt up to the answer position (state part first). */
  tokens: Token[];
  labels: string[];
  /** Each label's tokens at the answer position. */
  labelTokens: Token[][];
  singleToken: boolean;
}

export interface LlamaService extends ModelService {
  status(): LlamaServiceStatus;
  /** Contexts in use, contexts in all, and requests waiting for one (zeros until the model is ready). */
  load(): { busy: number; size: number; waiting: number };
  /** Resolves when the model is ready (after any retries); rejects with a `not_ready` ModelServiceError when loading failed for good or the service was closed. */
  ready(): Promise<void>;
  /** The prompt and label tokens of a call, as `decide` would evaluate them (limits are checked too). */
  render(call: ModelCall): Promise<RenderedDecision>;
}

/** Tokens kept free after a question's prompt for the answer's label tokens. */
export const ANSWER_RESERVE_TOKENS = 8;
/** Tokens kept free after a state of max_state tokens for a question. */
export const QUESTION_RESERVE_TOKENS = 64;
export const DEFAULT_CONTEXT_SIZE = 4096;
export const DEFAULT_QUEUE_LIMIT = 16;
export const DEFAULT_BATCH_SIZE = 512;

/** What to change when the model source cannot be had. */
export function sourceHint(sourceSetting = "TDS_MODEL_PATH"): string {
  return `set ${sourceSetting} to a local GGUF file, or TDS_MODEL_SERVICE_URL to a System One server`;
}

/** Said after every failure shown to API clients: the paths and the underlying errors are only logged. */
export const SEE_THE_LOG = "(details in the server log)";

/**
 * A loading failure: `message` (paths, the underlying error) is logged; `publicReason` and `hint` are shown to API
 * clients. One that `canHeal` (the model file or its download) is retried; the others wait for a restart.
 */
class LoadFailure extends Error {
  constructor(
    message: string,
    readonly publicReason: string,
    readonly hint: string,
    readonly canHeal: boolean,
  ) {
    super(message);
    this.name = "LoadFailure";
  }
}

const consoleLogger: LlamaLogger = {
  info: (m) => console.log(`[embedded-model] ${m}`),
  warn: (m) => console.warn(`[embedded-model] ${m}`),
  error: (m) => console.error(`[embedded-model] ${m}`),
};

interface Slot {
  context: LlamaContext;
  sequence: LlamaContextSequence;
}

interface Engine {
  model: LlamaModel;
  prompt: ChatPrompt;
  pool: SlotPool<Slot>;
  maxState: number;
  maxBranch: number;
  contexts: LlamaContext[];
  /** The GPU type the backend uses, or false for the CPU. */
  gpu: string | false;
}

interface Plan {
  stateTokens: Token[];
  questions: RenderedQuestion[];
}

export function createLlamaService(options: LlamaServiceOptions): LlamaService {
  const name = options.name;
  if (typeof name !== "string" || name === "") throw new TypeError("name must be a non-empty string");
  if (typeof options.source !== "string" || options.source.trim() === "") throw new TypeError("source must be a model path or hub reference");
  const logger = options.logger ?? consoleLogger;
  const hint = sourceHint(options.sourceSetting);
  const shownSource = publicSourceName(options.source);
  const poolSize = options.poolSize ?? Math.max(1, Math.floor(availableParallelism() / 4));
  const queueLimit = options.queueLimit ?? DEFAULT_QUEUE_LIMIT;
  const threads = options.threads ?? Math.max(1, Math.floor(availableParallelism() / poolSize));
  positiveInteger("poolSize", poolSize);
  positiveInteger("threads", threads);
  if (!Number.isInteger(queueLimit) || queueLimit < 0) throw new TypeError("queueLimit must be an integer >= 0");
  for (const key of ["contextSize", "batchSize", "maxState", "maxBranch"] as const) {
    if (options[key] !== undefined) positiveInteger(key, options[key] as number);
  }

  const backoff = options.retry ?? DEFAULT_RETRY_BACKOFF;
  let status: EngineStatus = { state: "loading", detail: "starting", progress: 0 };
  /** Since the first failed attempt: what the loading status carries on. */
  let lastFailure: Pick<EngineStatus, "lastError" | "failedAttempts"> = {};
  let engine: Engine | null = null;
  let closed = false;
  const closing = new AbortController();
  const inflight = new Set<Promise<unknown>>();

  // llama.cpp's own warnings and errors once the model is ready (while loading, errors go into the
  // one failure message instead). The backend is process-wide: every ready service logs them.
  const unlistenBackend = onBackendLog((level, message) => {
    if (status.state !== "ready") return;
    if (level === "warn") logger.warn(`llama.cpp: ${message}`);
    else logger.error(`llama.cpp: ${message}`);
  });

  const loading = loadUntilReady();

  /** Attempts to load until the model is ready, a failure cannot heal, or the service is closed. */
  async function loadUntilReady(): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      let e: Engine;
      try {
        e = await load();
      } catch (err) {
        if (closed) break;
        const f = asLoadFailure(err);
        if (!f.canHeal) {
          status = { state: "failed", detail: `the model "${name}" failed to load: ${f.publicReason}; ${f.hint} ${SEE_THE_LOG}` };
          logger.error(`the model "${name}" failed to load: ${f.message}; ${f.hint}`);
          return;
        }
        const waitMs = retryDelayMs(attempt, backoff);
        const at = Date.now() + waitMs;
        lastFailure = { lastError: f.publicReason, failedAttempts: attempt };
        status = {
          state: "retrying",
          detail: `the model "${name}" is still loading: attempt ${attempt} failed (${f.publicReason}), the next starts at ${new Date(at).toISOString()}; ${f.hint} ${SEE_THE_LOG}`,
          ...lastFailure,
          nextAttemptAtMs: at,
        };
        logger.warn(`the model "${name}" failed to load (attempt ${attempt}): ${f.message}; retrying in ${duration(waitMs)}, at ${new Date(at).toISOString()}`);
        await pause(waitMs, closing.signal);
        if (closed) break;
        continue;
      }
      if (closed) {
        void disposeEngine(e);
        break;
      }
      engine = e;
      status = { state: "ready" };
      logger.info(
        `model "${name}" ready${attempt > 1 ? ` after ${attempt} attempts` : ""}: ${e.model.typeDescription} on ${e.gpu === false ? "the CPU" : e.gpu}, ` +
          `context ${e.contexts[0]?.contextSize} tokens × ${poolSize}, max_state ${e.maxState}, max_branch ${e.maxBranch}, chat template ${e.prompt.wrapperName}`,
      );
      return;
    }
    status = { state: "failed", detail: "the model service was closed while loading" };
  }

  function loadingStatus(detail: string, progress: number): EngineStatus {
    return { state: "loading", detail, progress, ...lastFailure };
  }

  function asLoadFailure(err: unknown): LoadFailure {
    if (err instanceof LoadFailure) return err;
    if (err instanceof ModelSourceError) {
      const cacheHint = `set TDS_MODEL_CACHE_DIR to a writable folder with room for the model, or ${hint}`;
      return new LoadFailure(err.message, err.publicMessage, /cache folder/.test(err.publicMessage) ? cacheHint : hint, true);
    }
    return new LoadFailure(err instanceof Error ? err.message : String(err), "an unexpected error", hint, false);
  }

  async function load(): Promise<Engine> {
    const kind = modelSourceKind(options.source);
    let lastLogged = -1;
    const path = await resolveModelSource(options.source, {
      cacheDir: options.cacheDir ?? DEFAULT_MODEL_CACHE_DIR,
      signal: closing.signal,
      ...(options.hubEndpoint ? { hubEndpoint: options.hubEndpoint } : {}),
      onProgress: ({ downloadedBytes, totalBytes }) => {
        const fraction = totalBytes > 0 ? downloadedBytes / totalBytes : 0;
        status = loadingStatus(`downloading ${shownSource}`, fraction);
        const step = Math.floor(fraction * 10);
        if (step !== lastLogged) {
          lastLogged = step;
          logger.info(`downloading ${options.source}: ${mb(downloadedBytes)} of ${mb(totalBytes)} (${Math.floor(fraction * 100)}%)`);
        }
      },
    });
    if (kind !== "file") logger.info(`model file ${path}`);
    status = loadingStatus("loading the model file", 0);

    const llama = await getBackend(options.gpu ?? false).catch((err: unknown) => {
      throw new LoadFailure(
        `the llama.cpp backend cannot be loaded (${err instanceof Error ? err.message : String(err)})`,
        "the llama.cpp backend cannot be loaded on this machine",
        "set TDS_MODEL_SERVICE_URL to a System One server",
        false,
      );
    });
    const mark = backendLogMark();
    let model: LlamaModel;
    try {
      model = await llama.loadModel({
        modelPath: path,
        gpuLayers: llama.gpu === false ? 0 : "auto",
        loadSignal: closing.signal,
        onLoadProgress: (p) => {
          status = loadingStatus("loading the model file", p);
        },
      });
    } catch (err) {
      const native = backendErrorsSince(mark);
      const why = [err instanceof Error ? err.message : String(err), ...native.slice(-2)].join(" — ");
      throw new LoadFailure(`${path} is not a usable GGUF model (${why})`, "the model file is not a usable GGUF model", hint, true);
    }
    try {
      return await prepare(model, llama.gpu);
    } catch (err) {
      await model.dispose().catch(() => {});
      throw err;
    }
  }

  async function prepare(model: LlamaModel, gpu: string | false): Promise<Engine> {
    if (String(model.vocabularyType) === "none") {
      const reason = "the model has no vocabulary (it cannot be prompted)";
      throw new LoadFailure(reason, reason, hint, false);
    }
    const prompt = new ChatPrompt(model, (m) => logger.warn(m));
    const contextSize = options.contextSize ?? Math.min(model.trainContextSize || DEFAULT_CONTEXT_SIZE, DEFAULT_CONTEXT_SIZE);
    const batchSize = Math.min(options.batchSize ?? DEFAULT_BATCH_SIZE, contextSize);
    const contexts: LlamaContext[] = [];
    try {
      for (let i = 0; i < poolSize; i++) {
        contexts.push(
          await model.createContext({
            contextSize,
            batchSize,
            threads,
            sequences: 1,
            flashAttention: false,
            failedCreationRemedy: false,
            createSignal: closing.signal,
          }),
        );
      }
    } catch (err) {
      await Promise.all(contexts.map((c) => c.dispose().catch(() => {})));
      throw new LoadFailure(
        `cannot create a ${contextSize}-token context (${err instanceof Error ? err.message : String(err)})`,
        `cannot create a ${contextSize}-token context`,
        "lower the model's context_size or pool_size in the config file (TDS_CONFIG)",
        false,
      );
    }
    const actual = contexts[0]?.contextSize ?? contextSize;
    const maxBranch = Math.min(options.maxBranch ?? Infinity, actual - ANSWER_RESERVE_TOKENS);
    const maxState = Math.min(options.maxState ?? Infinity, maxBranch - QUESTION_RESERVE_TOKENS);
    if (maxState < 1) {
      await Promise.all(contexts.map((c) => c.dispose().catch(() => {})));
      const reason =
        `the limits leave no room for a state: max_branch is ${maxBranch} tokens (context ${actual}), ` +
        `and ${QUESTION_RESERVE_TOKENS} tokens are kept for a question`;
      throw new LoadFailure(reason, reason, "raise the model's context.max_branch or context_size in the config file (TDS_CONFIG)", false);
    }
    const slots = contexts.map((context) => ({ context, sequence: context.getSequence() }));
    return { model, prompt, pool: new SlotPool(slots, queueLimit), maxState, maxBranch, contexts, gpu };
  }

  async function disposeEngine(e: Engine): Promise<void> {
    await Promise.all(e.contexts.map((c) => c.dispose().catch(() => {})));
    await e.model.dispose().catch(() => {});
  }

  function requireEngine(): Engine {
    if (closed) throw new ModelServiceError("unavailable", "the embedded model service is closed");
    if (engine) return engine;
    if (status.state !== "loading") throw new ModelServiceError("not_ready", status.detail ?? "the model is not loaded");
    const pct = Math.floor((status.progress ?? 0) * 100);
    const last = status.lastError ? `; attempt ${status.failedAttempts} failed (${status.lastError})` : "";
    throw new ModelServiceError("not_ready", `the model is still loading (${pct}%)${status.detail ? `: ${status.detail}` : ""}${last}`);
  }

  /** Renders and tokenizes every question; rejects over-long states and branches before any evaluation. */
  function plan(e: Engine, call: ModelCall): Plan {
    const tokenizer = memoTokenizer(e.model);
    const systemText = renderSystemText(call.state, call.text?.state);
    const probeA = e.prompt.text(systemText, "A");
    const probeB = e.prompt.text(systemText, "B");
    const a = e.prompt.tokens(probeA, tokenizer);
    const stateLength = commonPrefixLength(a, e.prompt.tokens(probeB, tokenizer));
    const stateTokens = a.slice(0, stateLength);
    if (stateLength > e.maxState) {
      throw new ModelServiceError("context_rejected", `state is ${stateLength} tokens; the model's max_state is ${e.maxState}`);
    }

    const probeLabels = e.prompt.labelTokenizer(probeA, tokenizer);
    const probeTail = lastPieceKey(probeA);
    const labelSets = new Map<string, LabelSet>();
    const questions: RenderedQuestion[] = [];
    for (const [id, question] of Object.entries(call.questions)) {
      const [kind, count] = labelKindOf(question);
      const key = `${kind}:${count}`;
      let set = labelSets.get(key);
      if (!set) {
        set = pickLabelsOrFail(id, kind, count, probeLabels);
        labelSets.set(key, set);
      }
      const text = renderQuestionText(question, set.labels);
      const rendered = e.prompt.text(systemText, text);
      const tokens = e.prompt.tokens(rendered, tokenizer);
      // The labels were picked at the probe's answer position. A prompt that ends in the same last
      // piece gives them the same tokens; any other is checked at its own answer position.
      let labelTokens: Token[][];
      if (lastPieceKey(rendered) === probeTail) {
        labelTokens = set.tokens.map((t) => [...t] as Token[]);
      } else {
        const here = e.prompt.labelTokenizer(rendered, tokenizer);
        const picked = set;
        labelTokens = set.labels.map((label, i) => {
          const t = here(label);
          const expected = picked.tokens[i] as number[];
          if (t === null || (picked.singleToken && (t.length !== 1 || t[0] !== expected[0]))) {
            throw new ModelServiceError("invalid_response", `question ${JSON.stringify(id)}: the label ${JSON.stringify(label)} does not tokenize the same after this question`);
          }
          return [...t] as Token[];
        });
      }
      const longestLabel = Math.max(...labelTokens.map((t) => t.length));
      if (longestLabel - 1 > ANSWER_RESERVE_TOKENS) {
        throw new ModelServiceError("invalid_response", `question ${JSON.stringify(id)}: labels of ${longestLabel} tokens are too long`);
      }
      if (tokens.length > e.maxBranch) {
        throw new ModelServiceError(
          "context_rejected",
          `question ${JSON.stringify(id)}: the state plus the question is ${tokens.length} tokens; the model's max_branch is ${e.maxBranch}`,
        );
      }
      questions.push({ id, question, text, tokens, labels: set.labels, labelTokens, singleToken: set.singleToken });
    }
    return { stateTokens, questions };
  }

  /** Evaluates a plan on one context: the state part once, then each question on top of it. */
  async function run(slot: Slot, p: Plan, deadline: Deadline): Promise<{ answers: Record<string, unknown>; input: number; output: number }> {
    const seq = slot.sequence;
    let input = 0;
    let output = 0;
    // A fresh sequence per request: no state (and no timing or usage difference) leaks between requests.
    if (seq.nextTokenIndex > 0) await seq.clearHistory();
    if (p.stateTokens.length > 0) {
      await seq.controlledEvaluate(p.stateTokens);
      input += p.stateTokens.length;
    }
    const answers = Object.create(null) as Record<string, unknown>;
    for (const q of p.questions) {
      deadline.throwIfStopped();
      if (closed) throw new ModelServiceError("unavailable", "the embedded model service is closed");
      const first = await distributionAfter(seq, q.tokens);
      input += first.evaluated;
      output += 1;
      let probabilities: number[] | null;
      if (q.singleToken) {
        probabilities = restrictAndRenormalise(first.distribution, q.labelTokens.map((t) => t[0] as number));
      } else {
        const scored = await sequenceProbabilities(seq, q, first.distribution, deadline);
        output += scored.evaluated;
        probabilities = scored.probabilities;
      }
      if (probabilities === null) {
        logger.warn(
          `question ${JSON.stringify(q.id)}: every label's probability underflowed to 0 (the model's reply would start with ` +
            `another token); answered with the uniform distribution`,
        );
        probabilities = uniform(q.labels.length);
      }
      answers[q.id] = buildAnswer(q.question, probabilities);
    }
    return { answers, input, output };
  }

  /**
   * Multi-token labels: P(label) = Π P(t_j | prompt, t_<j), one next-token distribution per distinct
   * proper prefix of the labels' token sequences, renormalised over the labels.
   */
  async function sequenceProbabilities(
    seq: LlamaContextSequence,
    q: RenderedQuestion,
    first: ReadonlyMap<number, number>,
    deadline: Deadline,
  ): Promise<{ probabilities: number[] | null; evaluated: number }> {
    const distributions = new Map<string, ReadonlyMap<number, number>>([["", first]]);
    const prefixes = new Set<string>();
    for (const tokens of q.labelTokens) {
      for (let j = 1; j < tokens.length; j++) prefixes.add(tokens.slice(0, j).join(","));
    }
    let evaluated = 0;
    for (const key of [...prefixes].sort()) {
      deadline.throwIfStopped();
      const path = key.split(",").map(Number) as Token[];
      const r = await distributionAfter(seq, [...q.tokens, ...path]);
      evaluated += r.evaluated;
      distributions.set(key, r.distribution);
    }
    const weights = q.labelTokens.map((tokens) => {
      let p = 1;
      for (let j = 0; j < tokens.length; j++) {
        const d = distributions.get(tokens.slice(0, j).join(",")) as ReadonlyMap<number, number>;
        p *= d.get(tokens[j] as number) ?? 0;
      }
      return p;
    });
    return { probabilities: renormalise(weights), evaluated };
  }

  /**
   * The full next-token distribution after `tokens`: keeps what the sequence already holds of them,
   * erases the rest (`eraseContextTokenRanges`), evaluates the remainder with `controlledEvaluate`, and
   * reads the plain softmax over the whole vocabulary at the last token.
   */
  async function distributionAfter(seq: LlamaContextSequence, tokens: Token[]): Promise<{ distribution: ReadonlyMap<number, number>; evaluated: number }> {
    const held = seq.contextTokens;
    const keep = Math.min(commonPrefixLength(held, tokens), tokens.length - 1);
    if (held.length > keep) await seq.eraseContextTokenRanges([{ start: keep, end: held.length }]);
    const rest = tokens.slice(keep);
    const last = rest[rest.length - 1] as Token;
    const results = await seq.controlledEvaluate([...rest.slice(0, -1), [last, { generateNext: { probabilities: true } }]]);
    const distribution = results[results.length - 1]?.next.probabilities;
    if (!distribution) throw new ModelServiceError("invalid_response", "the model returned no next-token distribution");
    return { distribution, evaluated: rest.length };
  }

  function track<T>(p: Promise<T>): Promise<T> {
    inflight.add(p);
    const done = () => inflight.delete(p);
    p.then(done, done);
    return p;
  }

  return {
    status: () => ({ ...status }),
    load: () => (engine ? { busy: engine.pool.busy, size: engine.pool.size, waiting: engine.pool.waiting } : { busy: 0, size: 0, waiting: 0 }),

    async ready() {
      await loading;
      if (engine) return;
      throw new ModelServiceError("not_ready", status.detail ?? "the embedded model service is closed");
    },

    async listModels(): Promise<UpstreamModel[]> {
      const e = requireEngine();
      return [{ name, context: { max_state: e.maxState, max_branch: e.maxBranch, strict: true } }];
    },

    async render(call: ModelCall): Promise<RenderedDecision> {
      const e = requireEngine();
      const p = plan(e, call);
      return { stateTokens: p.stateTokens, questions: p.questions, maxState: e.maxState, maxBranch: e.maxBranch };
    },

    /** Exact for the input (the tokens it will evaluate); for multi-token labels, every label token counted. */
    async tokenBound(call: ModelCall): Promise<TokenBound | null> {
      if (!engine) return null;
      let p: Plan;
      try {
        p = plan(engine, call);
      } catch {
        return null; // decide will fail the same way, with nothing charged
      }
      const state = p.stateTokens.length;
      let input = state;
      let output = 0;
      for (const q of p.questions) {
        input += Math.max(0, q.tokens.length - state);
        output += q.singleToken ? 1 : 1 + q.labelTokens.reduce((sum, t) => sum + t.length, 0);
      }
      return { input, output };
    },

    async decide(call: ModelCall, callOptions: CallOptions): Promise<ModelAnswerSet> {
      const started = performance.now();
      const deadline = new Deadline(callOptions.timeoutMs, callOptions.signal);
      try {
        deadline.throwIfStopped();
        const e = requireEngine();
        let p: Plan;
        try {
          p = plan(e, call);
        } catch (err) {
          throw asServiceError(err);
        }
        const lease = await e.pool.acquire(deadline);
        const work = track(
          run(lease.slot, p, deadline).finally(() => {
            lease.release();
          }),
        );
        work.catch(() => {}); // a late failure after our deadline is nobody's to handle
        let result: Awaited<typeof work>;
        try {
          result = await deadline.race(work);
        } catch (err) {
          throw asServiceError(err);
        }
        return {
          answers: result.answers,
          usage: { input_tokens: result.input, output_tokens: result.output },
          latencyMs: performance.now() - started,
        };
      } finally {
        deadline.dispose();
      }
    },

    async close() {
      if (closed) return;
      closed = true;
      unlistenBackend();
      closing.abort();
      const e = engine;
      e?.pool.close(new ModelServiceError("unavailable", "the embedded model service is closed"));
      await Promise.allSettled([...inflight]);
      await loading;
      if (e) {
        engine = null;
        await disposeEngine(e);
      }
    },
  };
}

function labelKindOf(q: Question): [LabelKind, number] {
  switch (q.type) {
    case "choice":
      return ["options", Object.keys(q.criteria).length];
    case "score":
      return ["levels", q.criteria.length];
    case "noul":
      return ["noul", 2];
  }
}

function pickLabelsOrFail(id: string, kind: LabelKind, count: number, tokenize: Parameters<typeof pickLabels>[2]): LabelSet {
  try {
    return pickLabels(kind, count, tokenize);
  } catch (err) {
    if (err instanceof NoUsableLabelsError) {
      throw new ModelServiceError("invalid_response", `question ${JSON.stringify(id)}: this model's vocabulary has no usable labels (${err.message})`);
    }
    throw err;
  }
}

function asServiceError(err: unknown): ModelServiceError {
  if (err instanceof ModelServiceError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new ModelServiceError("unavailable", `the embedded model failed: ${message}`);
}

function positiveInteger(name: string, value: number): void {
  if (!Number.isInteger(value) || value < 1) throw new TypeError(`${name} must be an integer >= 1`);
}

function duration(ms: number): string {
  return ms < 1000 ? `${ms} ms` : `${ms / 1000} s`;
}

function mb(bytes: number): string {
  return `${(bytes / 1e6).toFixed(1)} MB`;
}

