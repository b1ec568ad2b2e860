import { availableParallelism } from "node:os";
import { nonNegativeInteger, positiveInteger } from "../option-checks.ts";
import type { GpuSetting } from "./backend.ts";
import { DEFAULT_MODEL_CACHE_DIR, publicSourceName } from "./model-source.ts";
import { DEFAULT_RETRY_BACKOFF, type RetryBackoff } from "./retry.ts";

/** The options of an embedded engine, and the settings they come to once checked and defaulted. */

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

export const DEFAULT_CONTEXT_SIZE = 4096;
export const DEFAULT_QUEUE_LIMIT = 16;
export const DEFAULT_BATCH_SIZE = 512;

/** The options with their defaults filled in (those that depend on the model stay optional). */
export interface EngineSettings {
  name: string;
  source: string;
  /** The source as API clients may see it (no local path). */
  shownSource: string;
  cacheDir: string;
  hubEndpoint: string | undefined;
  /** The setting that names `source` ("TDS_MODEL_PATH", or the config file's entry). */
  sourceSetting: string;
  /** What to change when the model source cannot be had (shown to API clients). */
  hint: string;
  poolSize: number;
  queueLimit: number;
  threads: number;
  contextSize: number | undefined;
  batchSize: number | undefined;
  maxState: number | undefined;
  maxBranch: number | undefined;
  gpu: GpuSetting;
  retry: RetryBackoff;
  logger: LlamaLogger;
}

/** What to change when the model source cannot be had. */
export function sourceHint(sourceSetting = "TDS_MODEL_PATH"): string {
  return `set ${sourceSetting} to a local GGUF file, or TDS_MODEL_SERVICE_URL to a System One server`;
}

const consoleLogger: LlamaLogger = {
  info: (m) => console.log(`[embedded-model] ${m}`),
  warn: (m) => console.warn(`[embedded-model] ${m}`),
  error: (m) => console.error(`[embedded-model] ${m}`),
};

/** Checks the options (a TypeError names the first bad one) and fills in the defaults. */
export function engineSettings(options: LlamaServiceOptions): EngineSettings {
  const name = options.name;
  if (typeof name !== "string" || name === "") throw new TypeError("name must be a non-empty string");
  if (typeof options.source !== "string" || options.source.trim() === "")
    throw new TypeError("source must be a model path or hub reference");
  const poolSize = options.poolSize ?? Math.max(1, Math.floor(availableParallelism() / 4));
  const queueLimit = options.queueLimit ?? DEFAULT_QUEUE_LIMIT;
  const threads = options.threads ?? Math.max(1, Math.floor(availableParallelism() / poolSize));
  positiveInteger("poolSize", poolSize);
  positiveInteger("threads", threads);
  nonNegativeInteger("queueLimit", queueLimit);
  for (const key of ["contextSize", "batchSize", "maxState", "maxBranch"] as const) {
    if (options[key] !== undefined) positiveInteger(key, options[key] as number);
  }
  return {
    name,
    source: options.source,
    shownSource: publicSourceName(options.source),
    cacheDir: options.cacheDir ?? DEFAULT_MODEL_CACHE_DIR,
    hubEndpoint: options.hubEndpoint,
    sourceSetting: options.sourceSetting ?? "TDS_MODEL_PATH",
    hint: sourceHint(options.sourceSetting),
    poolSize,
    queueLimit,
    threads,
    contextSize: options.contextSize,
    batchSize: options.batchSize,
    maxState: options.maxState,
    maxBranch: options.maxBranch,
    gpu: options.gpu ?? false,
    retry: options.retry ?? DEFAULT_RETRY_BACKOFF,
    logger: options.logger ?? consoleLogger,
  };
}
