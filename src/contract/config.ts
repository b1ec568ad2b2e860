import { type Static, Type } from "@sinclair/typebox";
import { ServiceMode } from "./decision.ts";
import { ModelContext } from "./models.ts";

const DecimalUsd = Type.String({ pattern: "^(0|[1-9][0-9]{0,8})(\\.[0-9]{1,6})?$", description: "Decimal USD" });
const PositiveInt = Type.Integer({ minimum: 1 });

const Text = Type.String({ minLength: 1 });
const Whole = Type.Integer();
const WholeOrNull = Type.Union([Type.Integer(), Type.Null()]);

/**
 * The optional JSON configuration file named by TDS_CONFIG. Environment variables override it. This schema checks
 * the file's shape and JSON types; the ranges, defaults and meanings of its settings are the settings table's
 * (src/settings/settings-table.ts), whose parsers check a value the same way from either source.
 */
export const ConfigFile = Type.Object(
  {
    host: Type.Optional(Text),
    port: Type.Optional(Whole),
    database_url: Type.Optional(Text),
    redis_url: Type.Optional(Text),
    sqlite_wal_limit_mb: Type.Optional(Whole),
    min_free_disk_mb: Type.Optional(Whole),
    bookkeeping_lanes: Type.Optional(Whole),
    key_cache_ms: Type.Optional(Whole),
    service_mode: Type.Optional(Text),
    model_service: Type.Optional(
      Type.Object({ url: Type.String({ minLength: 1 }), api_key: Type.Optional(Type.String()) }, { additionalProperties: false }),
    ),
    model_services: Type.Optional(
      Type.Array(
        Type.Object(
          {
            name: Type.String({ minLength: 1, maxLength: 100 }),
            url: Type.String({ minLength: 1 }),
            api_key: Type.Optional(Type.String()),
            weight: Type.Optional(Type.Number({ exclusiveMinimum: 0, maximum: 1000 })),
            max_concurrency: Type.Optional(PositiveInt),
          },
          { additionalProperties: false },
        ),
        { description: "Model services by name; models[].deployments refer to them" },
      ),
    ),
    default_model: Type.Optional(Text),
    aliases: Type.Optional(Type.Record(Type.String(), Text)),
    models: Type.Optional(
      Type.Array(
        Type.Object(
          {
            name: Type.String({ minLength: 1, maxLength: 100 }),
            engine: Type.Optional(
              Type.Union([Type.Literal("upstream"), Type.Literal("llama")], {
                description: "upstream (default): the model service; llama: in-process engine",
              }),
            ),
            upstream_name: Type.Optional(Type.String({ minLength: 1 })),
            source: Type.Optional(Type.String({ minLength: 1, description: "llama: a local GGUF path or hf: reference" })),
            threads: Type.Optional(PositiveInt),
            context_size: Type.Optional(Type.Integer({ minimum: 256 })),
            pool_size: Type.Optional(PositiveInt),
            queue_limit: Type.Optional(Type.Integer({ minimum: 0 })),
            batch_size: Type.Optional(PositiveInt),
            gpu: Type.Optional(
              Type.Union([Type.Literal("auto"), Type.Literal(false)], {
                description: 'llama: "auto" uses a GPU build when one loads; false (default) the CPU',
              }),
            ),
            aliases: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 100 }))),
            context: Type.Optional(ModelContext),
            price_per_million_input_usd: Type.Optional(DecimalUsd),
            price_per_million_output_usd: Type.Optional(DecimalUsd),
            deployments: Type.Optional(
              Type.Array(
                Type.Object(
                  {
                    service: Type.Optional(Type.String({ minLength: 1, description: "A name from model_services" })),
                    upstream_name: Type.Optional(Type.String({ minLength: 1 })),
                    engine: Type.Optional(Type.Literal("llama", { description: "The in-process engine instead of a model service" })),
                    source: Type.Optional(Type.String({ minLength: 1 })),
                    threads: Type.Optional(PositiveInt),
                    context_size: Type.Optional(Type.Integer({ minimum: 256 })),
                    pool_size: Type.Optional(PositiveInt),
                    queue_limit: Type.Optional(Type.Integer({ minimum: 0 })),
                    batch_size: Type.Optional(PositiveInt),
                    gpu: Type.Optional(Type.Union([Type.Literal("auto"), Type.Literal(false)])),
                    weight: Type.Optional(Type.Number({ exclusiveMinimum: 0, maximum: 1000 })),
                    max_concurrency: Type.Optional(PositiveInt),
                    fallback: Type.Optional(Type.Boolean({ description: "Used only while no other deployment of the model is healthy" })),
                  },
                  { additionalProperties: false },
                ),
                { minItems: 1 },
              ),
            ),
          },
          { additionalProperties: false },
        ),
      ),
    ),
    pricing: Type.Optional(
      Type.Object(
        { price_per_million_input_usd: Type.Optional(Text), price_per_million_output_usd: Type.Optional(Text) },
        { additionalProperties: false },
      ),
    ),
    limits: Type.Optional(
      Type.Object(
        {
          max_request_bytes: Type.Optional(Whole),
          max_questions: Type.Optional(Whole),
          requests_per_minute: Type.Optional(Whole),
          read_requests_per_minute: Type.Optional(Whole),
          preview_request_limit: Type.Optional(Whole),
          preview_global_request_limit: Type.Optional(Whole),
          preview_global_block: Type.Optional(Whole),
          reserve_tokens: Type.Optional(Whole),
        },
        { additionalProperties: false },
      ),
    ),
    batches: Type.Optional(
      Type.Object(
        {
          max_requests: Type.Optional(Whole),
          max_bytes: Type.Optional(Whole),
          concurrency: Type.Optional(Whole),
          global_concurrency: Type.Optional(Whole),
          completion_window_hours: Type.Optional(Whole),
          retention_days: Type.Optional(Whole),
          price_factor: Type.Optional(Text),
        },
        { additionalProperties: false },
      ),
    ),
    admin_token: Type.Optional(Type.String()),
    metrics_token: Type.Optional(Type.String()),
    routing: Type.Optional(
      Type.Object(
        {
          max_attempts: Type.Optional(Whole),
          attempt_timeout_ms: Type.Optional(WholeOrNull),
          failure_threshold: Type.Optional(Whole),
          cooldown_initial_ms: Type.Optional(Whole),
          cooldown_max_ms: Type.Optional(Whole),
          health_check_interval_ms: Type.Optional(WholeOrNull),
        },
        { additionalProperties: false },
      ),
    ),
    model_cache_dir: Type.Optional(Text),
    model_timeout_ms: Type.Optional(Whole),
    reservation_ttl_seconds: Type.Optional(Whole),
    keep_alive_timeout_ms: Type.Optional(Whole),
    max_connections: Type.Optional(Whole),
    max_connections_per_address: Type.Optional(Whole),
    trusted_proxies: Type.Optional(Type.Array(Text)),
    bootstrap: Type.Optional(Type.Boolean()),
    bootstrap_key_file: Type.Optional(Text),
    log_level: Type.Optional(Text),
    log_format: Type.Optional(Text),
  },
  { additionalProperties: false, title: "ConfigFile" },
);
export type ConfigFile = Static<typeof ConfigFile>;

