import type { Config } from "../config.ts";
import type { ModelService } from "./model-service.ts";
import { createSystemOneHttpService } from "./systemone-http/systemone-http-service.ts";

/** The System One model service the configuration names, or null when none is configured. */
export function openModelService(config: Config): ModelService | null {
  if (config.modelService) {
    return createSystemOneHttpService({
      baseUrl: config.modelService.url,
      ...(config.modelService.apiKey ? { apiKey: config.modelService.apiKey } : {}),
    });
  }
  return null;
}

export interface EngineLogger {
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string): void;
}

/**
 * One in-process llama.cpp engine per configured model with engine "llama". Each starts loading
 * (and, for a hub reference, downloading) in the background; node-llama-cpp is imported only when
 * such a model is configured.
 */
export async function openEngines(config: Config, logger: EngineLogger): Promise<Map<string, ModelService>> {
  const engines = new Map<string, ModelService>();
  const embedded = config.models.filter((m) => m.engine === "llama" && m.llama);
  if (embedded.length === 0) return engines;
  const { createLlamaService } = await import("./llama/llama-service.ts");
  for (const m of embedded) {
    const s = m.llama!;
    engines.set(
      m.name,
      createLlamaService({
        name: m.name,
        source: s.source,
        cacheDir: config.modelCacheDir,
        ...(s.sourceSetting ? { sourceSetting: s.sourceSetting } : {}),
        ...(s.threads ? { threads: s.threads } : {}),
        ...(s.contextSize ? { contextSize: s.contextSize } : {}),
        ...(s.poolSize ? { poolSize: s.poolSize } : {}),
        ...(s.queueLimit !== undefined ? { queueLimit: s.queueLimit } : {}),
        ...(s.batchSize ? { batchSize: s.batchSize } : {}),
        ...(m.context?.max_state ? { maxState: m.context.max_state } : {}),
        ...(m.context?.max_branch ? { maxBranch: m.context.max_branch } : {}),
        logger,
      }),
    );
  }
  return engines;
}
