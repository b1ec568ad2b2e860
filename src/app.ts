import { maxHeaderSize } from "node:http";
import Fastify, { type FastifyBaseLogger, type FastifyInstance, LogController } from "fastify";
import { BatchRequestRun } from "./batches/batch-request-run.ts";
import { BatchRunner } from "./batches/batch-runner.ts";
import { BatchShare } from "./batches/batch-share.ts";
import { cachedKeyLookup } from "./batches/cached-key-lookup.ts";
import { FinishGroup } from "./batches/finish-group.ts";
import type { Config } from "./config.ts";
import { compileSchema } from "./contract/validation.ts";
import { addressRanges } from "./domain/address-ranges.ts";
import { newRequestId } from "./domain/api-keys.ts";
import type { PurgeResult, SweepResult } from "./domain/bookkeeping.ts";
import { type Clock, systemClock } from "./domain/clock.ts";
import { AdmissionPolicy } from "./gateway/admission.ts";
import { newInstanceId, SWEEP_INTERVAL_MS, startBookkeepingJobs } from "./gateway/bookkeeping-jobs.ts";
import { DecisionPipeline } from "./gateway/decision-pipeline.ts";
import { deploymentHealthLine } from "./gateway/deployment-health-log.ts";
import { KeyUseRecorder } from "./gateway/key-use.ts";
import { modelFailureLevel } from "./gateway/model-failure-report.ts";
import { ModelRegistry, type RegistryOptions } from "./gateway/model-registry.ts";
import { guardConnections } from "./http/connection-guard.ts";
import { clientErrorHandler, frameworkErrorHandler, installErrorHandling } from "./http/error-handler.ts";
import { InFlight } from "./http/in-flight.ts";
import { installJsonBodyParser } from "./http/json-body-parser.ts";
import { installOpenApi } from "./http/openapi.ts";
import { rateLimit } from "./http/rate-limit.ts";
import { installRequestContext } from "./http/request-context.ts";
import { adminRoutes } from "./http/routes/admin.ts";
import { apiDocsRoutes } from "./http/routes/api-docs.ts";
import { batchRoutes } from "./http/routes/batches.ts";
import { consoleRoutes } from "./http/routes/console.ts";
import { decisionRoutes } from "./http/routes/decisions.ts";
import { healthRoutes } from "./http/routes/health.ts";
import { metricsRoutes } from "./http/routes/metrics.ts";
import { modelRoutes } from "./http/routes/models.ts";
import { organizationRoutes } from "./http/routes/organization.ts";
import { serviceConfigRoutes } from "./http/routes/service-config.ts";
import { usageRoutes } from "./http/routes/usage.ts";
import { MemoryRateLimiter } from "./limits/memory-rate-limiter.ts";
import type { RateLimiter } from "./limits/rate-limiter.ts";
import { engineEntries } from "./models/engine-id.ts";
import type { ModelService } from "./models/model-service.ts";
import { traceRequests } from "./observability/http-tracing.ts";
import { LOG_REDACTION } from "./observability/logging.ts";
import { Metrics, metricsObserver } from "./observability/metrics.ts";
import { type Tracing, traceLogFields } from "./observability/spans.ts";
import { GroupCommit, lanesFor } from "./store/group-commit.ts";
import type { Store } from "./store/store.ts";
import { SERVICE_VERSION } from "./version.ts";

export interface AppDeps {
  store: Store;
  /** The System One model service; null when none is configured. */
  /** The model services by name (config.modelServices); a single injected service stands for the first configured one. */
  modelServices?: ReadonlyMap<string, ModelService>;
  modelService?: ModelService | null;
  /** In-process engines by the label of their EngineId (as openEngines opens them). */
  engines?: ReadonlyMap<string, ModelService>;
  /** Options of the model routers; default config.routing (tests shorten cooldowns and health-check intervals). */
  routerOptions?: RegistryOptions["router"];
  clock?: Clock;
  /** Defaults to the in-memory limiter (one process). */
  rateLimiter?: RateLimiter;
  /** How often the sweep runs (the work of stopped processes, then requests in flight past the reservation TTL); default SWEEP_INTERVAL_MS (5 s). */
  sweepIntervalMs?: number;
  /** How often expired idempotency entries and old preview counters are deleted (default 10 minutes). */
  purgeIntervalMs?: number;
  /** How long a durable step waits for busy storage before the request gets 503 (default 2 s). */
  storageWaitMs?: number;
  /** Deadlines and the connection cap (defaults REQUEST_TIMEOUT_MS, HEADERS_TIMEOUT_MS, config.connections.maxConnections); for tests. */
  requestTimeoutMs?: number;
  headersTimeoutMs?: number;
  maxConnections?: number;
  /** Defaults to a fresh registry (with process metrics only when true is passed to the server's). */
  metrics?: Metrics;
  /** How long close() lets in-flight decisions finish before abandoning their model calls (default 10 s). */
  shutdownGraceMs?: number;
  /** pino options or false; defaults to JSON logs at config.logLevel. */
  logger?: boolean | Record<string, unknown>;
  /** A pino logger shared with the rest of the process (wins over `logger`). */
  loggerInstance?: FastifyBaseLogger;
  /** OpenTelemetry tracing (startTracing), when the OTEL_* variables ask for it; absent: nothing is traced. */
  tracing?: Tracing;
  /** Run the batch requests of this instance's share (default true); false leaves submitted batches queued (tests). */
  runBatches?: boolean;
  /** How often the keys' last use is written (default KEY_USE_INTERVAL_MS, a minute). */
  keyUseIntervalMs?: number;
}

