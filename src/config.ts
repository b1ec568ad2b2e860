import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { type ConfiguredModel, parseModelConfig, type ServiceConfig } from "./config-models.ts";
import { withSecretFiles } from "./config-secret-files.ts";
import { ConfigFile } from "./contract/config.ts";
import type { ServiceMode } from "./contract/decision.ts";
import { compileSchema, toFieldErrors } from "./contract/validation.ts";
import { octal, readableByOthers } from "./private-files.ts";
import { millionthsOf } from "./settings/parsers.ts";
import { envText, fileValue, readSettings } from "./settings/read-settings.ts";
import type { Setting } from "./settings/setting.ts";
import { type LogFormat, type LogLevel, SETTINGS } from "./settings/settings-table.ts";
import { urlHasPassword } from "./settings/url-passwords.ts";

export type { ConfiguredModel, DeploymentConfig, EmbeddedModelSettings, ServiceConfig } from "./config-models.ts";
export { LOG_FORMATS, LOG_LEVELS, type LogFormat, type LogLevel } from "./settings/settings-table.ts";
export { withoutPassword } from "./settings/url-passwords.ts";

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
  /** Units of the service-wide preview limit this instance counts at once (see SharedBlock). */
  previewGlobalBlock: number;
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

/** Batch decisions: what one submission may hold, how many of its requests run at once, how long it lives, its price. */
export interface BatchConfig {
  /** Request lines one submission may hold. */
  maxRequests: number;
  /** Largest submission body in bytes. */
  maxBytes: number;
  /** Requests of one organization's batches running at once, across all instances (the store counts every instance's claims). */
  concurrency: number;
  /** Batch requests this instance runs at once, all organizations together. */
  globalConcurrency: number;
  /** A request not started this long after its batch's submission ends with batch_expired. */
  completionWindowMs: number;
  /** An ended batch and its results are deleted this many days after it ends. */
  retentionDays: number;
  /** Paid mode: the model's prices are multiplied by this exact decimal ("0.5") for batch requests. */
  priceFactor: string;
  /** priceFactor in millionths (0.5 → 500000n). */
  priceFactorMillionths: bigint;
}

export interface Config {
  host: string;
  port: number;
  databaseUrl: string;
  /** The SQLite WAL file is kept to at most this many MiB on disk. */
  sqliteWalLimitMb: number;
  /** A SQLite gateway refuses to start with less free space than this on the database's volume; 0: no check. */
  minFreeDiskMb: number;
  /** PostgreSQL: bookkeeping transactions in flight at once (group commit lanes); SQLite runs one whatever it says. */
  bookkeepingLanes: number;
  /** How long a found API key is reused before it is read again (ms); 0: read for every request. */
  keyCacheMs: number;
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
  batches: BatchConfig;
  bootstrap: boolean;
  /** Where a non-terminal start writes the first API key; null = next to the SQLite file, or ./data/. */
  bootstrapKeyFile: string | null;
  /** The TDS_CONFIG file and the secret settings it holds (their names, never their values). */
  configFile: { path: string; secrets: string[] } | null;
  logLevel: LogLevel;
  /** null: pretty on a terminal, JSON otherwise. */
  logFormat: LogFormat | null;
}

export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`Invalid configuration:\n  - ${problems.join("\n  - ")}`);
    this.name = "ConfigError";
  }
}

