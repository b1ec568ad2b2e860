import type { Config } from "../config.ts";
import { engineKey, listingServices } from "../config-models.ts";
import type { ModelContext, ModelEntry } from "../contract/models.ts";
import { ServiceError } from "../domain/errors.ts";
import { type Price, parseUsd } from "../domain/money.ts";
import type { ModelService, UpstreamModel } from "../models/model-service.ts";
import { createModelRouter } from "../models/routing/router.ts";
import type { DeploymentInput, ModelRouter, RouterHealth, RouterObserver, RouterOptions } from "../models/routing/types.ts";
import { modelServiceFailure } from "./model-failure.ts";

/** The SDK's default model name; it means "the default model" unless configured otherwise. */
export const SDK_DEFAULT_ALIAS = "jev-latest";
const SERVICE_LIST_TTL_MS = 30_000;
const MAX_ALIAS_HOPS = 8;

export interface ResolvedModel {
  /** Public name, reported in responses and usage records. */
  name: string;
  /** The name in the call; each deployment replaces it with the name its service knows. */
  upstreamName: string;
  /** The model's router over its deployments. */
  service: ModelService;
  context?: ModelContext;
  price: Price;
  /** Decimal USD strings as published. */
  priceInputUsd: string;
  priceOutputUsd: string | null;
}

/**
 * A model service failed while the models offered were being found (before any request could be accepted): the
 * gateway's error for it (model-failure.ts), with the failure itself for the server log.
 */
export class ModelLookupFailed extends ServiceError {
  readonly failure: unknown;
  constructor(failure: unknown) {
    const mapped = modelServiceFailure(failure);
    super(mapped.code, mapped.detail, mapped.extra);
    this.failure = failure;
  }
}

export interface RegistryOptions {
  nowMs?: () => number;
  /** Options of every model's router; `observerFor` gives each model's router its observer (metrics, logs). */
  router?: Omit<RouterOptions, "observer">;
  observerFor?: (model: string) => RouterObserver;
}

interface Offered {
  name: string;
  router: ModelRouter;
  /** The configured context (published as is), or none: the smallest the deployments publish. */
  context?: ModelContext;
  priceInputUsd?: string;
  priceOutputUsd?: string;
}

/**
 * Public model names, aliases, the default model, context metadata and prices, and one router per model over its
 * deployments (src/models/routing). Models come from the configuration; when no configured model is served by a
 * model service, the services' own lists are offered too (each model by every service that lists it, cached briefly).
 */
export class ModelRegistry {
  /** Configured models, in configuration order. */
  private readonly configured: Offered[] = [];
  /** Models discovered from the services' lists, with the services that list each. */
  private discovered: { at: number; models: Offered[] } | null = null;
  private readonly discoveredRouters = new Map<string, { key: string; router: ModelRouter }>();
  /**
   * Each service's most recent answered list. A service that does not answer keeps its deployments (counted down by
   * /readyz, checked again by its routers) until it answers with a list that lacks the model.
   */
  private readonly lastLists = new Map<string, UpstreamModel[]>();
  /** Configured aliases and each configured model's own aliases, alias → target name. */
  private readonly aliases: Map<string, string>;
  private readonly nowMs: () => number;
  private started = false;

  constructor(
    private readonly config: Pick<Config, "models" | "modelServices" | "aliases" | "defaultModel" | "pricing" | "modelTimeoutMs">,
    /** The model services by name (HTTP clients; shared by every model they serve). */
    private readonly services: ReadonlyMap<string, ModelService>,
    /** In-process engines by engineKey(model, deployment index). */
    engines: ReadonlyMap<string, ModelService> = new Map(),
    private readonly options: RegistryOptions = {},
  ) {
    this.nowMs = options.nowMs ?? Date.now;
    this.aliases = new Map(Object.entries(config.aliases));
    for (const m of config.models) {
      for (const alias of m.aliases) this.aliases.set(alias, m.name);
      const deployments: DeploymentInput[] = [];
      m.deployments.forEach((d, i) => {
        const service = d.service === null ? engines.get(engineKey(m.name, i)) : services.get(d.service);
        if (service)
          deployments.push({
            name: d.name,
            service,
            upstreamName: d.upstreamName,
            weight: d.weight,
            maxConcurrency: d.maxConcurrency,
            fallback: d.fallback,
          });
      });
      if (deployments.length === 0) continue;
      this.configured.push({
        name: m.name,
        router: this.router(m.name, deployments),
        ...(m.context ? { context: m.context } : {}),
        ...(m.pricePerMillionInputUsd ? { priceInputUsd: m.pricePerMillionInputUsd } : {}),
        ...(m.pricePerMillionOutputUsd ? { priceOutputUsd: m.pricePerMillionOutputUsd } : {}),
      });
    }
  }

  /** The configured default model; null when the default is the first model offered. */
  get configuredDefault(): string | null {
    return this.config.defaultModel;
  }

  get isConfigured(): boolean {
    return this.configured.length > 0 || this.services.size > 0;
  }

  /** Starts every router's active health checks (models discovered later start theirs when they appear). */
  start(): void {
    this.started = true;
    for (const m of this.configured) m.router.start();
    for (const { router } of this.discoveredRouters.values()) router.start();
  }

  async close(): Promise<void> {
    this.started = false;
    await Promise.all([
      ...this.configured.map((m) => m.router.close()),
      ...[...this.discoveredRouters.values()].map((d) => d.router.close()),
    ]);
  }

