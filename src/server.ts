import { buildApp } from "./app.ts";
import { bootstrapFirstKey } from "./bootstrap.ts";
import { ConfigError, loadConfig } from "./config.ts";
import { openModelService } from "./models/open-model-service.ts";
import { openStore } from "./store/open-store.ts";

const SHUTDOWN_DEADLINE_MS = 10_000;

async function main(): Promise<void> {
  let config;
  try {
    config = loadConfig(process.env);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }

  const store = await openStore(config.databaseUrl);
  const modelService = openModelService(config);
  const app = await buildApp(config, { store, modelService });

  if (config.bootstrap) {
    const created = await bootstrapFirstKey(store, Date.now());
    if (created) {
      // Printed once, to the terminal only: never through the logger, never stored.
      process.stdout.write(
        `\nCreated organization "default" (${created.orgId}) and its first API key (${created.keyId}).\n` +
          `Save it now; it is not shown again:\n\n    ${created.rawKey}\n\n`,
      );
    }
  }
  if (!modelService) {
    app.log.warn("No model service configured: set TDS_MODEL_SERVICE_URL (a System One server). /v1/systemone and /v1/models answer 503 until then.");
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
    await modelService?.close();
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
