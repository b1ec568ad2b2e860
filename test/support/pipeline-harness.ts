/**
 * The decision pipeline without a server: composed as src/app.ts composes it (ModelRegistry over the model services,
 * GroupCommit over the store, AdmissionPolicy, DecisionPipeline, the per-minute RateLimiter), on in-memory adapters —
 * a SQLite `:memory:` store, the in-process fake ModelService, a MemoryRateLimiter — and a FixedClock.
 */
import { createHash } from "node:crypto";
import { afterEach } from "node:test";
import type { FastifyReply, FastifyRequest } from "fastify";
import { type Config, loadConfig } from "../../src/config.ts";
import type { DecisionRequest } from "../../src/contract/decision.ts";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import type { Organization } from "../../src/domain/organizations.ts";
import type { UsageSource } from "../../src/domain/usage-records.ts";
import { AdmissionPolicy } from "../../src/gateway/admission.ts";
import { DecisionPipeline, type DecisionReply } from "../../src/gateway/decision-pipeline.ts";
import type { ModelFailureReport } from "../../src/gateway/model-failure-report.ts";
import { ModelRegistry } from "../../src/gateway/model-registry.ts";
import type { DecisionObserver } from "../../src/gateway/observer.ts";
import { rateLimit } from "../../src/http/rate-limit.ts";
import { MemoryRateLimiter } from "../../src/limits/memory-rate-limiter.ts";
import { GroupCommit } from "../../src/store/group-commit.ts";
import { openStore } from "../../src/store/open-store.ts";
import { SERVING_SQLITE } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";
import { createFakeModelService, type FakeModelService, type FakeModelServiceOptions } from "./fake-model-service.ts";
import { FixedClock } from "./fixed-clock.ts";

/** What the pipeline told its observer, in order. */
export interface ObservedEvents {
  decided: number;
  modelFailed: string[];
  reservation: string[];
  rejected: string[];
}

export interface PipelineRig {
  config: Config;
  clock: FixedClock;
  store: Store;
  books: GroupCommit;
  registry: ModelRegistry;
  admission: AdmissionPolicy;
  pipeline: DecisionPipeline;
  limiter: MemoryRateLimiter;
  /** The fake model service the registry discovered the models from. */
  model: FakeModelService;
  /** Its name in config.modelServices (what usage records call the deployment). */
  serviceName: string;
  events: ObservedEvents;
  /** Errors the pipeline reported as unexpected after admission. */
  unexpected: unknown[];
  /** The failed model calls the pipeline reported (what the app logs at warn). */
  modelFailures: ModelFailureReport[];
  /** Work the pipeline left running after answering (background completions). */
  background: Promise<unknown>[];
  org: Organization;
  keyId: string;
  newOrg(name: string): Promise<{ org: Organization; keyId: string }>;
  /**
   * One decision as POST /v1/systemone runs it after authentication: the per-minute limit, max_questions, then the
   * pipeline with the body's Idempotency-Key hash (sha256 of the body text) and its own text of state and questions.
   */
  decide(body: DecisionRequest, options?: DecideOptions): Promise<DecisionReply>;
  close(): Promise<void>;
}

export interface DecideOptions {
  org?: Organization;
  keyId?: string;
  idempotencyKey?: string;
  signal?: AbortSignal;
  source?: UsageSource;
  /** The request id (default req_test_<n>). */
  requestId?: string;
}

export interface PipelineRigOptions {
  /** Settings over the rig's defaults (a temp env for loadConfig). */
  env?: Record<string, string>;
  /** Epoch ms the FixedClock starts at (default 2026-03-01T12:00:00Z). */
  startMs?: number;
  model?: FakeModelServiceOptions;
}

export const RIG_START_MS = Date.UTC(2026, 2, 1, 12, 0, 0);

let requestCounter = 0;

