import { DEFAULT_EMBEDDED_MODEL } from "./config-defaults.ts";
import type { ConfigFile } from "./contract/config.ts";
import type { ModelContext } from "./contract/models.ts";
import { formatUsd, parseUsd } from "./domain/money.ts";

/**
 * Model services, public models and their deployments, from the config file and the environment:
 *
 * - `model_services` (file): named services; `models[].deployments` refer to them by name.
 * - `TDS_MODEL_SERVICE_URL` (or the file's `model_service.url`): one URL, or a comma-separated list of replicas of
 *   one service, each named by its host:port; `TDS_MODEL_SERVICE_KEY` is sent to each.
 * - `models[]` without `deployments` keep their meaning: `engine: "llama"` is one in-process deployment; any other is
 *   served by every replica of `TDS_MODEL_SERVICE_URL` (or, without it, by every service of `model_services`).
 * - `TDS_MODEL_PATH`, or nothing configured at all: one model on the in-process engine.
 * Models that no configuration lists are discovered from the services' own lists (src/models/registry.ts).
 */

export interface EmbeddedModelSettings {
  /** Local GGUF path or hf: reference. */
  source: string;
  threads?: number;
  contextSize?: number;
  poolSize?: number;
  queueLimit?: number;
  batchSize?: number;
  /** "auto": a GPU build of llama.cpp when one loads (its package must be installed), else the CPU; default false (CPU). */
  gpu?: "auto" | false;
  /** The setting that names `source`, for messages ("TDS_MODEL_PATH", or the config file's entry). */
  sourceSetting?: string;
  /** Set when nothing was configured and `source` is the built-in default model (sourceSetting is then the one to set instead). */
  builtInDefault?: true;
}

export interface ServiceConfig {
  /** Unique; what usage records, metrics and logs call it. */
  name: string;
  url: string;
  /** Set when the configured URL ended in a path the gateway adds itself (`/v1`, `/v1/systemone`, `/v1/models`), which `url` drops. */
  correctedFrom?: { setting: string; url: string };
  apiKey?: string;
  /** Default weight of its deployments (1). */
  weight: number;
  /** Default max_concurrency of its deployments: outstanding calls per model on this service (null = unbounded). */
  maxConcurrency: number | null;
}

export interface DeploymentConfig {
  /** The service's name, or `in-process` for the in-process engine. */
  name: string;
  /** The model service that answers, by name; null for the in-process engine. */
  service: string | null;
  /** The model name the service knows. */
  upstreamName: string;
  llama?: EmbeddedModelSettings;
  weight: number;
  maxConcurrency: number | null;
  /** Used only while no other deployment of the model is healthy. */
  fallback: boolean;
}

export interface ConfiguredModel {
  /** Public name, as listed by GET /v1/models. */
  name: string;
  deployments: DeploymentConfig[];
  aliases: string[];
  context?: ModelContext;
  /** Normalised decimal USD strings; undefined = the default price. */
  pricePerMillionInputUsd?: string;
  pricePerMillionOutputUsd?: string;
}

export const IN_PROCESS = "in-process";

function checkUrl(setting: string, url: string, problems: string[]): string {
  try {
    const u = new URL(url);
    if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error("not http(s)");
  } catch {
    problems.push(`${setting} must be an http(s) URL such as http://127.0.0.1:11434 (got ${JSON.stringify(url)})`);
  }
  return url.replace(/\/+$/, "");
}

/** The API paths the gateway adds to a model service's URL itself: a URL that ends in one is corrected. */
const API_PATH_SUFFIX = /\/v1(?:\/(?:systemone|models))?\/*$/i;

/**
 * A model service URL without a trailing API path (`http://h:9090/v1/` → `http://h:9090`), and where it came from
 * when one was dropped; a path before it (a reverse proxy's prefix, `http://h/ollama/v1` → `http://h/ollama`) is kept.
 */
function serviceUrl(setting: string, given: string, problems: string[]): Pick<ServiceConfig, "url" | "correctedFrom"> {
  const url = checkUrl(setting, given, problems);
  let path: string;
  try {
    path = new URL(url).pathname;
  } catch {
    return { url };
  }
  if (!API_PATH_SUFFIX.test(path)) return { url };
  const u = new URL(url);
  u.pathname = path.replace(API_PATH_SUFFIX, "");
  return { url: u.toString().replace(/\/+$/, ""), correctedFrom: { setting, url: given } };
}

