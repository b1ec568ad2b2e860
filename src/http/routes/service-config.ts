import type { FastifyInstance } from "fastify";
import type { Config } from "../../config.ts";
import { ServiceConfigResponse } from "../../contract/config.ts";

/** GET /api/config needs no key: it holds no secrets and the Playground reads it before sign-in. */
export function serviceConfigRoutes(app: FastifyInstance, config: Config) {
  const body = describeConfig(config);
  app.get(
    "/api/config",
    { schema: { summary: "Service mode, pricing and gateway limits", response: { 200: ServiceConfigResponse } } },
    async () => body,
  );
}

export function describeConfig(config: Config): ServiceConfigResponse {
  const paid = config.serviceMode === "paid";
  const { limits, pricing } = config;
  return {
    contract_version: "1.0.0",
    service_mode: config.serviceMode,
    default_model: config.defaultModel,
    pricing: {
      currency: "USD",
      price_per_million_input_usd: paid ? pricing.pricePerMillionInputUsd : null,
      price_per_million_output_usd: paid ? pricing.pricePerMillionOutputUsd : null,
      models: paid
        ? config.models
            .filter((m) => m.pricePerMillionInputUsd !== undefined || m.pricePerMillionOutputUsd !== undefined)
            .map((m) => ({
              name: m.name,
              price_per_million_input_usd: m.pricePerMillionInputUsd ?? pricing.pricePerMillionInputUsd,
              price_per_million_output_usd: m.pricePerMillionOutputUsd ?? pricing.pricePerMillionOutputUsd,
            }))
        : [],
    },
    limits: {
      max_request_bytes: limits.maxRequestBytes,
      max_questions: limits.maxQuestions,
      requests_per_minute: limits.requestsPerMinute,
      preview_request_limit: limits.previewRequestLimit,
      preview_global_request_limit: limits.previewGlobalRequestLimit,
      reserve_tokens: limits.reserveTokens,
      max_input_tokens: limits.reserveTokens,
    },
  };
}
