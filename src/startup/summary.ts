import type { Config, ConfiguredModel } from "../config.ts";
import { listingServices } from "../config-models.ts";
import { describeDatabase } from "../database-url.ts";
import { SERVICE_VERSION } from "../version.ts";

export interface StartupFacts {
  config: Config;
  /** The address the server listens on, as Fastify reports it (`http://127.0.0.1:8080`). */
  url: string;
  /** The models the model services list (null: none could be reached), used when no model is configured for them. */
  listed: string[] | null;
  defaultModel: string | null;
  /** The state of a model's in-process engine deployment (by its index), such as "not_installed"; null for none. */
  engineState?: (model: string, deploymentIndex: number) => string | null;
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

function deploymentSource(facts: StartupFacts, m: ConfiguredModel, index: number): string {
  const d = m.deployments[index]!;
  if (d.llama) {
    const missing =
      facts.engineState?.(m.name, index) === "not_installed" ? " — NOT INSTALLED: npm install node-llama-cpp (requests get 503)" : "";
    return `the in-process engine, ${d.llama.source}${d.llama.sourceSetting ? ` (${d.llama.sourceSetting})` : ""}${missing}`;
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
  return {
    text: [`Typed Decision Service ${SERVICE_VERSION} ready at ${url}`, ...body].join("\n"),
    fields: {
      version: SERVICE_VERSION,
      url,
      console_url: `${url}/console/`,
      mode: config.serviceMode,
      models: modelLines(facts),
      default_model: facts.defaultModel,
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
