import type { Config } from "../config.ts";
import { engineKey } from "../config-models.ts";
import type { ModelService } from "./model-service.ts";
import { createSystemOneHttpService } from "./systemone-http/systemone-http-service.ts";

/** One System One HTTP client per configured model service, by name (shared by every model it serves). */
export function openModelServices(config: Config): Map<string, ModelService> {
  return new Map(
    config.modelServices.map((s) => [s.name, createSystemOneHttpService({ baseUrl: s.url, ...(s.apiKey ? { apiKey: s.apiKey } : {}) })]),
  );
}

export interface EngineLogger {
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string): void;
}

/**
 * One in-process llama.cpp engine per engine deployment, by engineKey(model, index). Each starts loading
 * (and, for a hub reference, downloading) in the background; node-llama-cpp is imported only when
 * such a deployment is configured.
 */
export async function openEngines(config: Config, logger: EngineLogger): Promise<Map<string, ModelService>> {
  const engines = new Map<string, ModelService>();
  const embedded = config.models.flatMap((m) => m.deployments.flatMap((d, i) => (d.llama ? [{ m, s: d.llama, key: engineKey(m.name, i) }] : [])));
  if (embedded.length === 0) return engines;
  const { createLlamaService } = await import("./llama/llama-service.ts");
  for (const { m, s, key } of embedded) {
    engines.set(
      key,
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
