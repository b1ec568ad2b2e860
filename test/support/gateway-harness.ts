import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { FastifyBaseLogger, FastifyInstance } from "fastify";
import { buildApp } from "../../src/app.ts";
import { type Config, loadConfig } from "../../src/config.ts";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import type { Clock } from "../../src/domain/clock.ts";
import type { RateLimiter } from "../../src/limits/rate-limiter.ts";
import type { ModelService } from "../../src/models/model-service.ts";
import { openEngines, openModelServices } from "../../src/models/open-model-service.ts";
import type { RouterOptions } from "../../src/models/routing/types.ts";
import type { Metrics } from "../../src/observability/metrics.ts";
import { openStore } from "../../src/store/open-store.ts";
import { SERVING_SQLITE } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";
import { type FakeModelServer, type FakeModelServerOptions, startFakeModelServer } from "../fixtures/fake-model-server.ts";

export interface Gateway {
  url: string;
  config: Config;
  store: Store;
  app: FastifyInstance;
  fake: FakeModelServer | null;
  orgId: string;
  key: string;
  keyId: string;
  /** POST /v1/systemone with the org's key; `body` is sent as given (string) or JSON-encoded. */
  decide(body: unknown, headers?: Record<string, string>): Promise<Response>;
  get(path: string, headers?: Record<string, string>): Promise<Response>;
  /** A second organization with its own key. */
  newOrg(name: string): Promise<{ orgId: string; key: string; keyId: string }>;
  close(): Promise<void>;
}

export interface GatewayOptions {
  env?: Record<string, string>;
  /** false: no model service configured; options: the fake model server's. */
  fake?: boolean | FakeModelServerOptions;
  modelService?: ModelService | null;
  clock?: Clock;
  rateLimiter?: RateLimiter;
  metrics?: Metrics;
  shutdownGraceMs?: number;
  /** How long a durable step waits for busy storage (default 2 s). */
  storageWaitMs?: number;
  /**
   * Options of the model routers. By default tests that are not about routing get no passive cooldowns and no active
   * checks, so that a sequence of deliberate model failures answers each with its own status.
   */
  routerOptions?: RouterOptions;
  /** Name of the organization made with the first key (default "test-org"; another when a second gateway shares the database). */
  orgName?: string;
  /** Open the in-process engines the configuration names (default: none, so no test downloads the default model). */
  engines?: boolean;
  /** HTTP deadlines (defaults 30 s and 10 s). */
  requestTimeoutMs?: number;
  headersTimeoutMs?: number;
  /** A pino logger for the app (default: no logs). */
  loggerInstance?: FastifyBaseLogger;
  /** false: submitted batches stay queued (the test claims and finishes their requests through the store). */
  runBatches?: boolean;
}

