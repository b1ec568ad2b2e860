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
  service: ModelService;
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
    /** The System One model service, if one is configured. */
    private readonly upstream: ModelService | null,
    /** In-process engines by public model name (models with engine "llama"). */
    private readonly engines: ReadonlyMap<string, ModelService> = new Map(),
    private readonly nowMs: () => number = Date.now,
  ) {
    this.aliases = new Map(Object.entries(config.aliases));
    for (const m of config.models) for (const alias of m.aliases) this.aliases.set(alias, m.name);
  }

  get configured(): boolean {
    return this.upstream !== null || this.engines.size > 0;
  }

  /** Every model service behind the registry (for readiness checks and shutdown). */
  services(): ModelService[] {
    return [...(this.upstream ? [this.upstream] : []), ...this.engines.values()];
  }

  async list(): Promise<ModelEntry[]> {
    const offered = await this.offered();
    return offered.map((m) => (m.context ? { name: m.name, context: { ...m.context } } : { name: m.name }));
  }

  /** Resolves a requested name (null/undefined = default) to a model, or throws GatewayError. */
  async resolve(requested: string | null | undefined): Promise<ResolvedModel> {
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
      service: model.service,
      ...(model.context ? { context: model.context } : {}),
      price: { inputPerMillion: parseUsd(priceInputUsd)!, outputPerMillion: priceOutputUsd === null ? 0n : parseUsd(priceOutputUsd)! },
      priceInputUsd,
      priceOutputUsd,
    };
  }

  /**
   * Configured models (each answered by the model service or by its in-process engine), then,
   * when no configured model names the model service, the model service's own list.
   */
  private async offered(): Promise<Offered[]> {
    if (!this.configured) throw new GatewayError("model_not_configured");
    const listed: Offered[] = [];
    for (const m of this.config.models) {
      const service = m.engine === "llama" ? this.engines.get(m.name) : this.upstream;
      if (!service) continue;
      let context = m.context;
      if (m.engine === "llama") {
        try {
          context = (await service.listModels({ timeoutMs: this.config.modelTimeoutMs }))[0]?.context ?? context;
        } catch (err) {
          throw modelServiceFailure(err);
        }
      }
      listed.push({
        name: m.name,
        upstreamName: m.upstreamName,
        service,
        ...(context ? { context } : {}),
        ...(m.pricePerMillionInputUsd ? { priceInputUsd: m.pricePerMillionInputUsd } : {}),
        ...(m.pricePerMillionOutputUsd ? { priceOutputUsd: m.pricePerMillionOutputUsd } : {}),
      });
    }
    if (!this.upstream || this.config.models.some((m) => m.engine === "upstream")) return listed;
    return [...listed, ...(await this.upstreamList(this.upstream)).filter((m) => !listed.some((l) => l.name === m.name))];
  }

  private async upstreamList(upstream: ModelService): Promise<Offered[]> {
    const now = this.nowMs();
    if (this.cached && now - this.cached.at < UPSTREAM_LIST_TTL_MS) return this.cached.models;
    let models: UpstreamModel[];
    try {
      models = await upstream.listModels({ timeoutMs: this.config.modelTimeoutMs });
    } catch (err) {
      throw modelServiceFailure(err);
    }
    const offered = models.map((m) => ({ name: m.name, upstreamName: m.name, service: upstream, ...(m.context ? { context: m.context } : {}) }));
    this.cached = { at: now, models: offered };
    return offered;
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
    case "not_ready":
      return new GatewayError("model_not_ready", err.message);
    case "context_rejected":
      return new GatewayError("context_rejected", `The model rejected the request's context: ${err.message}`);
    case "invalid_response":
      return new GatewayError("model_invalid_response", `The model service returned an invalid response: ${err.message}`);
    default:
      return new GatewayError("model_unavailable", `The model service is unavailable: ${err.message}`);
  }
}