/** The table's defaults of the request limits (the tds command shows the preview limit without a configuration). */
export const DEFAULT_LIMITS: Limits = {
  maxRequestBytes: SETTINGS.maxRequestBytes.default,
  maxQuestions: SETTINGS.maxQuestions.default,
  requestsPerMinute: SETTINGS.requestsPerMinute.default,
  readRequestsPerMinute: SETTINGS.readRequestsPerMinute.default,
  previewRequestLimit: SETTINGS.previewRequestLimit.default,
  previewGlobalRequestLimit: SETTINGS.previewGlobalRequestLimit.default,
  previewGlobalBlock: SETTINGS.previewGlobalBlock.default,
  reserveTokens: SETTINGS.reserveTokens.default,
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

/** The file's settings that hold a secret, by name: the keys and tokens, model_services' keys, then URLs with a password. */
function secretsIn(file: ConfigFile): string[] {
  const given = (Object.values(SETTINGS) as Setting[]).flatMap((s) => {
    const value = s.file === null ? undefined : fileValue(file, s.file);
    return s.secret !== undefined && typeof value === "string" && value !== "" ? [{ key: s.file!, kind: s.secret, value }] : [];
  });
  return [
    ...given.filter((s) => s.kind === "value").map((s) => s.key),
    ...(file.model_services ?? []).flatMap((service) => (service.api_key ? [`model_services "${service.name}" api_key`] : [])),
    ...given.filter((s) => s.kind === "url-password" && urlHasPassword(s.value)).map((s) => s.key),
  ];
}

/** The settings that are checked together; each problem names the settings by their variables. */
function crossProblems(config: Config): string[] {
  const problems: string[] = [];
  const { connections, routing } = config;
  if (connections.maxConnectionsPerAddress > connections.maxConnections) {
    problems.push(
      `TDS_MAX_CONNECTIONS_PER_ADDRESS (${connections.maxConnectionsPerAddress}) must not exceed TDS_MAX_CONNECTIONS (${connections.maxConnections})`,
    );
  }
  const names = new Set<string>();
  for (const n of config.models.flatMap((m) => [m.name, ...m.aliases])) {
    if (names.has(n)) problems.push(`models: the name or alias "${n}" is used twice`);
    names.add(n);
  }
  if (config.modelTimeoutMs >= config.reservationTtlSeconds * 1000) {
    problems.push(
      `TDS_MODEL_TIMEOUT_MS (${config.modelTimeoutMs}) must be shorter than TDS_RESERVATION_TTL_SECONDS (${config.reservationTtlSeconds} s), so a model call ends before its reservation expires`,
    );
  }
  if (routing.cooldownMaxMs < routing.cooldownInitialMs) {
    problems.push(
      `routing.cooldown_max_ms (${routing.cooldownMaxMs}) must not be shorter than routing.cooldown_initial_ms (${routing.cooldownInitialMs})`,
    );
  }
  return problems;
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
 * `_FILE` variable names), setting by setting through the settings table; throws ConfigError listing every problem.
 */
export function loadConfig(environment: Env = process.env): Config {
  const problems: string[] = [];
  const env = withSecretFiles(environment, problems);
  const configPath = envText(env, "TDS_CONFIG");
  const file: ConfigFile = configPath ? readConfigFile(configPath, problems) : {};
  const { values: v, sources } = readSettings(env, file, problems);
  const { modelServices, models } = parseModelConfig(
    {
      serviceUrls: v.modelServiceUrl,
      serviceUrlSetting: sources.modelServiceUrl ?? "TDS_MODEL_SERVICE_URL",
      serviceKey: v.modelServiceKey,
      modelPath: v.modelPath,
      modelName: v.modelName,
      gpu: v.modelGpu,
    },
    file,
    problems,
  );
  const config: Config = {
    host: v.host,
    port: v.port,
    databaseUrl: v.databaseUrl,
    sqliteWalLimitMb: v.sqliteWalLimitMb,
    minFreeDiskMb: v.minFreeDiskMb,
    bookkeepingLanes: v.bookkeepingLanes,
    keyCacheMs: v.keyCacheMs,
    redisUrl: v.redisUrl,
    metricsToken: v.metricsToken,
    adminToken: v.adminToken,
    serviceMode: v.serviceMode,
    modelServices,
    defaultModel: v.defaultModel ?? models[0]?.name ?? null,
    aliases: v.aliases,
    models,
    modelCacheDir: v.modelCacheDir,
    pricing: { pricePerMillionInputUsd: v.pricePerMillionInputUsd, pricePerMillionOutputUsd: v.pricePerMillionOutputUsd },
    limits: {
      maxRequestBytes: v.maxRequestBytes,
      maxQuestions: v.maxQuestions,
      requestsPerMinute: v.requestsPerMinute,
      readRequestsPerMinute: v.readRequestsPerMinute,
      previewRequestLimit: v.previewRequestLimit,
      previewGlobalRequestLimit: v.previewGlobalRequestLimit,
      previewGlobalBlock: v.previewGlobalBlock,
      reserveTokens: v.reserveTokens,
    },
    connections: {
      keepAliveTimeoutMs: v.keepAliveTimeoutMs,
      maxConnections: v.maxConnections,
      maxConnectionsPerAddress: v.maxConnectionsPerAddress,
    },
    trustedProxies: v.trustedProxies,
    modelTimeoutMs: v.modelTimeoutMs,
    routing: {
      maxAttempts: v.maxAttempts,
      attemptTimeoutMs: v.attemptTimeoutMs === undefined ? Math.ceil(v.modelTimeoutMs / 2) : v.attemptTimeoutMs,
      failureThreshold: v.failureThreshold,
      cooldownInitialMs: v.cooldownInitialMs,
      cooldownMaxMs: v.cooldownMaxMs,
      healthCheckIntervalMs: v.healthCheckIntervalMs,
    },
    reservationTtlSeconds: v.reservationTtlSeconds,
    batches: {
      maxRequests: v.maxBatchRequests,
      maxBytes: v.maxBatchBytes,
      concurrency: v.batchConcurrency,
      globalConcurrency: v.batchGlobalConcurrency,
      completionWindowMs: v.batchCompletionWindowHours * 3_600_000,
      retentionDays: v.batchRetentionDays,
      priceFactor: v.batchPriceFactor,
      priceFactorMillionths: millionthsOf(v.batchPriceFactor)!,
    },
    bootstrap: v.bootstrap,
    bootstrapKeyFile: v.bootstrapKeyFile,
    configFile: configPath ? { path: resolve(configPath), secrets: secretsIn(file) } : null,
    logLevel: v.logLevel,
    logFormat: v.logFormat,
  };
  problems.push(...crossProblems(config));
  if (problems.length > 0) throw new ConfigError(problems);
  return config;
}