/** host:port of a URL (the default port spelled out), the name of an unnamed replica. */
function hostPort(url: string): string {
  try {
    const u = new URL(url);
    return `${u.hostname}:${u.port || (u.protocol === "https:" ? "443" : "80")}`;
  } catch {
    return url;
  }
}

/** "qwen2.5-0.5b-instruct-q8_0" for ./models/qwen2.5-0.5b-instruct-q8_0.gguf or hf:owner/repo/qwen2.5-0.5b-instruct-q8_0.gguf. */
export function embeddedModelName(source: string): string {
  const last = source.replace(/^hf:/, "").split(/[/\\]/).at(-1) ?? source;
  return (
    last
      .replace(/\.gguf$/i, "")
      .replace(/:/g, "-")
      .slice(0, 100) || "local"
  );
}

type FileModel = NonNullable<ConfigFile["models"]>[number];
type FileDeployment = NonNullable<FileModel["deployments"]>[number];

function engineSettings(d: FileModel | FileDeployment, sourceSetting: string): EmbeddedModelSettings {
  return {
    source: d.source ?? "",
    ...(d.threads ? { threads: d.threads } : {}),
    ...(d.context_size ? { contextSize: d.context_size } : {}),
    ...(d.pool_size ? { poolSize: d.pool_size } : {}),
    ...(d.queue_limit !== undefined ? { queueLimit: d.queue_limit } : {}),
    ...(d.batch_size ? { batchSize: d.batch_size } : {}),
    ...(d.gpu !== undefined ? { gpu: d.gpu } : {}),
    sourceSetting,
  };
}

function engineDeployment(modelName: string, llama: EmbeddedModelSettings, fallback = false): DeploymentConfig {
  return { name: IN_PROCESS, service: null, upstreamName: modelName, llama, weight: 1, maxConcurrency: null, fallback };
}

function serviceDeployment(service: ServiceConfig, upstreamName: string, d?: FileDeployment): DeploymentConfig {
  return {
    name: service.name,
    service: service.name,
    upstreamName: d?.upstream_name ?? upstreamName,
    weight: d?.weight ?? service.weight,
    maxConcurrency: d?.max_concurrency ?? service.maxConcurrency,
    fallback: d?.fallback ?? false,
  };
}

/** The environment's model settings as the settings table read them (TDS_MODEL_SERVICE_URL may come from the file). */
export interface ModelSettings {
  /** TDS_MODEL_SERVICE_URL or the file's model_service.url: one URL or comma-separated replicas. */
  serviceUrls: string | null;
  /** Which of the two gave serviceUrls, for messages. */
  serviceUrlSetting: string;
  serviceKey: string | null;
  modelPath: string | null;
  modelName: string | null;
  gpu: "auto" | "off";
}