/** A real listening gateway on 127.0.0.1:<random>, a temp SQLite file and (by default) the fake model server. */
export async function startGateway(options: GatewayOptions = {}): Promise<Gateway> {
  const dir = mkdtempSync(join(tmpdir(), "tds-test-"));
  const fake =
    options.fake === false || options.modelService !== undefined
      ? null
      : await startFakeModelServer(typeof options.fake === "object" ? options.fake : {});
  const config = loadConfig({
    TDS_DATABASE_URL: `sqlite:${join(dir, "tds.sqlite")}`,
    ...(fake ? { TDS_MODEL_SERVICE_URL: fake.url } : {}),
    // An injected model service stands for the configured upstream (no embedded default model).
    ...(options.modelService ? { TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9" } : {}),
    LOG_LEVEL: "silent",
    TDS_BOOTSTRAP: "false",
    // Generous limits unless a test is about them.
    TDS_REQUESTS_PER_MINUTE: "100000",
    TDS_PREVIEW_REQUEST_LIMIT: "1000000",
    TDS_PREVIEW_GLOBAL_REQUEST_LIMIT: "1000000",
    ...options.env,
  });
  const store = await openStore(config.databaseUrl, { sqlite: SERVING_SQLITE });
  const modelServices = options.modelService !== undefined ? null : openModelServices(config);
  const silent = { info() {}, warn() {}, error() {} };
  const engines = options.engines ? await openEngines(config, silent) : new Map<string, ModelService>();
  const app = await buildApp(config, {
    store,
    ...(modelServices ? { modelServices } : { modelService: options.modelService ?? null }),
    engines,
    ...(options.clock ? { clock: options.clock } : {}),
    ...(options.rateLimiter ? { rateLimiter: options.rateLimiter } : {}),
    ...(options.metrics ? { metrics: options.metrics } : {}),
    ...(options.shutdownGraceMs !== undefined ? { shutdownGraceMs: options.shutdownGraceMs } : {}),
    ...(options.storageWaitMs !== undefined ? { storageWaitMs: options.storageWaitMs } : {}),
    routerOptions: options.routerOptions ?? { failureThreshold: Number.MAX_SAFE_INTEGER, healthCheckIntervalMs: null },
    ...(options.requestTimeoutMs !== undefined ? { requestTimeoutMs: options.requestTimeoutMs } : {}),
    ...(options.headersTimeoutMs !== undefined ? { headersTimeoutMs: options.headersTimeoutMs } : {}),
    ...(options.loggerInstance ? { loggerInstance: options.loggerInstance } : { logger: false }),
    ...(options.runBatches !== undefined ? { runBatches: options.runBatches } : {}),
  });
  await app.listen({ host: "127.0.0.1", port: 0 });
  const address = app.server.address();
  if (!address || typeof address === "string") throw new Error("no address");
  const url = `http://127.0.0.1:${address.port}`;

  const newOrg = async (name: string) => {
    const org = await store.createOrganization({ id: newOrganizationId(), name, nowMs: Date.now() });
    const key = generateApiKey();
    await store.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: Date.now() });
    return { orgId: org.id, key: key.raw, keyId: key.id };
  };
  const first = await newOrg(options.orgName ?? "test-org");

  return {
    url,
    config,
    store,
    app,
    fake,
    orgId: first.orgId,
    key: first.key,
    keyId: first.keyId,
    newOrg,
    decide: (body, headers = {}) =>
      fetch(`${url}/v1/systemone`, {
        method: "POST",
        headers: { authorization: `Bearer ${first.key}`, "content-type": "application/json", ...headers },
        body: typeof body === "string" ? body : JSON.stringify(body),
      }),
    get: (path, headers = {}) => fetch(`${url}${path}`, { headers: { authorization: `Bearer ${first.key}`, ...headers } }),
    close: async () => {
      await app.close();
      const services = [...(modelServices?.values() ?? []), ...engines.values(), ...(options.modelService ? [options.modelService] : [])];
      await Promise.all(services.map((s) => s.close()));
      await store.close();
      await fake?.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * A realistic ticket history (about 0.8 KB of text). A paid sampleRequest() carrying it reserves its whole token bound,
 * ~1,700 tokens (byteBound in test/support/token-bound.ts), well within the default reserve_tokens (32768); a
 * reserve_tokens below its bound refuses it with 413 token_bound_over_reserve.
 */
export const TICKET_HISTORY = Array.from(
  { length: 12 },
  (_, i) => `2026-11-${10 + i}: the customer wrote again about the double charge (${i}).`,
).join(" ");

/** A request with one question of each type (its state carries TICKET_HISTORY unless overridden). */
export function sampleRequest(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    state: { ticket: "I was charged twice for my subscription this month.", customer_tier: "gold", history: TICKET_HISTORY },
    questions: {
      topic: {
        type: "choice",
        instructions: "What is the ticket about?",
        criteria: { billing: "Payments and invoices", bug: "Something broken", other: null },
      },
      urgency: { type: "score", instructions: "How urgent is it?", criteria: ["not urgent", "soon", "today", "now"] },
      refund: { type: "noul", instructions: "Does the customer ask for a refund?" },
    },
    ...overrides,
  };
}

/** A decision request (the sample) with another organization's `key`: its HTTP status. */
export async function decideWithKey(gw: Pick<Gateway, "url">, key: string): Promise<number> {
  const res = await fetch(`${gw.url}/v1/systemone`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(sampleRequest()),
  });
  await res.arrayBuffer();
  return res.status;
}