export async function openPipelineRig(options: PipelineRigOptions = {}): Promise<PipelineRig> {
  const config = loadConfig({
    TDS_DATABASE_URL: "sqlite::memory:",
    // The fake stands for the configured model service (the models are discovered from its list, as from a real one).
    TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9",
    LOG_LEVEL: "silent",
    TDS_BOOTSTRAP: "false",
    ...options.env,
  });
  const clock = new FixedClock(options.startMs ?? RIG_START_MS);
  const store = await openStore(config.databaseUrl, { sqlite: SERVING_SQLITE });
  const model = createFakeModelService(options.model);
  const serviceName = config.modelServices[0]?.name ?? "default";
  const events: ObservedEvents = { decided: 0, modelFailed: [], reservation: [], rejected: [] };
  const observer: DecisionObserver = {
    decided: () => void events.decided++,
    modelFailed: (kind) => void events.modelFailed.push(kind),
    reservation: (outcome) => void events.reservation.push(outcome),
    rejected: (reason) => void events.rejected.push(reason),
  };
  // As buildApp: one router per model over the services; no passive cooldowns or active checks, as the gateway
  // harness does for tests that are not about routing.
  const registry = new ModelRegistry(config, new Map([[serviceName, model]]), new Map(), {
    nowMs: () => clock.nowMs(),
    router: { failureThreshold: Number.MAX_SAFE_INTEGER, healthCheckIntervalMs: null },
  });
  registry.start();
  const books = new GroupCommit(store);
  const admission = new AdmissionPolicy({ books, clock, config, observer });
  const limiter = new MemoryRateLimiter(clock);
  const decisionLimit = rateLimit({
    limiter,
    limit: config.limits.requestsPerMinute,
    key: (orgId) => orgId,
    setting: "requests_per_minute",
    what: "request",
    observer,
  });
  const unexpected: unknown[] = [];
  const modelFailures: ModelFailureReport[] = [];
  const background: Promise<unknown>[] = [];
  const pipeline = new DecisionPipeline({
    books,
    registry,
    admission,
    clock,
    config,
    observer,
    background: (work) => void background.push(work),
    onUnexpected: (err) => void unexpected.push(err),
    onModelFailure: (report) => void modelFailures.push(report),
  });

  const newOrg = async (name: string) => {
    const org = await store.createOrganization({ id: newOrganizationId(), name, nowMs: clock.nowMs() });
    const key = generateApiKey();
    await store.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: clock.nowMs() });
    return { org, keyId: key.id };
  };
  const first = await newOrg("test-org");

  return {
    config,
    clock,
    store,
    books,
    registry,
    admission,
    pipeline,
    limiter,
    model,
    serviceName,
    events,
    unexpected,
    modelFailures,
    background,
    org: first.org,
    keyId: first.keyId,
    newOrg,
    async decide(body, o = {}) {
      const org = o.org ?? first.org;
      // The route's onRequest hooks after authentication: the per-minute limit, counted before the body is read.
      await decisionLimit({ auth: { org, keyId: o.keyId ?? first.keyId } } as unknown as FastifyRequest, { sent: false } as FastifyReply);
      pipeline.checkQuestionCount(body);
      const text = JSON.stringify(body);
      return pipeline.decide(
        {
          requestId: o.requestId ?? `req_test_${++requestCounter}`,
          org,
          keyId: o.keyId ?? first.keyId,
          source: o.source ?? "api",
          startedAt: performance.now(),
          ...(o.signal ? { signal: o.signal } : {}),
        },
        body,
        o.idempotencyKey !== undefined ? { key: o.idempotencyKey, requestHash: createHash("sha256").update(text).digest("hex") } : null,
        { state: JSON.stringify(body.state), questions: JSON.stringify(body.questions) },
      );
    },
    async close() {
      // A test that failed midway may have left a call held: let it finish before the store closes.
      model.releaseHeld();
      for (let i = 0; i < 10 && model.inFlight > 0; i++) await new Promise((r) => setImmediate(r));
      await new Promise((r) => setImmediate(r));
      await Promise.allSettled(background);
      await registry.close();
      await model.close();
      await limiter.close();
      await store.close();
    },
  };
}

/**
 * The rig opener of a test file, its rigs closed after each test (call it at the top level of the file, where
 * node:test takes the afterEach hook for the whole file).
 */
export function rigsClosedAfterEach(): (options?: PipelineRigOptions) => Promise<PipelineRig> {
  let open: PipelineRig[] = [];
  afterEach(async () => {
    await Promise.all(open.map((r) => r.close()));
    open = [];
  });
  return async (options = {}) => {
    const r = await openPipelineRig(options);
    open.push(r);
    return r;
  };
}