export function parseModelConfig(
  settings: ModelSettings,
  file: ConfigFile,
  problems: string[],
): { modelServices: ServiceConfig[]; models: ConfiguredModel[] } {
  const { serviceUrls: urls, serviceUrlSetting: setting, serviceKey: key } = settings;
  /** The replicas of TDS_MODEL_SERVICE_URL / model_service: what models without deployments are served by. */
  const replicas: ServiceConfig[] = (urls ?? "")
    .split(",")
    .map((u) => u.trim())
    .filter(Boolean)
    .map((u) => {
      const checked = serviceUrl(setting, u, problems);
      return { name: hostPort(checked.url), ...checked, ...(key ? { apiKey: key } : {}), weight: 1, maxConcurrency: null };
    });
  const named: ServiceConfig[] = (file.model_services ?? []).map((s) => ({
    name: s.name,
    ...serviceUrl(`model_services "${s.name}" url`, s.url, problems),
    ...(s.api_key ? { apiKey: s.api_key } : {}),
    weight: s.weight ?? 1,
    maxConcurrency: s.max_concurrency ?? null,
  }));
  const modelServices = [...replicas, ...named];
  const byName = new Map<string, ServiceConfig>();
  for (const s of modelServices) {
    if (byName.has(s.name)) problems.push(`model services: the name "${s.name}" is used twice`);
    byName.set(s.name, s);
  }
  const defaultServices = replicas.length > 0 ? replicas : named;

  const models: ConfiguredModel[] = [];
  for (const m of file.models ?? []) {
    const sourceSetting = `models[].source of "${m.name}" in the config file (TDS_CONFIG)`;
    let deployments: DeploymentConfig[];
    if (m.deployments) {
      if (m.engine || m.source || m.upstream_name)
        problems.push(`models: "${m.name}" has deployments; engine, source and upstream_name go into each deployment`);
      deployments = [];
      for (const d of m.deployments) {
        if (d.engine === "llama") {
          if (d.service) problems.push(`models: a deployment of "${m.name}" names both a service and engine "llama"`);
          if (!d.source) problems.push(`models: the engine deployment of "${m.name}" has no source (a GGUF path or hf: reference)`);
          const settings = engineSettings(d, `models[].deployments[].source of "${m.name}" in the config file (TDS_CONFIG)`);
          deployments.push({
            ...engineDeployment(m.name, settings, d.fallback ?? false),
            weight: d.weight ?? 1,
            maxConcurrency: d.max_concurrency ?? null,
          });
        } else if (!d.service) {
          problems.push(`models: a deployment of "${m.name}" names neither a service (from model_services) nor engine "llama"`);
        } else if (!byName.has(d.service)) {
          problems.push(`models: a deployment of "${m.name}" names the service "${d.service}", which model_services does not list`);
        } else {
          if (d.source)
            problems.push(`models: the deployment of "${m.name}" on "${d.service}" has a source, which only engine deployments take`);
          deployments.push(serviceDeployment(byName.get(d.service)!, m.name, d));
        }
      }
    } else if (m.engine === "llama") {
      if (!m.source) problems.push(`models: "${m.name}" has engine "llama" but no source (a GGUF path or hf: reference)`);
      deployments = [engineDeployment(m.name, engineSettings(m, sourceSetting))];
    } else {
      if (m.source) problems.push(`models: "${m.name}" has a source but engine is not "llama"`);
      if (defaultServices.length === 0)
        problems.push(`models: "${m.name}" is served by the model service, but TDS_MODEL_SERVICE_URL is not set`);
      deployments = defaultServices.map((s) => serviceDeployment(s, m.upstream_name ?? m.name));
    }
    const seen = new Set<string>();
    for (const d of deployments) {
      if (seen.has(d.name))
        problems.push(
          `models: "${m.name}" has two deployments on ${d.service === null ? "the in-process engine" : `the service "${d.name}"`}`,
        );
      seen.add(d.name);
    }
    models.push({
      name: m.name,
      deployments,
      aliases: m.aliases ?? [],
      ...(m.context ? { context: m.context } : {}),
      ...(m.price_per_million_input_usd ? { pricePerMillionInputUsd: formatUsd(parseUsd(m.price_per_million_input_usd)!) } : {}),
      ...(m.price_per_million_output_usd ? { pricePerMillionOutputUsd: formatUsd(parseUsd(m.price_per_million_output_usd)!) } : {}),
    });
  }

  const { modelPath, modelName: embeddedName } = settings;
  const gpu = settings.gpu === "auto" ? { gpu: "auto" as const } : {};
  if (modelPath !== null) {
    const name = embeddedName ?? embeddedModelName(modelPath);
    if (!models.some((m) => m.name === name)) {
      models.push({
        name,
        deployments: [engineDeployment(name, { source: modelPath, sourceSetting: "TDS_MODEL_PATH", ...gpu })],
        aliases: [],
      });
    }
  } else if (modelServices.length === 0 && models.length === 0) {
    // Nothing configured at all: the in-process engine with its default model, fetched on first start.
    const name = embeddedName ?? DEFAULT_EMBEDDED_MODEL.name;
    models.push({
      name,
      deployments: [
        engineDeployment(name, { source: DEFAULT_EMBEDDED_MODEL.source, sourceSetting: "TDS_MODEL_PATH", builtInDefault: true, ...gpu }),
      ],
      aliases: [],
    });
  }
  return { modelServices, models };
}

/**
 * The model services whose own lists of models are offered: every service, while no configured model is served by a
 * model service; none otherwise (then only the configured models are offered).
 */
export function listingServices(config: { models: ConfiguredModel[]; modelServices: ServiceConfig[] }): ServiceConfig[] {
  return config.models.some((m) => m.deployments.some((d) => d.service !== null)) ? [] : config.modelServices;
}

/** The key of one in-process engine: its model and its place among the model's deployments. */
export function engineKey(model: string, deploymentIndex: number): string {
  return `${model}#${deploymentIndex}`;
}
