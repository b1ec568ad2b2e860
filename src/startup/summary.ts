import type { Config, ConfiguredModel } from "../config.ts";
import { listingServices } from "../config-models.ts";
import type { ModelEntry } from "../contract/models.ts";
import { describeDatabase } from "../database-url.ts";
import { PROMPT_OVERHEAD_TOKENS, QUESTION_OVERHEAD_TOKENS } from "../gateway/token-bound.ts";
import type { EngineStatus } from "../models/model-service.ts";
import { SERVICE_VERSION } from "../version.ts";

export interface StartupFacts {
  config: Config;
  /** The address the server listens on, as Fastify reports it (`http://127.0.0.1:8080`). */
  url: string;
  /** The models the model services list (null: none could be reached), used when no model is configured for them. */
  listed: string[] | null;
  defaultModel: string | null;
  /** The status of a model's in-process engine deployment (by its index); null for none. */
  engineStatus?: (model: string, deploymentIndex: number) => EngineStatus | null;
}

/** A URL without its password, query or fragment (credentials never reach a log). */
export function safeUrl(text: string): string {
  try {
    const url = new URL(text);
    const user = url.username ? `${url.username}@` : "";
    return `${url.protocol}//${user}${url.host}${url.pathname === "/" ? "" : url.pathname}`;
  } catch {
    return "(unparseable URL)";
  }
}

/** What an engine is doing, for its model's line: never "ready" for a model that cannot answer yet. */
function engineWords(status: EngineStatus | null): string {
  if (status === null) return "";
  const pct = (p: number | undefined) => `${Math.floor((p ?? 0) * 100)}%`;
  switch (status.state) {
    case "ready":
      return " — loaded";
    case "loading":
      return status.detail?.startsWith("downloading") ? ` — downloading (${pct(status.progress)})` : ` — loading (${pct(status.progress)})`;
    case "retrying":
      return status.offline
        ? " — cannot be downloaded (offline?): retrying in the background (requests get 503; see the warning)"
        : ` — retrying: ${status.lastError ?? "the last attempt failed"} (requests get 503)`;
    case "failed":
      return " — FAILED to load (requests get 503; see the error)";
    case "not_installed":
      return " — NOT INSTALLED: npm install node-llama-cpp (requests get 503)";
  }
}

/** Where an engine's model came from: the built-in default, or the setting that names it. */
function engineOrigin(llama: NonNullable<ConfiguredModel["deployments"][number]["llama"]>): string {
  if (llama.builtInDefault) return " (the built-in default model)";
  return llama.sourceSetting ? ` (${llama.sourceSetting})` : "";
}

/** The models that cannot answer yet: every deployment an in-process engine that is not ready. */
function modelsNotReady(facts: StartupFacts): string[] {
  const status = facts.engineStatus;
  if (!status) return [];
  return facts.config.models
    .filter((m) => m.deployments.length > 0 && m.deployments.every((d, i) => d.llama && status(m.name, i)?.state !== "ready"))
    .map((m) => m.name);
}

function deploymentSource(facts: StartupFacts, m: ConfiguredModel, index: number): string {
  const d = m.deployments[index]!;
  if (d.llama) {
    return `the in-process engine, ${d.llama.source}${engineOrigin(d.llama)}${engineWords(facts.engineStatus?.(m.name, index) ?? null)}`;
  }
  const service = facts.config.modelServices.find((s) => s.name === d.service);
  return `model service "${d.service}" ${service ? safeUrl(service.url) : ""}`.trimEnd();
}

function modelLines(facts: StartupFacts): string[] {
  const { config, defaultModel } = facts;
  const mark = (name: string) => (name === defaultModel ? `${name} (default)` : name);
  const lines = config.models.map(
    (m) => `${mark(m.name)} from ${m.deployments.map((_, i) => deploymentSource(facts, m, i)).join(" and ")}`,
  );
  const unbound = listingServices(config);
  if (unbound.length > 0) {
    const services = unbound.map((s) => `"${s.name}" ${safeUrl(s.url)}`).join(", ");
    lines.push(
      facts.listed === null
        ? `the models model service ${services} lists (it does not answer yet)`
        : facts.listed.length === 0
          ? `none: model service ${services} lists no model`
          : `${facts.listed.map(mark).join(", ")} listed by model service ${services}`,
    );
  }
  return lines.length > 0 ? lines : ["none configured: set TDS_MODEL_SERVICE_URL or TDS_MODEL_PATH (requests get 503)"];
}

