import type { Config } from "../config.ts";
import { engineDeployments } from "./engine-id.ts";
import { absentEngine, ENGINE_NOT_INSTALLED, isEnginePackageMissing } from "./llama/engine-absent.ts";
import type { RetryBackoff } from "./llama/retry.ts";
import type { ModelService } from "./model-service.ts";
import { openSystemOneHttpService } from "./systemone-http/systemone-http-service.ts";

/** One System One HTTP client per configured model service, by name (shared by every model it serves). */
export function openModelServices(config: Config): Map<string, ModelService> {
  return new Map(
    config.modelServices.map((s) => [s.name, openSystemOneHttpService({ baseUrl: s.url, ...(s.apiKey ? { apiKey: s.apiKey } : {}) })]),
  );
}

export interface EngineLogger {
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string): void;
}

export interface OpenEnginesOptions {
  /** Loads the engine's module (a test stands in for an install without node-llama-cpp). */
  importEngine?: () => Promise<Pick<typeof import("./llama/llama-service.ts"), "openLlamaService">>;
  /** Waits between attempts to load a model that failed to load (default 1 s doubling up to 60 s). */
  retry?: RetryBackoff;
}

/**
 * One in-process llama.cpp engine per engine deployment, by the label of its EngineId (engine-id.ts). Each starts loading
 * (and, for a hub reference, downloading) in the background; node-llama-cpp is imported only when
 * such a deployment is configured. Without node-llama-cpp installed (an optional dependency), each such
 * deployment is an engine that answers every call with how to install it, and one warning is logged.
 */
export async function openEngines(
  config: Config,
  logger: EngineLogger,
  options: OpenEnginesOptions = {},
): Promise<Map<string, ModelService>> {
  const engines = new Map<string, ModelService>();
  const embedded = engineDeployments(config.models);
  if (embedded.length === 0) return engines;
  const importEngine = options.importEngine ?? (() => import("./llama/llama-service.ts"));
  let engine: Awaited<ReturnType<typeof importEngine>>;
  try {
    engine = await importEngine();
  } catch (err) {
    if (!isEnginePackageMissing(err)) throw err;
    logger.warn(
      `${ENGINE_NOT_INSTALLED} The models on it answer 503: ${embedded.map(({ model }) => JSON.stringify(model.name)).join(", ")}.`,
    );
    for (const { id } of embedded) engines.set(id.label, absentEngine());
    return engines;
  }
  for (const { id, model: m, settings: s } of embedded) {
    engines.set(
      id.label,
      engine.openLlamaService({
        name: m.name,
        source: s.source,
        cacheDir: config.modelCacheDir,
        ...(s.sourceSetting ? { sourceSetting: s.sourceSetting } : {}),
        ...(s.threads ? { threads: s.threads } : {}),
        ...(s.contextSize ? { contextSize: s.contextSize } : {}),
        ...(s.poolSize ? { poolSize: s.poolSize } : {}),
        ...(s.queueLimit !== undefined ? { queueLimit: s.queueLimit } : {}),
        ...(s.batchSize ? { batchSize: s.batchSize } : {}),
        ...(s.gpu ? { gpu: s.gpu } : {}),
        ...(m.context?.max_state ? { maxState: m.context.max_state } : {}),
        ...(m.context?.max_branch ? { maxBranch: m.context.max_branch } : {}),
        ...(options.retry ? { retry: options.retry } : {}),
        logger,
      }),
    );
  }
  return engines;
}
