// First: a V8 flag for the whole process, set before the other modules run (startup/gc-flags.ts).
import "./startup/gc-flags.ts";
import { buildApp, CLOSE_HOOKS_MS, SHUTDOWN_GRACE_MS } from "./app.ts";
import { bootstrapAndDeliver, bootstrapKeyFilePath } from "./bootstrap.ts";
import { type Config, ConfigError, configFileWarning, loadConfig, servingProblems } from "./config.ts";
import { engineKey, listingServices } from "./config-models.ts";
import type { ModelEntry } from "./contract/models.ts";
import { systemClock } from "./domain/clock.ts";
import { MemoryRateLimiter } from "./limits/memory-rate-limiter.ts";
import type { RateLimiter } from "./limits/rate-limiter.ts";
import { openRedisRateLimiter } from "./limits/redis-rate-limiter.ts";
import type { ModelService } from "./models/model-service.ts";
import { openEngines, openModelServices } from "./models/open-model-service.ts";
import { createLogger } from "./observability/logging.ts";
import { Metrics } from "./observability/metrics.ts";
import { type TracingSettings, tracingSettings } from "./observability/tracing-settings.ts";
import { freeSpaceFailure } from "./startup/disk-space.ts";
import { databaseFailure, listenFailure, StartupFailure } from "./startup/failures.ts";
import { correctedUrlWarnings } from "./startup/model-service-urls.ts";
import { reservationWarning, startupSummary } from "./startup/summary.ts";
import { openStore } from "./store/open-store.ts";
import { SERVING_SQLITE } from "./store/sqlite/sqlite-store.ts";
import { SERVICE_NAME, SERVICE_VERSION } from "./version.ts";

/** A shutdown that has not ended by then exits 1: the drain and the close hooks, then closing the services and the store. */
const SHUTDOWN_DEADLINE_MS = SHUTDOWN_GRACE_MS + CLOSE_HOOKS_MS + 5000;
/** How long the shutdown waits for the collector to take the last spans (alongside closing the store). */
const TRACES_FLUSH_MS = 2000;
/** How long the start-up summary waits for the model services to list their models. */
const LIST_WAIT_MS = 2000;

const USAGE = `Usage: ${SERVICE_NAME} [--version] [--help]

Starts the Typed Decision Service. Every setting comes from the environment (or the JSON file named by
TDS_CONFIG); .env.example lists them all with their defaults.
`;

/** The names of the models the model services list, for the summary; null when none answers in time. */
async function listedModels(config: Config, services: ReadonlyMap<string, ModelService>): Promise<string[] | null> {
  const unbound = listingServices(config);
  if (unbound.length === 0) return [];
  const lists = await Promise.allSettled(unbound.map((s) => services.get(s.name)!.listModels({ timeoutMs: LIST_WAIT_MS })));
  const answered = lists.flatMap((l) => (l.status === "fulfilled" ? [l.value.map((m) => m.name)] : []));
  return answered.length === 0 ? null : [...new Set(answered.flat())];
}

/** Paid mode: the models offered with their context, for the reservation warning; null in preview or when not listed in time. */
async function offeredModels(config: Config, list: () => Promise<ModelEntry[]>): Promise<ModelEntry[] | null> {
  if (config.serviceMode !== "paid") return null;
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), LIST_WAIT_MS);
  });
  try {
    return await Promise.race([list().catch(() => null), late]);
  } finally {
    clearTimeout(timer);
  }
}

