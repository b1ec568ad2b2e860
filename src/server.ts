import { buildApp } from "./app.ts";
import { bootstrapAndDeliver, bootstrapKeyFilePath } from "./bootstrap.ts";
import { ConfigError, configFileWarning, loadConfig, servingProblems } from "./config.ts";
import { systemClock } from "./gateway/clock.ts";
import { MemoryRateLimiter } from "./limits/memory-rate-limiter.ts";
import type { RateLimiter } from "./limits/rate-limiter.ts";
import { createRedisRateLimiter } from "./limits/redis-rate-limiter.ts";
import { openEngines, openModelServices } from "./models/open-model-service.ts";
import { Metrics } from "./observability/metrics.ts";
import { openStore } from "./store/open-store.ts";
import { SERVING_SQLITE } from "./store/sqlite/sqlite-store.ts";
import pino from "pino";

/** The process exits by then even if something hangs; in-flight decisions get 10 s of it (buildApp's grace). */
const SHUTDOWN_DEADLINE_MS = 15_000;

async function main(): Promise<void> {
  let config;
  try {
    config = loadConfig(process.env);
    const problems = servingProblems(config);
    if (problems.length > 0) throw new ConfigError(problems);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }

  const log = pino({ level: config.logLevel, redact: { paths: ["req.headers.authorization", "req.headers.cookie"], censor: "[redacted]" } });
  const configWarning = configFileWarning(config.configFile);
  if (configWarning) log.warn({ component: "config" }, configWarning);
  const metrics = new Metrics({ processMetrics: true });
  const storeLog = log.child({ component: "store" });
  const store = await openStore(config.databaseUrl, {
    sqlite: {
      ...SERVING_SQLITE,
      onCheckpointError: (message) => storeLog.warn(`SQLite WAL checkpoint failed (the WAL file grows until it succeeds): ${message}`),
      onWarning: (message) => storeLog.warn(message),
    },
  });
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
    rateLimiter = createRedisRateLimiter({
      url: config.redisUrl,
      fallback: new MemoryRateLimiter(systemClock),
      logger: { warn: (obj, msg) => limiterLog.warn(obj, msg), info: (obj, msg) => limiterLog.info(obj, msg) },
      onModeChange: (mode) => metrics.rateLimiterModeChanged(mode),
    });
  }

  const app = await buildApp(config, { store, modelServices, engines, metrics, loggerInstance: log, ...(rateLimiter ? { rateLimiter } : {}) });

  if (config.bootstrap) {
    // Printed once on a terminal; otherwise stdout may be a log file or a shipper, so the key goes to a 0600 file.
    await bootstrapAndDeliver(store, {
      terminal: process.stdout.isTTY ? process.stdout : null,
      keyFile: bootstrapKeyFilePath(config.bootstrapKeyFile, store),
      log: log.child({ component: "bootstrap" }),
      nowMs: Date.now,
    });
  }
  if (modelServices.size === 0 && engines.size === 0) {
    app.log.warn("No model service configured: set TDS_MODEL_SERVICE_URL (a System One server) or TDS_MODEL_PATH (a GGUF model). /v1/systemone and /v1/models answer 503 until then.");
  }

  await app.listen({ host: config.host, port: config.port });

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
    await app.close();
    await rateLimiter?.close();
    await Promise.all([...modelServices.values(), ...engines.values()].map((s) => s.close()));
    await store.close();
    process.exit(0);
  };
  process.on("SIGINT", () => void shutdown("SIGINT"));
  process.on("SIGTERM", () => void shutdown("SIGTERM"));
}

main().catch((err) => {
  process.stderr.write(`Failed to start: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