function modeLine(config: Config): string {
  const { limits, pricing } = config;
  if (config.serviceMode === "preview") {
    return `preview (free): ${limits.previewRequestLimit} requests per organization per UTC day, ${limits.previewGlobalRequestLimit} in all`;
  }
  const output = pricing.pricePerMillionOutputUsd === null ? "" : `, $${pricing.pricePerMillionOutputUsd} per million output tokens`;
  return `paid: $${pricing.pricePerMillionInputUsd} per million input tokens${output}; credits reserved for ${config.reservationTtlSeconds} s at most`;
}

/**
 * Paid mode: the models whose token bound only the request's bytes limit (no context configured or published, and no
 * in-process engine that counts), so that a larger request is refused (413) for its bound over reserve_tokens; one
 * line, or null. `offered`: the models with their context as GET /v1/models lists them (null when not listed in time).
 */
export function reservationWarning(config: Config, offered: ReadonlyArray<ModelEntry> | null): string | null {
  if (config.serviceMode !== "paid" || offered === null) return null;
  const counted = new Set(config.models.filter((m) => m.deployments.length > 0 && m.deployments.every((d) => d.llama)).map((m) => m.name));
  const unlimited = offered
    .filter((m) => m.context?.max_state === undefined && m.context?.max_branch === undefined && !counted.has(m.name))
    .map((m) => m.name);
  if (unlimited.length === 0) return null;
  const cap = config.limits.reserveTokens;
  const bytes = Math.max(0, cap - PROMPT_OVERHEAD_TOKENS - QUESTION_OVERHEAD_TOKENS);
  return (
    `paid mode: ${unlimited.join(", ")} ${unlimited.length === 1 ? "publishes" : "publish"} no context, so a request's token bound ` +
    `is one token per byte of its state and questions: a request whose bound exceeds reserve_tokens (${cap}), such as a state ` +
    `and one question of more than about ${bytes} bytes, is refused with 413. Configure the model's "context" or raise TDS_RESERVE_TOKENS.`
  );
}

/** The one start-up summary: what a person starting the gateway needs to check, as text and as log fields. */
export function startupSummary(facts: StartupFacts): { text: string; fields: Record<string, unknown> } {
  const { config, url } = facts;
  const database = describeDatabase(config.databaseUrl);
  const limiter = config.redisUrl === null ? "counted in this process" : `shared through Redis ${safeUrl(config.redisUrl)}`;
  const rows: Array<[string, string[]]> = [
    ["console", [`${url}/console/  (API reference: ${url}/docs)`]],
    ["mode", [modeLine(config)]],
    ["models", modelLines(facts)],
    ["database", [`${database.kind} ${database.location}`]],
    [
      "limits",
      [
        `${config.limits.requestsPerMinute} decisions and ${config.limits.readRequestsPerMinute} reads per organization per minute, ${limiter}`,
      ],
    ],
    ["admin API", [config.adminToken === null ? "off (set TDS_ADMIN_TOKEN to enable /admin/v1)" : `on at ${url}/admin/v1`]],
  ];
  const width = Math.max(...rows.map(([label]) => label.length));
  const body = rows.flatMap(([label, values]) => values.map((v, i) => `  ${(i === 0 ? label : "").padEnd(width)}  ${v}`));
  const notReady = modelsNotReady(facts);
  const head =
    notReady.length === 0
      ? `Typed Decision Service ${SERVICE_VERSION} ready at ${url}`
      : `Typed Decision Service ${SERVICE_VERSION} listening at ${url}; not ready: ${notReady.map((n) => JSON.stringify(n)).join(", ")} (see models)`;
  return {
    text: [head, ...body].join("\n"),
    fields: {
      version: SERVICE_VERSION,
      url,
      console_url: `${url}/console/`,
      mode: config.serviceMode,
      models: modelLines(facts),
      default_model: facts.defaultModel,
      models_not_ready: notReady,
      database: `${database.kind} ${database.location}`,
      requests_per_minute: config.limits.requestsPerMinute,
      read_requests_per_minute: config.limits.readRequestsPerMinute,
      preview_request_limit: config.limits.previewRequestLimit,
      preview_global_request_limit: config.limits.previewGlobalRequestLimit,
      rate_limits: config.redisUrl === null ? "memory" : "redis",
      admin_api: config.adminToken !== null,
    },
  };
}
