import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { ROUTER_DEFAULTS } from "./config-defaults.ts";
import { type ConfiguredModel, parseModelConfig, type ServiceConfig } from "./config-models.ts";
import { withSecretFiles } from "./config-secret-files.ts";
import { ConfigFile } from "./contract/config.ts";
import type { ServiceMode } from "./contract/decision.ts";
import { compileSchema, toFieldErrors } from "./contract/validation.ts";
import { databaseUrlProblem } from "./database-url.ts";
import { addressRangeProblem } from "./domain/address-ranges.ts";
import { keyIdOf } from "./domain/api-keys.ts";
import { formatUsd, parseUsd } from "./domain/money.ts";
import { MIN_SECRET_LENGTH, weakSecretProblem } from "./domain/secret-strength.ts";
import { octal, readableByOthers } from "./private-files.ts";

export const DEFAULT_DATABASE_URL = "sqlite:./data/tds.sqlite";
export const DEFAULT_SQLITE_WAL_LIMIT_MB = 64;
export const DEFAULT_MIN_FREE_DISK_MB = 64;

export type { ConfiguredModel, DeploymentConfig, EmbeddedModelSettings, ServiceConfig } from "./config-models.ts";

export interface RoutingConfig {
  maxAttempts: number;
  /** null: every attempt may use all the time left. */
  attemptTimeoutMs: number | null;
  failureThreshold: number;
  cooldownInitialMs: number;
  cooldownMaxMs: number;
  /** null: no active health checks. */
  healthCheckIntervalMs: number | null;
}

export interface Limits {
  maxRequestBytes: number;
  maxQuestions: number;
  requestsPerMinute: number;
  /** Usage and organization reads per organization per minute (their own limit, apart from decisions). */
  readRequestsPerMinute: number;
  previewRequestLimit: number;
  previewGlobalRequestLimit: number;
  reserveTokens: number;
}

/** Client connections: how long an idle one is kept and how many may be open at once. */
export interface ConnectionLimits {
  /** An idle keep-alive connection (between requests) is closed after this. */
  keepAliveTimeoutMs: number;
  /** Open client connections at once; idle ones are closed first when nearly that many are open. */
  maxConnections: number;
  /** Open connections from one client address at once (trusted proxies excepted). */
  maxConnectionsPerAddress: number;
}

export interface Config {
  host: string;
  port: number;
  databaseUrl: string;
  /** The SQLite WAL file is kept to at most this many MiB on disk (TDS_SQLITE_WAL_LIMIT_MB). */
  sqliteWalLimitMb: number;
  /** A SQLite gateway refuses to start with less free space than this on the database's volume; 0: no check. */
  minFreeDiskMb: number;
  /** Shared rate limits for several instances; null = in-memory limiter (one process). */
  redisUrl: string | null;
  /** When set, GET /metrics requires `Authorization: Bearer <token>`. */
  metricsToken: string | null;
  /** Enables the admin API (/admin/v1) for `Authorization: Bearer <token>`; null: every admin route answers 404. */
  adminToken: string | null;
  serviceMode: ServiceMode;
  /** The model services, by name: replicas of TDS_MODEL_SERVICE_URL and the config file's model_services. */
  modelServices: ServiceConfig[];
  defaultModel: string | null;
  /** Alias → public or alias name. `jev-latest` → the default model unless configured otherwise. */
  aliases: Record<string, string>;
  /** Configured models and their deployments; models the services list themselves are offered too (see the registry). */
  models: ConfiguredModel[];
  /** Download folder of hub model references. */
  modelCacheDir: string;
  pricing: { pricePerMillionInputUsd: string; pricePerMillionOutputUsd: string | null };
  limits: Limits;
  connections: ConnectionLimits;
  /** Reverse proxies whose X-Forwarded-For names the client (addresses, CIDR ranges, loopback/linklocal/uniquelocal); empty: none. */
  trustedProxies: string[];
  modelTimeoutMs: number;
  /** How requests are spread over a model's deployments and when a deployment is taken out (file: `routing`). */
  routing: RoutingConfig;
  reservationTtlSeconds: number;
  bootstrap: boolean;
  /** Where a non-terminal start writes the first API key; null = next to the SQLite file, or ./data/. */
  bootstrapKeyFile: string | null;
  /** The TDS_CONFIG file and the secret settings it holds (their names, never their values). */
  configFile: { path: string; secrets: string[] } | null;
  logLevel: LogLevel;
  /** null: pretty on a terminal, JSON otherwise. */
  logFormat: LogFormat | null;
}

export const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];
export const LOG_FORMATS = ["pretty", "json"] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`Invalid configuration:\n  - ${problems.join("\n  - ")}`);
    this.name = "ConfigError";
  }
}

