import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildApp } from "../../src/app.ts";
import { loadConfig } from "../../src/config.ts";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import type { ModelService } from "../../src/models/model-service.ts";
import { type EngineLogger, type OpenEnginesOptions, openEngines, openModelServices } from "../../src/models/open-model-service.ts";
import { openStore } from "../../src/store/open-store.ts";
import { SERVING_SQLITE } from "../../src/store/sqlite/sqlite-store.ts";
import { startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { recordingLogger } from "../fixtures/gguf/tiny-model.ts";

export interface EngineGateway {
  url: string;
  /** An API key of the gateway's organization. */
  key: string;
  engines: Map<string, ModelService>;
  /** What openEngines and the engines logged. */
  log: ReturnType<typeof recordingLogger>;
  /** POST /v1/systemone with a one-question request for `model`: status and body. */
  decide(model: string): Promise<{ status: number; body: { detail?: string; model?: string } }>;
  readyz(): Promise<{ status: number; body: ReadyzBody }>;
  close(): Promise<void>;
}

export interface ReadyzBody {
  status: string;
  checks: { database: string; models: string };
  models: Record<string, { state: string; healthy: number; deployments: number; engine?: Record<string, unknown> }>;
}

/**
 * A real listening gateway (as test/support/gateway-harness.ts makes one) whose engines are opened by
 * `openEngines(config, logger, engineOptions)`, next to the fake model server (models "fake-small", "fake-large").
 */
export async function startEngineGateway(env: Record<string, string>, engineOptions: OpenEnginesOptions = {}): Promise<EngineGateway> {
  const dir = mkdtempSync(join(tmpdir(), "tds-engine-gw-"));
  const fake = await startFakeModelServer();
  const config = loadConfig({
    TDS_DATABASE_URL: `sqlite:${join(dir, "tds.sqlite")}`,
    TDS_MODEL_SERVICE_URL: fake.url,
    LOG_LEVEL: "silent",
    TDS_BOOTSTRAP: "false",
    TDS_MODEL_CACHE_DIR: join(dir, "models"),
    // Generous limits unless a test is about them (polls for an engine's state are not).
    TDS_REQUESTS_PER_MINUTE: "100000",
    TDS_READ_REQUESTS_PER_MINUTE: "100000",
    ...env,
  });
  const store = await openStore(config.databaseUrl, { sqlite: SERVING_SQLITE });
  const modelServices = openModelServices(config);
  const log = recordingLogger();
  const engines = await openEngines(config, log satisfies EngineLogger, engineOptions);
  const app = await buildApp(config, {
    store,
    modelServices,
    engines,
    routerOptions: { failureThreshold: Number.MAX_SAFE_INTEGER, healthCheckIntervalMs: null },
    logger: false,
  });
  await app.listen({ host: "127.0.0.1", port: 0 });
  const address = app.server.address();
  if (!address || typeof address === "string") throw new Error("no address");
  const url = `http://127.0.0.1:${address.port}`;
  const org = await store.createOrganization({ id: newOrganizationId(), name: "engine-org", nowMs: Date.now() });
  const key = generateApiKey();
  await store.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: Date.now() });

  return {
    url,
    key: key.raw,
    engines,
    log,
    async decide(model) {
      const res = await fetch(`${url}/v1/systemone`, {
        method: "POST",
        headers: { authorization: `Bearer ${key.raw}`, "content-type": "application/json" },
        body: JSON.stringify({ model, state: "a ticket", questions: { refund: { type: "noul", instructions: "Refund asked?" } } }),
      });
      return { status: res.status, body: (await res.json()) as { detail?: string; model?: string } };
    },
    async readyz() {
      const res = await fetch(`${url}/readyz`);
      return { status: res.status, body: (await res.json()) as ReadyzBody };
    },
    async close() {
      await app.close();
      await Promise.all([...modelServices.values(), ...engines.values()].map((s) => s.close()));
      await store.close();
      await fake.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Polls `probe` every 10 ms until it returns a value (not undefined); fails after `timeoutMs`, a bound against
 * hanging that no busy machine comes near (loading a model there can take many seconds).
 */
export async function waitFor<T>(what: string, probe: () => Promise<T | undefined> | T | undefined, timeoutMs = 120_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
