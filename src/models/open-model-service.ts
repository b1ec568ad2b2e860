import type { Config } from "../config.ts";
import type { ModelService } from "./model-service.ts";
import { createSystemOneHttpService } from "./systemone-http/systemone-http-service.ts";

/** The model service the configuration names, or null when none is configured. */
export function openModelService(config: Config): ModelService | null {
  if (config.modelService) {
    return createSystemOneHttpService({
      baseUrl: config.modelService.url,
      ...(config.modelService.apiKey ? { apiKey: config.modelService.apiKey } : {}),
    });
  }
  return null;
}