export const DEFAULT_LIMITS: Limits = {
  maxRequestBytes: 1_048_576,
  maxQuestions: 32,
  requestsPerMinute: 60,
  readRequestsPerMinute: 600,
  previewRequestLimit: 1000,
  previewGlobalRequestLimit: 100_000,
  reserveTokens: 32_768,
};

export const DEFAULT_CONNECTIONS: ConnectionLimits = {
  keepAliveTimeoutMs: 5000,
  maxConnections: 4096,
  maxConnectionsPerAddress: 256,
};

type Env = Record<string, string | undefined>;
/** Compiled on first use: most starts and CLI runs have no config file, and compiling costs tens of milliseconds. */
let fileValidator: ReturnType<typeof compileSchema<ConfigFile>> | null = null;

function readConfigFile(path: string, problems: string[]): ConfigFile {
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(path, "utf8"));
  } catch (err) {
    problems.push(`TDS_CONFIG: cannot read ${path} as JSON (${(err as Error).message})`);
    return {};
  }
  fileValidator ??= compileSchema<ConfigFile>(ConfigFile);
  const validateFile = fileValidator;
  if (!validateFile(parsed)) {
    for (const e of toFieldErrors(validateFile.errors ?? [])) problems.push(`TDS_CONFIG ${path}: ${e.field} ${e.message}`);
    return {};
  }
  return parsed;
}

function envInt(env: Env, name: string, min: number, max: number, problems: string[]): number | undefined {
  const raw = env[name];
  if (raw === undefined || raw.trim() === "") return undefined;
  const text = raw.trim();
  const value = Number(text);
  if (!/^[0-9]+$/.test(text) || !Number.isSafeInteger(value) || value < min || value > max) {
    problems.push(`${name} must be a whole number from ${min} to ${max} (got ${JSON.stringify(raw)})`);
    return undefined;
  }
  return value;
}

function oneOf<T extends string>(name: string, value: string | undefined, allowed: readonly T[], problems: string[]): T | undefined {
  if (value === undefined) return undefined;
  if ((allowed as readonly string[]).includes(value)) return value as T;
  problems.push(`${name} must be one of ${allowed.join(", ")} (got ${JSON.stringify(value)})`);
  return undefined;
}

function envString(env: Env, name: string): string | undefined {
  const raw = env[name]?.trim();
  return raw ? raw : undefined;
}

/** TDS_TRUSTED_PROXIES (comma-separated) or the file's trusted_proxies; every entry checked. */
function trustedProxies(env: Env, file: ConfigFile, problems: string[]): string[] {
  const text = envString(env, "TDS_TRUSTED_PROXIES");
  const label = text === undefined ? "trusted_proxies" : "TDS_TRUSTED_PROXIES";
  const entries = text === undefined ? (file.trusted_proxies ?? []) : text.split(",").map((s) => s.trim());
  const list = entries.map((s) => s.trim()).filter(Boolean);
  for (const entry of list) {
    const problem = addressRangeProblem(entry);
    if (problem !== null) problems.push(`${label}: ${JSON.stringify(entry)} ${problem}`);
  }
  return list;
}

function connectionLimits(env: Env, file: ConfigFile, problems: string[]): ConnectionLimits {
  const limits: ConnectionLimits = {
    keepAliveTimeoutMs:
      envInt(env, "TDS_KEEP_ALIVE_TIMEOUT_MS", 100, 600_000, problems) ??
      file.keep_alive_timeout_ms ??
      DEFAULT_CONNECTIONS.keepAliveTimeoutMs,
    maxConnections:
      envInt(env, "TDS_MAX_CONNECTIONS", 1, 1_000_000, problems) ?? file.max_connections ?? DEFAULT_CONNECTIONS.maxConnections,
    maxConnectionsPerAddress:
      envInt(env, "TDS_MAX_CONNECTIONS_PER_ADDRESS", 1, 1_000_000, problems) ??
      file.max_connections_per_address ??
      DEFAULT_CONNECTIONS.maxConnectionsPerAddress,
  };
  if (limits.maxConnectionsPerAddress > limits.maxConnections) {
    problems.push(
      `TDS_MAX_CONNECTIONS_PER_ADDRESS (${limits.maxConnectionsPerAddress}) must not exceed TDS_MAX_CONNECTIONS (${limits.maxConnections})`,
    );
  }
  return limits;
}

