import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";
import type { RouterObserver } from "../models/routing/types.ts";

/** Seconds of one model call or attempt. */
const MODEL_CALL_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

/** The service's Prometheus metrics, one registry per app (tests build several apps in one process). */
export class Metrics {
  readonly registry = new Registry();

  #counter<L extends string = never>(name: string, help: string, labelNames: readonly L[] = []): Counter<L> {
    return new Counter({ name, help, labelNames, registers: [this.registry] });
  }

  #gauge<L extends string = never>(name: string, help: string, labelNames: readonly L[] = [], collect?: () => void): Gauge<L> {
    return new Gauge({ name, help, labelNames, registers: [this.registry], ...(collect ? { collect } : {}) });
  }

  #histogram<L extends string = never>(name: string, help: string, buckets: number[], labelNames: readonly L[] = []): Histogram<L> {
    return new Histogram({ name, help, buckets, labelNames, registers: [this.registry] });
  }

  readonly httpRequests = this.#counter("tds_http_requests_total", "HTTP requests by route and status", ["method", "route", "status"]);

  readonly gatewayLatency = this.#histogram(
    "tds_gateway_latency_seconds",
    "Time spent in the gateway itself per decision (excluding the model call)",
    [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
  );

  readonly modelLatency = this.#histogram("tds_model_latency_seconds", "Model call time per decision", MODEL_CALL_BUCKETS);

  readonly modelErrors = this.#counter("tds_model_errors_total", "Failed model calls by kind", ["kind"]);

  readonly reservations = this.#counter(
    "tds_reservations_total",
    "Credit reservations by outcome (reserved, insufficient, settled, released, expired)",
    ["outcome"],
  );

  readonly rejections = this.#counter(
    "tds_admission_rejections_total",
    "Requests refused at admission by reason (rate_limited, key_rate_limited, model_not_allowed, preview_quota_org, preview_quota_global, insufficient_credits, key_budget_exhausted, token_bound_over_reserve)",
    ["reason"],
  );

  readonly rateLimiterFallback = this.#gauge(
    "tds_rate_limiter_fallback",
    "1 while the shared (Redis) rate limiter is unreachable and the local fallback limit applies",
  );

  readonly rateLimiterFallbackEvents = this.#counter(
    "tds_rate_limiter_fallback_events_total",
    "Times the rate limiter switched to its local fallback",
  );

  readonly storeBatchSteps = this.#histogram(
    "tds_store_batch_steps",
    "Durable steps (admissions and completions) committed per storage transaction",
    [1, 2, 4, 8, 16, 32, 64, 128, 256],
  );

  readonly storeCommitSeconds = this.#histogram(
    "tds_store_commit_seconds",
    "Duration of one storage transaction of grouped steps, by result (ok, failed)",
    [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5],
    ["result"],
  );

  readonly deploymentAttempts = this.#counter(
    "tds_deployment_attempts_total",
    "Model service attempts per model and deployment, by outcome (ok, or the failure's kind)",
    ["model", "deployment", "outcome"],
  );

  readonly deploymentLatency = this.#histogram(
    "tds_deployment_latency_seconds",
    "Duration of one model service attempt per model and deployment",
    MODEL_CALL_BUCKETS,
    ["model", "deployment"],
  );

  private deployments: () => Array<{
    model: string;
    waiting: number;
    deployments: Array<{ name: string; state: string; outstanding: number }>;
  }> = () => [];

  readonly deploymentOutstanding = this.#gauge(
    "tds_deployment_outstanding",
    "Model service calls running per model and deployment",
    ["model", "deployment"],
    () => this.collectDeployments(),
  );

  readonly deploymentHealthy = this.#gauge(
    "tds_deployment_healthy",
    "1 while a deployment takes calls (healthy), 0 while it cools down after failures or waits for its probe",
    ["model", "deployment", "state"],
  );

  readonly modelWaiting = this.#gauge("tds_model_waiting", "Calls waiting for a deployment below its max_concurrency, per model", [
    "model",
  ]);

  /** Sources of the pool and queue gauges, read at each scrape. */
  private modelPools: () => Array<{ model: string; busy: number; size: number; waiting: number }> = () => [];
  private dbPool: () => { total: number; idle: number; waiting: number } | null = () => null;

  readonly modelPoolBusy = this.#gauge("tds_model_pool_busy", "In-process engine contexts evaluating a request", ["model"], () =>
    this.collectModelPools(),
  );

  readonly modelPoolSize = this.#gauge("tds_model_pool_size", "In-process engine contexts", ["model"]);

  readonly modelQueueWaiting = this.#gauge("tds_model_queue_waiting", "Requests waiting for an in-process engine context", ["model"]);

  readonly dbConnections = this.#gauge(
    "tds_db_pool_connections",
    "Database pool connections by state (total, idle, waiting clients)",
    ["state"],
    () => {
      const stats = this.dbPool();
      if (!stats) return;
      for (const [state, value] of Object.entries(stats)) this.dbConnections.set({ state }, value);
    },
  );

  watchModelPools(source: () => Array<{ model: string; busy: number; size: number; waiting: number }>): void {
    this.modelPools = source;
  }

  watchDeployments(
    source: () => Array<{ model: string; waiting: number; deployments: Array<{ name: string; state: string; outstanding: number }> }>,
  ): void {
    this.deployments = source;
  }

  /** Feeds the per-deployment attempt counters and latency histogram from a model's router. */
  routerObserver(model: string): RouterObserver {
    return {
      attempt: (deployment, outcome, ms) => {
        this.deploymentAttempts.inc({ model, deployment, outcome });
        this.deploymentLatency.observe({ model, deployment }, ms / 1000);
      },
      healthChanged: () => {},
    };
  }

  private collectDeployments(): void {
    this.deploymentHealthy.reset();
    for (const m of this.deployments()) {
      this.modelWaiting.set({ model: m.model }, m.waiting);
      for (const d of m.deployments) {
        this.deploymentOutstanding.set({ model: m.model, deployment: d.name }, d.outstanding);
        this.deploymentHealthy.set({ model: m.model, deployment: d.name, state: d.state }, d.state === "healthy" ? 1 : 0);
      }
    }
  }

  watchDbPool(source: () => { total: number; idle: number; waiting: number } | null): void {
    this.dbPool = source;
  }

  private collectModelPools(): void {
    for (const p of this.modelPools()) {
      this.modelPoolBusy.set({ model: p.model }, p.busy);
      this.modelPoolSize.set({ model: p.model }, p.size);
      this.modelQueueWaiting.set({ model: p.model }, p.waiting);
    }
  }

  constructor(options: { processMetrics?: boolean } = {}) {
    if (options.processMetrics) collectDefaultMetrics({ register: this.registry, prefix: "tds_" });
  }

  storeCommitted(steps: number, seconds: number, ok: boolean): void {
    if (ok) this.storeBatchSteps.observe(steps);
    this.storeCommitSeconds.observe({ result: ok ? "ok" : "failed" }, seconds);
  }

  rateLimiterModeChanged(mode: "redis" | "fallback"): void {
    this.rateLimiterFallback.set(mode === "fallback" ? 1 : 0);
    if (mode === "fallback") this.rateLimiterFallbackEvents.inc();
  }
}

/** The pipeline's observations as Prometheus metrics. */
export function metricsObserver(metrics: Metrics): import("../gateway/observer.ts").DecisionObserver {
  return {
    decided: (gatewayMs, modelMs) => {
      metrics.gatewayLatency.observe(gatewayMs / 1000);
      metrics.modelLatency.observe(modelMs / 1000);
    },
    modelFailed: (kind) => metrics.modelErrors.inc({ kind }),
    reservation: (outcome) => metrics.reservations.inc({ outcome }),
    rejected: (reason) => metrics.rejections.inc({ reason }),
  };
}
