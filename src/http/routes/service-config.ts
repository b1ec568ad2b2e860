import type { FastifyInstance } from "fastify";
import type { Config } from "../../config.ts";
import { ServiceConfigResponse } from "../../contract/config.ts";
import { ErrorResponse } from "../../contract/errors.ts";
import { statusOf } from "../../domain/errors.ts";
import type { ModelRegistry } from "../../gateway/model-registry.ts";
import { PROMPT_OVERHEAD_TOKENS, QUESTION_OVERHEAD_TOKENS } from "../../gateway/token-bound.ts";

/**
 * GET /api/config needs no key: it holds no secrets and the Playground reads it before sign-in. `default_model` is the
 * configured default or, with none, the first model the model services offer (null while none can be reached).
 */
export function serviceConfigRoutes(app: FastifyInstance, config: Config, registry: Pick<ModelRegistry, "defaultModel">) {
  const body = describeConfig(config);
  app.get(
    "/api/config",
    {
      schema: {
        operationId: "getServiceConfig",
        summary: "Service mode, pricing and gateway limits",
        security: [],
        response: { 200: ServiceConfigResponse, 400: ErrorResponse },
      },
    },
    async () => ({ ...body, default_model: await registry.defaultModel() }),
  );
}

export function describeConfig(config: Config): ServiceConfigResponse {
  const paid = config.serviceMode === "paid";
  const { limits, pricing, batches } = config;
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
      reservation: {
        rule:
          "A paid request reserves its token bound at the model's prices: input = the UTF-8 bytes of its state and questions " +
          "+ prompt_overhead_tokens + question_overhead_tokens per question, the state counted at most the model's max_state " +
          "(and max_branch) and each question at most its max_branch when the model has a context (GET /v1/models); the " +
          "in-process engine counts exactly; output = output_tokens_per_question per question. A request whose bound exceeds " +
          "cap_tokens is refused with over_cap_status before the model call. It is charged the tokens the model reports, " +
          "never more than its reservation (a report beyond the bound is charged the reservation and flagged over_reservation).",
        prompt_overhead_tokens: PROMPT_OVERHEAD_TOKENS,
        question_overhead_tokens: QUESTION_OVERHEAD_TOKENS,
        output_tokens_per_question: 1,
        cap_tokens: limits.reserveTokens,
        over_cap_status: statusOf("token_bound_over_reserve"),
      },
    },
    limits: {
      max_request_bytes: limits.maxRequestBytes,
      max_questions: limits.maxQuestions,
      requests_per_minute: limits.requestsPerMinute,
      read_requests_per_minute: limits.readRequestsPerMinute,
      preview_request_limit: limits.previewRequestLimit,
      preview_global_request_limit: limits.previewGlobalRequestLimit,
      reserve_tokens: limits.reserveTokens,
      max_input_tokens: limits.reserveTokens,
      max_batch_requests: batches.maxRequests,
      max_batch_bytes: batches.maxBytes,
      batch_concurrency: batches.concurrency,
      batch_global_concurrency: batches.globalConcurrency,
      batch_completion_window_hours: batches.completionWindowMs / 3_600_000,
      batch_retention_days: batches.retentionDays,
      batch_price_factor: batches.priceFactor,
    },
  };
}