function normalisePrice(label: string, text: string | undefined, problems: string[]): string | undefined {
  if (text === undefined) return undefined;
  const micro = parseUsd(text);
  if (micro === null) {
    problems.push(`${label} must be a decimal USD amount with at most 6 decimal places, such as "0.50" (got ${JSON.stringify(text)})`);
    return undefined;
  }
  return formatUsd(micro);
}

function parseAliases(text: string, problems: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const pair of text
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)) {
    const [alias, target, ...rest] = pair.split("=").map((s) => s.trim());
    if (!alias || !target || rest.length > 0) problems.push(`TDS_MODEL_ALIASES: "${pair}" is not of the form alias=model`);
    else out[alias] = target;
  }
  return out;
}

export const MIN_ADMIN_TOKEN_LENGTH = MIN_SECRET_LENGTH;

/**
 * The admin token: at least 32 characters, not trivially weak (secret-strength.ts), and not shaped like an API key
 * (so neither is taken for the other).
 */
function checkAdminToken(token: string | null, problems: string[]): string | null {
  if (token === null) return null;
  const weak = weakSecretProblem(token);
  if (weak !== null) problems.push(`TDS_ADMIN_TOKEN ${weak}; generate one with: openssl rand -base64 32`);
  else if (keyIdOf(token) !== null)
    problems.push("TDS_ADMIN_TOKEN must not be an API key (tds_…); generate one with: openssl rand -base64 32");
  return token;
}

/** The metrics token: at least 32 characters and not trivially weak, like the admin token. */
function checkMetricsToken(token: string | null, problems: string[]): string | null {
  if (token === null) return null;
  const weak = weakSecretProblem(token);
  if (weak !== null) problems.push(`TDS_METRICS_TOKEN ${weak}; generate one with: openssl rand -hex 32`);
  return token;
}

/** The file's settings that hold a secret: a model service key, a password in a database or Redis URL. */
function secretsIn(file: ConfigFile): string[] {
  const secrets: string[] = [];
  if (file.model_service?.api_key) secrets.push("model_service.api_key");
  if (file.admin_token) secrets.push("admin_token");
  for (const service of file.model_services ?? []) if (service.api_key) secrets.push(`model_services "${service.name}" api_key`);
  if (file.database_url && urlHasPassword(file.database_url)) secrets.push("database_url");
  if (file.redis_url && urlHasPassword(file.redis_url)) secrets.push("redis_url");
  return secrets;
}

/**
 * A URL as a configuration message may show it: the password in its user part (everything between the user name's
 * colon and the last `@` of the authority, so also one that was not percent-encoded) and `password=` parameters
 * become `***`. It works on text that is not a valid URL too, which is when the message shows it.
 */
