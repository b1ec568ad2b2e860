import type { Config } from "../config.ts";
import type { ModelContext, ModelEntry } from "../contract/models.ts";
import { GatewayError } from "../gateway/errors.ts";
import { parseUsd, type Price } from "../gateway/money.ts";
import { type ModelService, ModelServiceError, type UpstreamModel } from "./model-service.ts";

/** The SDK's default model name; it means "the default model" unless configured otherwise. */
export const SDK_DEFAULT_ALIAS = "jev-latest";
const UPSTREAM_LIST_TTL_MS = 30_000;
const MAX_ALIAS_HOPS = 8;

export interface ResolvedModel {
  /** Public name, reported in responses and usage records. */
  name: string;
  upstreamName: string;
  service: ModelService;
  context?: ModelContext;
  price: Price;
  /** Decimal USD strings as published. */
  priceInputUsd: string;
  priceOutputUsd: string | null;
}

interface Offered {
  name: string;
  upstreamName: string;
  context?: ModelContext;
  priceInputUsd?: string;
  priceOutputUsd?: string;
}

/**
 * Public model names, aliases, the default model, context metadata and prices. Models come from
 * the configuration or, when it lists none, from the model service's own list (cached briefly).
 */
export class ModelRegistry {
  private cached: { at: number; models: Offered[] } | null = null;
  /** Configured aliases and each configured model's own aliases, alias → target name. */
  private readonly aliases: Map<string, string>;

  constructor(
    private readonly config: Pick<Config, "models" | "aliases" | "defaultModel" | "pricing" | "modelTimeoutMs">,
    private readonly service: ModelService | null,
    private readonly nowMs: () => number = Date.now,
  ) {
    this.aliases = new Map(Object.entries(config.aliases));
    for (const m of config.models) for (const alias of m.aliases) this.aliases.set(alias, m.name);
  }

  get configured(): boolean {
    return this.service !== null;
  }

  async list(): Promise<ModelEntry[]> {
    const offered = await this.offered();
    return offered.map((m) => (m.context ? { name: m.name, context: { ...m.context } } : { name: m.name }));
  }

  /** Resolves a requested name (null/undefined = default) to a model, or throws GatewayError. */
  async resolve(requested: string | null | undefined): Promise<ResolvedModel> {
    const service = this.requireService();
    const offered = await this.offered();
    const byName = new Map(offered.map((m) => [m.name, m]));
    const defaultName = this.config.defaultModel ?? offered[0]?.name ?? null;

    let name = requested ?? defaultName;
    for (let hop = 0; name !== null && !byName.has(name) && hop < MAX_ALIAS_HOPS; hop++) {
      const target: string | undefined = this.aliases.has(name)
        ? this.aliases.get(name)
        : name === SDK_DEFAULT_ALIAS
          ? (defaultName ?? undefined)
          : undefined;
      if (target === undefined) break;
      name = target;
    }
    const model = name === null ? undefined : byName.get(name);
    if (!model) {
      if (requested == null) {
        throw new GatewayError("model_not_configured", `The default model "${defaultName}" is not offered by the model service.`);
      }
      throw new GatewayError("unknown_model", `Unknown model ${JSON.stringify(requested)}; GET /v1/models lists the names offered.`, {
        errors: [{ field: "model", message: `unknown model ${JSON.stringify(requested)}; see GET /v1/models for the names offered` }],
      });
    }
    const priceInputUsd = model.priceInputUsd ?? this.config.pricing.pricePerMillionInputUsd;
    const priceOutputUsd = model.priceOutputUsd ?? this.config.pricing.pricePerMillionOutputUsd;
    return {
      name: model.name,
      upstreamName: model.upstreamName,
      service,
      ...(model.context ? { context: model.context } : {}),
      price: { inputPerMillion: parseUsd(priceInputUsd)!, outputPerMillion: priceOutputUsd === null ? 0n : parseUsd(priceOutputUsd)! },
      priceInputUsd,
      priceOutputUsd,
    };
  }

  private requireService(): ModelService {
    if (!this.service) throw new GatewayError("model_not_configured");
    return this.service;
  }

  private async offered(): Promise<Offered[]> {
    const service = this.requireService();
    if (this.config.models.length > 0) {
      return this.config.models.map((m) => ({
        name: m.name,
        upstreamName: m.upstreamName,
        ...(m.context ? { context: m.context } : {}),
        ...(m.pricePerMillionInputUsd ? { priceInputUsd: m.pricePerMillionInputUsd } : {}),
        ...(m.pricePerMillionOutputUsd ? { priceOutputUsd: m.pricePerMillionOutputUsd } : {}),
      }));
    }
    const now = this.nowMs();
    if (this.cached && now - this.cached.at < UPSTREAM_LIST_TTL_MS) return this.cached.models;
    let upstream: UpstreamModel[];
    try {
      upstream = await service.listModels({ timeoutMs: this.config.modelTimeoutMs });
    } catch (err) {
      throw modelServiceFailure(err);
    }
    const models = upstream.map((m) => ({ name: m.name, upstreamName: m.name, ...(m.context ? { context: m.context } : {}) }));
    this.cached = { at: now, models };
    return models;
  }
}

/** Maps a model service failure to the gateway's error; context rejections are the client's, the rest are 502. */
export function modelServiceFailure(err: unknown): GatewayError {
  if (!(err instanceof ModelServiceError)) {
    return new GatewayError("model_invalid_response", "The model service failed unexpectedly.");
  }
  switch (err.kind) {
    case "timeout":
      return new GatewayError("model_timeout", `The model service did not answer in time: ${err.message}`);
    case "context_rejected":
      return new GatewayError("context_rejected", `The model rejected the request's context: ${err.message}`);
    case "invalid_response":
      return new GatewayError("model_invalid_response", `The model service returned an invalid response: ${err.message}`);
    default:
      return new GatewayError("model_unavailable", `The model service is unavailable: ${err.message}`);
  }
}