/** Body of GET /api/config: mode, pricing and every configurable limit by the spec's names. */
export const ServiceConfigResponse = Type.Object(
  {
    contract_version: Type.Literal("1.0.0"),
    service_mode: ServiceMode,
    default_model: Type.Union([Type.String(), Type.Null()]),
    pricing: Type.Object(
      {
        currency: Type.Literal("USD"),
        price_per_million_input_usd: Type.Union([Type.String(), Type.Null()], {
          description: "Default input price; null in preview (free)",
        }),
        price_per_million_output_usd: Type.Union([Type.String(), Type.Null()], {
          description: "Default output price; null when output is not billed or in preview",
        }),
        models: Type.Array(
          Type.Object(
            {
              name: Type.String(),
              price_per_million_input_usd: Type.Union([Type.String(), Type.Null()]),
              price_per_million_output_usd: Type.Union([Type.String(), Type.Null()]),
            },
            { additionalProperties: false },
          ),
          { description: "Models whose price differs from the default" },
        ),
        reservation: Type.Object(
          {
            rule: Type.String(),
            prompt_overhead_tokens: Type.Integer(),
            question_overhead_tokens: Type.Integer(),
            output_tokens_per_question: Type.Integer(),
            cap_tokens: Type.Integer({
              description: "reserve_tokens: a request whose bound (either count) exceeds it is refused, never run at a capped price",
            }),
            over_cap_status: Type.Integer({
              description: "The status of that refusal, before the model call: nothing is recorded or charged",
            }),
          },
          { additionalProperties: false, description: "How a paid request's credit reservation is sized" },
        ),
      },
      { additionalProperties: false },
    ),
    limits: Type.Object(
      {
        max_request_bytes: Type.Integer(),
        max_questions: Type.Integer(),
        requests_per_minute: Type.Integer(),
        read_requests_per_minute: Type.Integer({
          description: "Usage and organization reads (GET /v1/usage…, GET /v1/organization) per organization per minute",
        }),
        preview_request_limit: Type.Integer(),
        preview_global_request_limit: Type.Integer(),
        reserve_tokens: Type.Integer({
          description: "The most input (and output) tokens one paid request may reserve; a larger token bound is refused (413)",
        }),
        max_input_tokens: Type.Integer({ description: "Same setting as reserve_tokens" }),
        max_batch_requests: Type.Integer({ description: "The most request lines one batch submission may hold" }),
        max_batch_bytes: Type.Integer({ description: "Largest batch submission body in bytes" }),
        batch_concurrency: Type.Integer({
          description: "The most requests of one organization's batches running at once, across all instances",
        }),
        batch_global_concurrency: Type.Integer({
          description: "The most batch requests one gateway instance runs at once, all organizations together",
        }),
        batch_completion_window_hours: Type.Integer({
          description: "A batch request not started this many hours after its submission ends with batch_expired",
        }),
        batch_retention_days: Type.Integer({ description: "Ended batches and their results are deleted this many days after they end" }),
        batch_price_factor: Type.String({
          pattern: "^(0|[1-9][0-9]{0,2})(\\.[0-9]{1,6})?$",
          description:
            "Paid mode: batch requests are charged at the model's prices times this decimal factor, each price rounded up to a whole microUSD",
        }),
      },
      { additionalProperties: false },
    ),
  },
  { additionalProperties: false, title: "ServiceConfig" },
);
export type ServiceConfigResponse = Static<typeof ServiceConfigResponse>;