export function withoutPassword(text: string): string {
  let out = text.replace(/(password=)[^&#\s]*/gi, "$1***");
  const scheme = /^[a-z][a-z0-9+.-]*:\/\//i.exec(out);
  if (scheme) {
    const rest = out.slice(scheme[0].length);
    const at = rest.lastIndexOf("@");
    const colon = rest.indexOf(":");
    if (at > 0 && colon >= 0 && colon < at) out = `${scheme[0]}${rest.slice(0, colon)}:***${rest.slice(at)}`;
  }
  return out;
}

function urlHasPassword(text: string): boolean {
  try {
    const url = new URL(text);
    return url.password !== "" || url.searchParams.has("password");
  } catch {
    return false;
  }
}

/** True for 127.0.0.0/8, ::1 (also IPv4-mapped) and localhost: addresses other machines cannot reach. */
export function isLoopbackHost(host: string): boolean {
  const h = host
    .trim()
    .toLowerCase()
    .replace(/^\[(.*)\]$/, "$1");
  if (h === "localhost") return true;
  if (h === "::1" || /^(0{0,4}:){7}0{0,3}1$/.test(h)) return true;
  const v4 = h.replace(/^::ffff:/, "");
  return /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(v4);
}

/**
 * What a serving gateway refuses beyond loadConfig (the `tds` command reads the same settings and does
 * not listen): GET /metrics without a token on an address other machines can reach.
 */
export function servingProblems(config: Pick<Config, "host" | "metricsToken">): string[] {
  if (config.metricsToken !== null || isLoopbackHost(config.host)) return [];
  return [
    `HOST ${JSON.stringify(config.host)} is not a loopback address, so GET /metrics would be open to the network: ` +
      `set TDS_METRICS_TOKEN to a secret (scrapers then send Authorization: Bearer <token>), or listen on 127.0.0.1`,
  ];
}

/** A warning when the config file holds a secret and other users can read it (names the settings, never their values). */
export function configFileWarning(configFile: Config["configFile"]): string | null {
  if (!configFile || configFile.secrets.length === 0) return null;
  const { readable, mode } = readableByOthers(configFile.path);
  if (!readable) return null;
  return (
    `the config file ${configFile.path} holds a secret (${configFile.secrets.join(", ")}) and can be read by other users ` +
    `(mode ${octal(mode)}): run chmod 600 ${configFile.path}`
  );
}

/**
 * Reads the configuration file (TDS_CONFIG) and the environment, which wins (a secret may come from the file its
 * `_FILE` variable names); throws ConfigError listing every problem.
 */
export function loadConfig(environment: Env = process.env): Config {
  const problems: string[] = [];
  const env = withSecretFiles(environment, problems);
  const configPath = envString(env, "TDS_CONFIG");
  const file: ConfigFile = configPath ? readConfigFile(configPath, problems) : {};
  const fileLimits = file.limits ?? {};

  const mode = envString(env, "TDS_SERVICE_MODE") ?? file.service_mode ?? "preview";
  if (mode !== "preview" && mode !== "paid") problems.push(`TDS_SERVICE_MODE must be "preview" or "paid" (got ${JSON.stringify(mode)})`);

  const limits: Limits = {
    maxRequestBytes:
      envInt(env, "TDS_MAX_REQUEST_BYTES", 64, 64 * 1024 * 1024, problems) ??
      fileLimits.max_request_bytes ??
      DEFAULT_LIMITS.maxRequestBytes,
    maxQuestions: envInt(env, "TDS_MAX_QUESTIONS", 1, 32, problems) ?? fileLimits.max_questions ?? DEFAULT_LIMITS.maxQuestions,
    requestsPerMinute:
      envInt(env, "TDS_REQUESTS_PER_MINUTE", 1, 1_000_000, problems) ?? fileLimits.requests_per_minute ?? DEFAULT_LIMITS.requestsPerMinute,
    readRequestsPerMinute:
      envInt(env, "TDS_READ_REQUESTS_PER_MINUTE", 1, 1_000_000, problems) ??
      fileLimits.read_requests_per_minute ??
      DEFAULT_LIMITS.readRequestsPerMinute,
    previewRequestLimit:
      envInt(env, "TDS_PREVIEW_REQUEST_LIMIT", 0, 1_000_000_000, problems) ??
      fileLimits.preview_request_limit ??
      DEFAULT_LIMITS.previewRequestLimit,
    previewGlobalRequestLimit:
      envInt(env, "TDS_PREVIEW_GLOBAL_REQUEST_LIMIT", 0, 1_000_000_000, problems) ??
      fileLimits.preview_global_request_limit ??
      DEFAULT_LIMITS.previewGlobalRequestLimit,
    reserveTokens: envInt(env, "TDS_RESERVE_TOKENS", 1, 100_000_000, problems) ?? fileLimits.reserve_tokens ?? DEFAULT_LIMITS.reserveTokens,
  };

  const inputPrice =
    normalisePrice(
      "TDS_PRICE_PER_MILLION_INPUT_USD",
      envString(env, "TDS_PRICE_PER_MILLION_INPUT_USD") ?? file.pricing?.price_per_million_input_usd,
      problems,
    ) ?? "0.5";
  const outputPrice =
    normalisePrice(
      "TDS_PRICE_PER_MILLION_OUTPUT_USD",
      envString(env, "TDS_PRICE_PER_MILLION_OUTPUT_USD") ?? file.pricing?.price_per_million_output_usd,
      problems,
    ) ?? null;

  const { modelServices, models } = parseModelConfig(env, file, problems);
  const names = new Set<string>();
  for (const m of models) {
    for (const n of [m.name, ...m.aliases]) {
      if (names.has(n)) problems.push(`models: the name or alias "${n}" is used twice`);
      names.add(n);
    }
  }

  const defaultModel = envString(env, "TDS_DEFAULT_MODEL") ?? file.default_model ?? models[0]?.name ?? null;
  const aliases = { ...(file.aliases ?? {}), ...parseAliases(env.TDS_MODEL_ALIASES ?? "", problems) };

  const bootstrapText = envString(env, "TDS_BOOTSTRAP");
  if (bootstrapText !== undefined && !["true", "false", "1", "0"].includes(bootstrapText)) {
    problems.push(`TDS_BOOTSTRAP must be true or false (got ${JSON.stringify(bootstrapText)})`);
  }

  const modelTimeoutMs = envInt(env, "TDS_MODEL_TIMEOUT_MS", 1, 3_600_000, problems) ?? file.model_timeout_ms ?? 30_000;
  const config: Config = {
    host: envString(env, "HOST") ?? file.host ?? "127.0.0.1",
    port: envInt(env, "PORT", 0, 65535, problems) ?? file.port ?? 8080,
    databaseUrl: envString(env, "TDS_DATABASE_URL") ?? file.database_url ?? DEFAULT_DATABASE_URL,
    sqliteWalLimitMb:
      envInt(env, "TDS_SQLITE_WAL_LIMIT_MB", 1, 1_048_576, problems) ?? file.sqlite_wal_limit_mb ?? DEFAULT_SQLITE_WAL_LIMIT_MB,
    minFreeDiskMb: envInt(env, "TDS_MIN_FREE_DISK_MB", 0, 1_048_576, problems) ?? file.min_free_disk_mb ?? DEFAULT_MIN_FREE_DISK_MB,
    redisUrl: envString(env, "TDS_REDIS_URL") ?? file.redis_url ?? null,
    metricsToken: checkMetricsToken(envString(env, "TDS_METRICS_TOKEN") ?? null, problems),
    adminToken: checkAdminToken(envString(env, "TDS_ADMIN_TOKEN") ?? file.admin_token ?? null, problems),
    serviceMode: mode === "paid" ? "paid" : "preview",
    modelServices,
    defaultModel,
    aliases,
    models,
    modelCacheDir: envString(env, "TDS_MODEL_CACHE_DIR") ?? file.model_cache_dir ?? "./data/models",
    pricing: { pricePerMillionInputUsd: inputPrice, pricePerMillionOutputUsd: outputPrice },
    limits,
    connections: connectionLimits(env, file, problems),
    trustedProxies: trustedProxies(env, file, problems),
    modelTimeoutMs,
    routing: {
      maxAttempts: file.routing?.max_attempts ?? ROUTER_DEFAULTS.maxAttempts,
      attemptTimeoutMs: file.routing?.attempt_timeout_ms === undefined ? Math.ceil(modelTimeoutMs / 2) : file.routing.attempt_timeout_ms,
      failureThreshold: file.routing?.failure_threshold ?? ROUTER_DEFAULTS.failureThreshold,
      cooldownInitialMs: file.routing?.cooldown_initial_ms ?? ROUTER_DEFAULTS.cooldownInitialMs,
      cooldownMaxMs: file.routing?.cooldown_max_ms ?? ROUTER_DEFAULTS.cooldownMaxMs,
      healthCheckIntervalMs:
        file.routing?.health_check_interval_ms === undefined
          ? ROUTER_DEFAULTS.healthCheckIntervalMs
          : file.routing.health_check_interval_ms,
    },
    reservationTtlSeconds: envInt(env, "TDS_RESERVATION_TTL_SECONDS", 1, 86_400, problems) ?? file.reservation_ttl_seconds ?? 120,
    bootstrap: bootstrapText === undefined ? (file.bootstrap ?? true) : bootstrapText === "true" || bootstrapText === "1",
    bootstrapKeyFile: envString(env, "TDS_BOOTSTRAP_KEY_FILE") ?? file.bootstrap_key_file ?? null,
    configFile: configPath ? { path: resolve(configPath), secrets: secretsIn(file) } : null,
    // In any case: INFO, Debug.
    logLevel: oneOf("LOG_LEVEL", (envString(env, "LOG_LEVEL") ?? file.log_level ?? "info").toLowerCase(), LOG_LEVELS, problems) ?? "info",
    logFormat: oneOf("TDS_LOG_FORMAT", envString(env, "TDS_LOG_FORMAT") ?? file.log_format, LOG_FORMATS, problems) ?? null,
  };
  const databaseProblem = databaseUrlProblem(config.databaseUrl);
  if (databaseProblem !== null) problems.push(`TDS_DATABASE_URL ${JSON.stringify(withoutPassword(config.databaseUrl))} ${databaseProblem}`);
  if (config.redisUrl !== null && !/^rediss?:\/\//.test(config.redisUrl)) {
    problems.push(`TDS_REDIS_URL must be a redis:// or rediss:// URL (got ${JSON.stringify(withoutPassword(config.redisUrl))})`);
  }
  if (config.modelTimeoutMs >= config.reservationTtlSeconds * 1000) {
    problems.push(
      `TDS_MODEL_TIMEOUT_MS (${config.modelTimeoutMs}) must be shorter than TDS_RESERVATION_TTL_SECONDS (${config.reservationTtlSeconds} s), so a model call ends before its reservation expires`,
    );
  }
  if (config.routing.cooldownMaxMs < config.routing.cooldownInitialMs) {
    problems.push(
      `routing.cooldown_max_ms (${config.routing.cooldownMaxMs}) must not be shorter than routing.cooldown_initial_ms (${config.routing.cooldownInitialMs})`,
    );
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return config;
}