async function main(): Promise<void> {
  let config: Config;
  let traces: TracingSettings | null;
  try {
    config = loadConfig(process.env);
    traces = tracingSettings(process.env, SERVICE_VERSION);
    const problems = servingProblems(config);
    if (problems.length > 0) throw new ConfigError(problems);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }

  const log = createLogger({ ...config, traced: traces !== null });
  const tracingLog = log.child({ component: "tracing" });
  // The SDK and its exporters are loaded only when tracing is on.
  const tracing =
    traces && (await import("./observability/tracing.ts")).startTracing(traces, { warn: (message) => tracingLog.warn(message) });
  if (traces) {
    const endpoint = traces.url.replace(/\/\/[^/@]*@/, "//");
    tracingLog.info(
      { endpoint, protocol: traces.protocol, sampler: traces.sampler, service: traces.resource["service.name"] },
      `tracing on: spans go to ${endpoint} (OTLP ${traces.protocol}, sampler ${traces.sampler.name})`,
    );
  }
  const configWarning = configFileWarning(config.configFile);
  if (configWarning) log.warn({ component: "config" }, configWarning);
  for (const warning of correctedUrlWarnings(config)) log.warn({ component: "config" }, warning);
  const metrics = new Metrics({ processMetrics: true });
  const storeLog = log.child({ component: "store" });
  const lowOnSpace = freeSpaceFailure(config.databaseUrl, config.minFreeDiskMb);
  if (lowOnSpace) throw lowOnSpace;
  const store = await openStore(config.databaseUrl, {
    sqlite: {
      ...SERVING_SQLITE,
      walLimitBytes: config.sqliteWalLimitMb * 1024 * 1024,
      onCheckpointError: (message) => storeLog.warn(`SQLite WAL checkpoint failed (the WAL file grows until it succeeds): ${message}`),
      onWarning: (message) => storeLog.warn(message),
      onReopen: ({ reopened, message }) => (reopened ? storeLog.info(message) : storeLog.warn(message)),
    },
    postgres: {
      bookkeepingLanes: config.bookkeepingLanes,
      keepStatisticsFresh: true,
      onStatisticsProblem: (message) => storeLog.warn(message),
    },
  }).catch((err: unknown) => {
    throw databaseFailure(err, config.databaseUrl);
  });
  store.cacheKeyLookups(config.keyCacheMs);
  const modelServices = openModelServices(config);
  const engineLog = log.child({ component: "embedded-engine" });
  const engines = await openEngines(config, {
    info: (msg) => engineLog.info(msg),
    warn: (msg) => engineLog.warn(msg),
    error: (msg) => engineLog.error(msg),
  });

  let rateLimiter: RateLimiter | undefined;
  if (config.redisUrl) {
    const limiterLog = log.child({ component: "rate-limiter" });
    rateLimiter = openRedisRateLimiter({
      url: config.redisUrl,
      fallback: new MemoryRateLimiter(systemClock),
      logger: { warn: (obj, msg) => limiterLog.warn(obj, msg), info: (obj, msg) => limiterLog.info(obj, msg) },
      onModeChange: (mode) => metrics.rateLimiterModeChanged(mode),
    });
  }

  const app = await buildApp(config, {
    store,
    modelServices,
    engines,
    metrics,
    loggerInstance: log,
    ...(rateLimiter ? { rateLimiter } : {}),
    ...(tracing ? { tracing } : {}),
  });

  if (config.bootstrap) {
    // Printed once on a terminal; otherwise stdout may be a log file or a shipper, so the key goes to a 0600 file.
    await bootstrapAndDeliver(store, {
      terminal: process.stdout.isTTY ? process.stdout : null,
      keyFile: bootstrapKeyFilePath(config.bootstrapKeyFile, store),
      log: log.child({ component: "bootstrap" }),
      nowMs: Date.now,
    });
  }

  const url = await app.listen({ host: config.host, port: config.port }).catch((err: unknown) => {
    throw listenFailure(err, config.host, config.port);
  });
  const [listed, defaultModel, offered] = await Promise.all([
    listedModels(config, modelServices),
    app.modelRegistry.defaultModel(),
    offeredModels(config, () => app.modelRegistry.list()),
  ]);
  const engineStatus = (model: string, index: number) => engines.get(engineKey(model, index))?.status?.() ?? null;
  const warning = reservationWarning(config, offered);
  if (warning) log.warn({ component: "reservations" }, warning);
  const summary = startupSummary({ config, url, listed, defaultModel, engineStatus });
  log.info({ startup: summary.fields }, summary.text);

  let closing = false;
  const shutdown = async (signal: string) => {
    if (closing) return;
    closing = true;
    app.log.info({ signal }, "shutting down");
    const timer = setTimeout(() => {
      app.log.error("shutdown deadline passed; exiting");
      process.exit(1);
    }, SHUTDOWN_DEADLINE_MS);
    timer.unref();
    let code = 0;
    try {
      await app.close();
    } catch (err) {
      app.log.error({ err }, "closing the server failed; closing the rest");
      code = 1;
    }
    // The spans of the drained requests are exported before the exit when the collector takes them in time.
    const traced = tracing
      ?.shutdown(TRACES_FLUSH_MS)
      .then((exported) => {
        if (!exported) tracingLog.warn(`the last spans were not exported: the collector did not answer within ${TRACES_FLUSH_MS} ms`);
      })
      .catch((err: unknown) => tracingLog.warn({ err }, "the last spans could not be exported"));
    await rateLimiter?.close();
    await Promise.all([...modelServices.values(), ...engines.values()].map((s) => s.close()));
    await store.close();
    await traced;
    process.exit(code);
  };
  process.on("SIGINT", () => void shutdown("SIGINT"));
  process.on("SIGTERM", () => void shutdown("SIGTERM"));
}

const args = process.argv.slice(2);
if (args.includes("--version") || args.includes("-v")) {
  process.stdout.write(`${SERVICE_NAME} ${SERVICE_VERSION}\n`);
} else if (args.includes("--help") || args.includes("-h")) {
  process.stdout.write(USAGE);
} else if (args.length > 0) {
  process.stderr.write(`Unknown argument ${JSON.stringify(args[0])}.\n\n${USAGE}`);
  process.exitCode = 2;
} else {
  main().catch((err: unknown) => {
    // A failure that names its setting is one line; anything else is a bug worth its stack.
    const text =
      err instanceof StartupFailure ? err.message : `Failed to start: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`;
    process.stderr.write(`${text}\n`);
    process.exit(1);
  });
}
