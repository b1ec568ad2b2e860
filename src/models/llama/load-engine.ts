import type { LlamaContext, LlamaContextSequence, LlamaModel } from "node-llama-cpp";
import { backendErrorsSince, backendLogMark, getBackend } from "./backend.ts";
import { ChatPrompt } from "./chat-prompt.ts";
import { DEFAULT_PROGRESS_LOG, progressLogGate } from "./download-progress.ts";
import { DEFAULT_BATCH_SIZE, DEFAULT_CONTEXT_SIZE, type EngineSettings } from "./engine-settings.ts";
import { type ContextLimits, contextLimits, QUESTION_RESERVE_TOKENS } from "./evaluation-plan.ts";
import { ModelSourceError, modelSourceKind, resolveModelSource } from "./model-source.ts";
import type { NetworkProblem } from "./network-probe.ts";
import { SlotPool } from "./pool.ts";

/**
 * One attempt to load an engine: resolve (download) the model source, load the llama.cpp backend and the
 * model, create the contexts and work out the context limits. Every failure is a {@link LoadFailure}.
 */

/** One context of the pool and its only sequence. */
export interface Slot {
  context: LlamaContext;
  sequence: LlamaContextSequence;
}

/** A loaded model, its contexts and its limits: what a ready service evaluates with. */
export interface Engine extends ContextLimits {
  model: LlamaModel;
  prompt: ChatPrompt;
  pool: SlotPool<Slot>;
  contexts: LlamaContext[];
  /** The GPU type the backend uses, or false for the CPU. */
  gpu: string | false;
}

/**
 * A loading failure: `message` (paths, the underlying error) is logged; `publicReason` and `hint` are shown to API
 * clients. One that `canHeal` (the model file or its download) is retried; the others wait for a restart.
 */
export class LoadFailure extends Error {
  constructor(
    message: string,
    readonly publicReason: string,
    readonly hint: string,
    readonly canHeal: boolean,
    /** Set when the model's download server could not be reached at all (offline?). */
    readonly network: NetworkProblem | null = null,
  ) {
    super(message);
    this.name = "LoadFailure";
  }
}

/** Any error of an attempt as a {@link LoadFailure}: a model source problem can heal, an unexpected error cannot. */
export function asLoadFailure(err: unknown, hint: string): LoadFailure {
  if (err instanceof LoadFailure) return err;
  if (err instanceof ModelSourceError) {
    const cacheHint = `set TDS_MODEL_CACHE_DIR to a writable folder with room for the model, or ${hint}`;
    return new LoadFailure(err.message, err.publicMessage, /cache folder/.test(err.publicMessage) ? cacheHint : hint, true, err.network);
  }
  return new LoadFailure(err instanceof Error ? err.message : String(err), "an unexpected error", hint, false);
}

/** Where an attempt is: what it is doing (shown to API clients) and its progress (0 … 1). */
export type LoadProgress = (detail: string, progress: number) => void;

/** One load attempt; `signal` cancels it (download, model load, context creation). */
export async function loadEngine(settings: EngineSettings, signal: AbortSignal, progress: LoadProgress): Promise<Engine> {
  const { logger } = settings;
  const worthALine = progressLogGate({ ...DEFAULT_PROGRESS_LOG, now: Date.now });
  const path = await resolveModelSource(settings.source, {
    cacheDir: settings.cacheDir,
    signal,
    ...(settings.hubEndpoint ? { hubEndpoint: settings.hubEndpoint } : {}),
    onDownloadStart: ({ totalBytes, resuming, directory }) => {
      progress(`downloading ${settings.shownSource}`, 0);
      logger.info(
        `${resuming ? "resuming the download of" : "downloading"} ${settings.source}: ${mb(totalBytes)} into ${directory} ` +
          "(once: later starts find the file there)",
      );
    },
    onProgress: ({ downloadedBytes, totalBytes }) => {
      const fraction = totalBytes > 0 ? downloadedBytes / totalBytes : 0;
      progress(`downloading ${settings.shownSource}`, fraction);
      if (worthALine(downloadedBytes, totalBytes))
        logger.info(`downloading ${settings.source}: ${mb(downloadedBytes)} of ${mb(totalBytes)} (${Math.floor(fraction * 100)}%)`);
    },
  });
  if (modelSourceKind(settings.source) !== "file") logger.info(`model file ${path}`);
  progress("loading the model file", 0);

  const llama = await getBackend(settings.gpu).catch((err: unknown) => {
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
      loadSignal: signal,
      onLoadProgress: (p) => progress("loading the model file", p),
    });
  } catch (err) {
    const native = backendErrorsSince(mark);
    const why = [err instanceof Error ? err.message : String(err), ...native.slice(-2)].join(" — ");
    throw new LoadFailure(`${path} is not a usable GGUF model (${why})`, "the model file is not a usable GGUF model", settings.hint, true);
  }
  try {
    return await prepare(settings, model, llama.gpu, signal);
  } catch (err) {
    await model.dispose().catch(() => {});
    throw err;
  }
}

/** The contexts and limits of a loaded model. */
async function prepare(settings: EngineSettings, model: LlamaModel, gpu: string | false, signal: AbortSignal): Promise<Engine> {
  if (String(model.vocabularyType) === "none") {
    const reason = "the model has no vocabulary (it cannot be prompted)";
    throw new LoadFailure(reason, reason, settings.hint, false);
  }
  const prompt = new ChatPrompt(model, (m) => settings.logger.warn(m));
  const contextSize = settings.contextSize ?? Math.min(model.trainContextSize || DEFAULT_CONTEXT_SIZE, DEFAULT_CONTEXT_SIZE);
  const batchSize = Math.min(settings.batchSize ?? DEFAULT_BATCH_SIZE, contextSize);
  const contexts: LlamaContext[] = [];
  try {
    for (let i = 0; i < settings.poolSize; i++) {
      contexts.push(
        await model.createContext({
          contextSize,
          batchSize,
          threads: settings.threads,
          sequences: 1,
          flashAttention: false,
          failedCreationRemedy: false,
          createSignal: signal,
        }),
      );
    }
  } catch (err) {
    await disposeContexts(contexts);
    throw new LoadFailure(
      `cannot create a ${contextSize}-token context (${err instanceof Error ? err.message : String(err)})`,
      `cannot create a ${contextSize}-token context`,
      "lower the model's context_size or pool_size in the config file (TDS_CONFIG)",
      false,
    );
  }
  const actual = contexts[0]?.contextSize ?? contextSize;
  const { maxState, maxBranch } = contextLimits(actual, settings);
  if (maxState < 1) {
    await disposeContexts(contexts);
    const reason =
      `the limits leave no room for a state: max_branch is ${maxBranch} tokens (context ${actual}), ` +
      `and ${QUESTION_RESERVE_TOKENS} tokens are kept for a question`;
    throw new LoadFailure(reason, reason, "raise the model's context.max_branch or context_size in the config file (TDS_CONFIG)", false);
  }
  const slots = contexts.map((context) => ({ context, sequence: context.getSequence() }));
  return { model, prompt, pool: new SlotPool(slots, settings.queueLimit), maxState, maxBranch, contexts, gpu };
}

/** Frees an engine's contexts, then its model (errors ignored). */
export async function disposeEngine(e: Engine): Promise<void> {
  await disposeContexts(e.contexts);
  await e.model.dispose().catch(() => {});
}

async function disposeContexts(contexts: readonly LlamaContext[]): Promise<void> {
  await Promise.all(contexts.map((c) => c.dispose().catch(() => {})));
}

function mb(bytes: number): string {
  return `${(bytes / 1e6).toFixed(1)} MB`;
}