  /** Each offered model's router health (for readiness, metrics and the console). */
  health(): Array<{ model: string } & RouterHealth> {
    return this.routers().map((r) => ({ model: r.model, ...r.health() }));
  }

  /** Every model router (configured and discovered so far). */
  routers(): ModelRouter[] {
    return [...this.configured.map((m) => m.router), ...[...this.discoveredRouters.values()].map((d) => d.router)];
  }

  /**
   * The models offered with their context. A model whose context cannot be had now (an engine still loading, or not
   * installed) is listed by name only while another model answers; when none answers, the first failure is the answer.
   */
  async list(): Promise<ModelEntry[]> {
    const offered = await this.offered();
    const settled = await Promise.allSettled(offered.map(async (m) => m.context ?? (await this.publishedContext(m.router))));
    if (settled.length > 0 && settled.every((r) => r.status === "rejected")) throw (settled[0] as PromiseRejectedResult).reason;
    return offered.map((m, i) => {
      const result = settled[i]!;
      const context = result.status === "fulfilled" ? result.value : undefined;
      return context ? { name: m.name, context: { ...context } } : { name: m.name };
    });
  }

  /**
   * The model a request without `model` gets: the configured default, else the first model offered (the first a
   * model service lists when none is configured); null when nothing is offered or the services cannot be reached.
   */
  async defaultModel(): Promise<string | null> {
    if (this.config.defaultModel !== null) return this.config.defaultModel;
    if (!this.isConfigured) return null;
    try {
      return (await this.offered())[0]?.name ?? null;
    } catch {
      return null;
    }
  }

  /** Resolves a requested name (null/undefined = default) to a model, or throws ServiceError. */
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
        throw new ServiceError("model_not_configured", `The default model "${defaultName}" is not offered by the model service.`);
      }
      throw new ServiceError("unknown_model", `Unknown model ${JSON.stringify(requested)}; GET /v1/models lists the names offered.`, {
        errors: [{ field: "model", message: `unknown model ${JSON.stringify(requested)}; see GET /v1/models for the names offered` }],
      });
    }
    const priceInputUsd = model.priceInputUsd ?? this.config.pricing.pricePerMillionInputUsd;
    const priceOutputUsd = model.priceOutputUsd ?? this.config.pricing.pricePerMillionOutputUsd;
    return {
      name: model.name,
      upstreamName: model.name,
      service: model.router,
      ...(model.context ? { context: model.context } : {}),
      price: { inputPerMillion: parseUsd(priceInputUsd)!, outputPerMillion: priceOutputUsd === null ? 0n : parseUsd(priceOutputUsd)! },
      priceInputUsd,
      priceOutputUsd,
    };
  }

  private router(model: string, deployments: DeploymentInput[]): ModelRouter {
    const observer = this.options.observerFor?.(model);
    return createModelRouter(model, deployments, { ...this.options.router, ...(observer ? { observer } : {}) });
  }

  /** The smallest context the model's deployments publish (an in-process model still loading answers 503). */
  private async publishedContext(router: ModelRouter): Promise<ModelContext | undefined> {
    try {
      return (await router.listModels({ timeoutMs: this.config.modelTimeoutMs }))[0]?.context;
    } catch (err) {
      throw new ModelLookupFailed(err);
    }
  }

  /** Configured models, then, when no configured model is served by a model service, the services' own lists. */
  private async offered(): Promise<Offered[]> {
    if (!this.isConfigured) throw new ServiceError("model_not_configured");
    if (this.services.size === 0 || listingServices(this.config).length === 0) return this.configured;
    const discovered = (await this.discover()).filter((d) => !this.configured.some((c) => c.name === d.name));
    return [...this.configured, ...discovered];
  }

  private async discover(): Promise<Offered[]> {
    const now = this.nowMs();
    if (this.discovered && now - this.discovered.at < SERVICE_LIST_TTL_MS) return this.discovered.models;
    const lists = await Promise.allSettled(
      [...this.services].map(async ([name, service]) => ({
        name,
        service,
        models: await service.listModels({ timeoutMs: this.config.modelTimeoutMs }),
      })),
    );
    for (const l of lists) if (l.status === "fulfilled") this.lastLists.set(l.value.name, l.value.models);
    if (this.lastLists.size === 0) throw new ModelLookupFailed((lists[0] as PromiseRejectedResult).reason);
    const byModel = new Map<string, DeploymentInput[]>();
    for (const [name, service] of this.services) {
      for (const m of this.lastLists.get(name) ?? []) {
        const deployments = byModel.get(m.name) ?? [];
        deployments.push({ name, service, upstreamName: m.name });
        byModel.set(m.name, deployments);
      }
    }
    const models: Offered[] = [];
    for (const [model, deployments] of byModel) models.push({ name: model, router: this.discoveredRouter(model, deployments) });
    this.discovered = { at: now, models };
    return models;
  }

  /** The router of a discovered model, made anew when the services that list it change. */
  private discoveredRouter(model: string, deployments: DeploymentInput[]): ModelRouter {
    const key = deployments.map((d) => d.name).join("\n");
    const current = this.discoveredRouters.get(model);
    if (current && current.key === key) return current.router;
    void current?.router.close();
    const router = this.router(model, deployments);
    if (this.started) router.start();
    this.discoveredRouters.set(model, { key, router });
    return router;
  }
}