/** The whole request (headers and body) must arrive within this. */
export const REQUEST_TIMEOUT_MS = 30_000;
/** How long close() lets in-flight decisions finish before abandoning their model calls. */
export const SHUTDOWN_GRACE_MS = 10_000;
/** Beyond the drain, the time the close hooks (the abandoned calls winding up, the jobs, the runner) may take. */
export const CLOSE_HOOKS_MS = 10_000;
/** The request line and headers must arrive within this. */
export const HEADERS_TIMEOUT_MS = 10_000;

declare module "fastify" {
  interface FastifyInstance {
    /** Runs the expiry sweep now (tests, operations). */
    sweepBooks(): Promise<SweepResult>;
    /** Runs the purge now (tests, operations). */
    purgeBooks(): Promise<PurgeResult>;
    /** The models offered, their routers and the default model. */
    modelRegistry: ModelRegistry;
    /** This gateway process's id: recorded on the requests it admits and kept alive by its lease. */
    instanceId: string;
    /** This instance's share of the batch work (its jobs can be run now: tests, operations). */
    batchRunner: BatchRunner;
    /** Writes the last use of the keys this instance authenticated now, instead of at its interval (tests, operations). */
    flushKeyUse(): Promise<void>;
  }
}

/** Composition root: no I/O here beyond what the deps already hold. */
export async function buildApp(config: Config, deps: AppDeps): Promise<FastifyInstance> {
  const clock = deps.clock ?? systemClock;
  const requestTimeoutMs = deps.requestTimeoutMs ?? REQUEST_TIMEOUT_MS;
  const shutdownGraceMs = deps.shutdownGraceMs ?? SHUTDOWN_GRACE_MS;
  const headersTimeoutMs = deps.headersTimeoutMs ?? HEADERS_TIMEOUT_MS;
  const trustedProxies = addressRanges(config.trustedProxies);
  const app = Fastify({
    ...(deps.loggerInstance
      ? { loggerInstance: deps.loggerInstance }
      : {
          logger: deps.logger ?? {
            level: config.logLevel,
            redact: LOG_REDACTION,
            ...(deps.tracing ? { mixin: traceLogFields } : {}),
          },
        }),
    genReqId: newRequestId,
    logController: new LogController({ requestIdLogLabel: "request_id" }),
    return503OnClosing: true,
    // Fastify times the close hooks too: the in-flight drain (shutdownGraceMs) and what follows it must fit.
    pluginTimeout: shutdownGraceMs + CLOSE_HOOKS_MS,
    // Time to receive a whole request (headers and body) from the client; a body that never
    // completes (a lying Content-Length, a trickle) cannot hold a connection open past it.
    requestTimeout: requestTimeoutMs,
    // Node checks those deadlines every connectionsCheckingInterval (30 s by default, so a deadline of
    // 30 s could take 60): once a second keeps them within a second.
    http: { headersTimeout: headersTimeoutMs, connectionsCheckingInterval: 1000 },
    keepAliveTimeout: config.connections.keepAliveTimeoutMs,
    // Behind trusted reverse proxies request.ip is the client X-Forwarded-For names; otherwise the socket's address.
    trustProxy: trustedProxies.size > 0 ? (address) => trustedProxies.has(address) : false,
    // Malformed HTTP, oversized headers, deadlines passed and unroutable URLs: the catalogue's error body.
    clientErrorHandler: clientErrorHandler({ headersTimeoutMs, requestTimeoutMs, maxHeaderSize }),
    frameworkErrors: frameworkErrorHandler,
    forceCloseConnections: "idle",
  });
  // First: every hook of a request runs in its span's context.
  if (deps.tracing) traceRequests(app, deps.tracing);

  guardConnections(app.server, {
    maxConnections: deps.maxConnections ?? config.connections.maxConnections,
    maxPerAddress: config.connections.maxConnectionsPerAddress,
    exempt: (address) => trustedProxies.has(address),
    onPressure: (report) =>
      app.log.warn(
        report,
        "client connections refused or idle ones closed to make room (TDS_MAX_CONNECTIONS, TDS_MAX_CONNECTIONS_PER_ADDRESS)",
      ),
  });
  app.decorate("clock", clock);
  app.setValidatorCompiler(({ schema }) => compileSchema(schema as never));
  app.setSerializerCompiler(() => (data) => JSON.stringify(data));
  installRequestContext(app);
  installJsonBodyParser(app);
  installErrorHandling(app, deps.store);
  installOpenApi(app, {
    title: "Typed Decision Service",
    version: SERVICE_VERSION,
    description: "System One typed decisions (contract 1.0.0) behind organizations, API keys, quotas and credits.",
  });

  const { store } = deps;
  // Every request a key authenticated, refused later or not, is a use of the key.
  const keyUse = new KeyUseRecorder({
    record: (uses) => store.recordKeyUse(uses),
    clock,
    ...(deps.keyUseIntervalMs !== undefined ? { intervalMs: deps.keyUseIntervalMs } : {}),
    onError: (err) => app.log.warn({ err }, "the last use of API keys could not be written; it is tried again at the next interval"),
  });
  app.addHook("onResponse", async (request) => {
    if (request.auth) keyUse.note(request.auth.keyId);
  });
  const limiter = deps.rateLimiter ?? new MemoryRateLimiter(clock);
  const metrics = deps.metrics ?? new Metrics();
  const observer = metricsObserver(metrics);
  const services =
    deps.modelServices ??
    (deps.modelService ? new Map([[config.modelServices[0]?.name ?? "default", deps.modelService]]) : new Map<string, ModelService>());
  const registry = new ModelRegistry(config, services, deps.engines ?? new Map(), {
    nowMs: () => clock.nowMs(),
    router: { ...(deps.routerOptions ?? config.routing), ...(deps.tracing ? { tracer: deps.tracing.attempts } : {}) },
    observerFor: (model) => {
      const counted = metrics.routerObserver(model);
      return {
        attempt: counted.attempt,
        healthChanged: (deployment, state, change) => {
          const line = deploymentHealthLine(model, deployment, state, change);
          if (line) app.log[line.level](line.fields, line.message);
        },
      };
    },
  });
  registry.start();
  metrics.watchDbPool(() => store.connectionStats?.() ?? null);
  metrics.watchDeployments(() => registry.health());
  const pooled = engineEntries(config.models, deps.engines ?? new Map()).filter(({ service }) => service.poolStats);
  metrics.watchModelPools(() => pooled.map(({ id, service }) => ({ model: id.model, ...service.poolStats!() })));
  const lanes = lanesFor(store, config.bookkeepingLanes);
  if (lanes.reduced) app.log.warn({ component: "store" }, lanes.reduced);
  const books = new GroupCommit(store, {
    lanes: lanes.lanes,
    ...(deps.storageWaitMs !== undefined ? { waitMs: deps.storageWaitMs } : {}),
    onCommit: (steps, seconds, ok) => metrics.storeCommitted(steps, seconds, ok),
  });
  const inFlight = new InFlight();
  const instanceId = newInstanceId();
  // At start, the work left in flight by stopped processes is released (on SQLite, one process serves the file:
  // everything from before this start), before anything is admitted; then every SWEEP_INTERVAL_MS.
  const jobs = startBookkeepingJobs(store, clock, {
    inFlightTtlMs: config.reservationTtlSeconds * 1000,
    sweepIntervalMs: deps.sweepIntervalMs ?? SWEEP_INTERVAL_MS,
    purgeIntervalMs: deps.purgeIntervalMs ?? 10 * 60 * 1000,
    instance: { id: instanceId, startedAtMs: clock.nowMs(), alone: store.dialect === "sqlite" },
    onError: (err, job, suppressed) =>
      app.log.warn(
        { err, ...(suppressed > 0 ? { failures_not_logged: suppressed } : {}) },
        job === "lease"
          ? "the lease of this gateway process could not be renewed; it is tried again every few seconds"
          : `${job} of the books failed; it runs again at its next interval`,
      ),
    onReleased: (released) =>
      app.log.warn(
        { released, instance: instanceId },
        "completed requests left in flight by stopped gateway processes: gateway_error, nothing charged, reservations released",
      ),
  });
  const admission = new AdmissionPolicy({
    books,
    clock,
    config,
    observer,
    instanceId,
    releaseAbandoned: () => jobs.releaseOrphansNow(),
  });
  // Decisions and reads have limits of their own; rejected requests (413, 422) count like accepted ones. A key's own
  // per-minute limit counts its decisions (and submissions), as the organization's requests_per_minute does, together
  // with those of the keys it replaced by rotation.
  const decisionLimit = rateLimit({
    limiter,
    limit: config.limits.requestsPerMinute,
    key: (orgId) => orgId,
    apiKey: (lineageId) => `key:${lineageId}`,
    setting: "requests_per_minute",
    what: "request",
    observer,
  });
  const readLimit = rateLimit({
    limiter,
    limit: config.limits.readRequestsPerMinute,
    key: (orgId) => `${orgId}:reads`,
    setting: "read_requests_per_minute",
    what: "usage read",
  });
  const pipeline = new DecisionPipeline({
    books,
    registry,
    admission,
    clock,
    config,
    observer,
    ...(deps.tracing ? { tracer: deps.tracing.decisions } : {}),
    background: (work) => inFlight.track(work),
    onUnexpected: (err, requestId) =>
      app.log.error({ err, request_id: requestId }, "unexpected error after admission; recorded as gateway_error"),
    onModelFailure: (report) => app.log[modelFailureLevel(report)](report, "model call failed"),
  });

  const finishes = new FinishGroup((inputs) => store.batches.finishRequests(inputs));
  const batchRun = new BatchRequestRun({
    store,
    finish: (input) => finishes.finish(input),
    pipeline,
    clock,
    keyOf: cachedKeyLookup(store, clock),
    signal: inFlight.signal,
    ...(deps.tracing ? { tracer: deps.tracing.decisions } : {}),
    onUnexpected: (err, requestId) =>
      app.log.error({ err, request_id: requestId }, "unexpected error in a batch request; its result is 500"),
  });
  const batchRunner: BatchRunner = new BatchRunner({
    store: store.batches,
    clock,
    instanceId,
    run: (claim) => batchRun.run(claim),
    perOrgConcurrency: config.batches.concurrency,
    globalConcurrency: config.batches.globalConcurrency,
    interactiveInFlight: (): number => Math.max(0, inFlight.size - batchRunner.running),
    share: () => batchShare.share,
    retentionDays: config.batches.retentionDays,
    track: (work) => inFlight.track(work),
    onError: (err, job, suppressed) =>
      app.log.warn(
        { err, component: "batches", ...(suppressed > 0 ? { failures_not_logged: suppressed } : {}) },
        `batch ${job} failed; it is tried again`,
      ),
    onRunFailed: (err, claim) =>
      app.log.warn(
        { err, batch_id: claim.batchId, position: claim.position },
        "a batch request could not be finished; it runs again later",
      ),
  });
  // Interactive requests are the tracked work the runner did not start.
  const batchShare = new BatchShare(config.batches.globalConcurrency, () => inFlight.started - batchRunner.started);
  // Before the drain: no batch request starts once the server is closing.
  app.addHook("preClose", async () => batchRunner.stopClaiming());
  app.addHook("preClose", async () => {
    const { finished } = await inFlight.drain(shutdownGraceMs);
    if (!finished)
      app.log.warn(
        "shutdown deadline passed: abandoned in-flight model calls (their reservations are released by the next sweep or the next instance to start)",
      );
  });
  app.addHook("onClose", async () => {
    await keyUse.close();
    batchShare.stop();
    await batchRunner.close();
    await jobs.stop();
    await registry.close();
    if (!deps.rateLimiter) await limiter.close();
  });
  app.decorate("sweepBooks", () => jobs.sweepNow());
  app.decorate("purgeBooks", () => jobs.purgeNow());
  app.decorate("modelRegistry", registry);
  app.decorate("instanceId", instanceId);
  app.decorate("batchRunner", batchRunner);
  app.decorate("flushKeyUse", () => keyUse.flush());

  metricsRoutes(app, { metrics, token: config.metricsToken });
  healthRoutes(app, { store, registry });
  decisionRoutes(app, { store, pipeline, maxRequestBytes: config.limits.maxRequestBytes, inFlight, rateLimit: decisionLimit });
  batchRoutes(app, {
    store,
    config,
    registry,
    pipeline,
    clock,
    rateLimit: decisionLimit,
    readRateLimit: readLimit,
    onQueued: () => batchRunner.nudge(),
  });
  modelRoutes(app, { store, registry });
  usageRoutes(app, { store, rateLimit: readLimit });
  serviceConfigRoutes(app, config, registry);
  organizationRoutes(app, { config, store, clock, rateLimit: readLimit });
  adminRoutes(app, { config, store, clock });
  consoleRoutes(app);
  apiDocsRoutes(app);
  await jobs.started;
  keyUse.start();
  // After the start's release of the requests stopped processes left in flight: their batch requests are then
  // re-run at once. The one process serving a SQLite file takes over the claims of the processes before it.
  if (deps.runBatches !== false) {
    batchShare.start();
    batchRunner.start({ takeOver: store.dialect === "sqlite" });
  }
  return app;
}
