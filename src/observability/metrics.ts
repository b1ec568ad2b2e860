import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";
import type { RouterObserver } from "../models/routing/types.ts";

/** The service's Prometheus metrics, one registry per app (tests build several apps in one process). */
export class Metrics {
  readonly registry = new Registry();

  readonly httpRequests = new Counter({
    name: "tds_http_requests_total",
    help: "HTTP requests by route and status",
    labelNames: ["method", "route", "status"] as const,
    registers: [this.registry],
  });

  readonly gatewayLatency = new Histogram({
    name: "tds_gateway_latency_seconds",
    help: "Time spent in the gateway itself per decision (excluding the model call)",
    buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
    registers: [this.registry],
  });

  readonly modelLatency = new Histogram({
    name: "tds_model_latency_seconds",
    help: "Model call time per decision",
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [this.registry],
  });

  readonly modelErrors = new Counter({
    name: "tds_model_errors_total",
    help: "Failed model calls by kind",
    labelNames: ["kind"] as const,
    registers: [this.registry],
  });

  readonly reservations = new Counter({
    name: "tds_reservations_total",
    help: "Credit reservations by outcome (reserved, insufficient, settled, released, expired)",
    labelNames: ["outcome"] as const,
    registers: [this.registry],
  });

  readonly rejections = new Counter({
    name: "tds_admission_rejections_total",
    help: "Requests refused at admission by reason (rate_limited, preview_quota_org, preview_quota_global, insufficient_credits, token_bound_over_reserve)",
    labelNames: ["reason"] as const,
    registers: [this.registry],
  });

  readonly rateLimiterFallback = new Gauge({
    name: "tds_rate_limiter_fallback",
    help: "1 while the shared (Redis) rate limiter is unreachable and the local fallback limit applies",
    registers: [this.registry],
  });

  readonly rateLimiterFallbackEvents = new Counter({
    name: "tds_rate_limiter_fallback_events_total",
    help: "Times the rate limiter switched to its local fallback",
    registers: [this.registry],
  });

  readonly storeBatchSteps = new Histogram({
    name: "tds_store_batch_steps",
    help: "Durable steps (admissions and completions) committed per storage transaction",
    buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256],
    registers: [this.registry],
  });

  readonly storeCommitSeconds = new Histogram({
    name: "tds_store_commit_seconds",
    help: "Duration of one storage transaction of grouped steps, by result (ok, failed)",
    labelNames: ["result"] as const,
    buckets: [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5],
    registers: [this.registry],
  });

  readonly deploymentAttempts = new Counter({
    name: "tds_deployment_attempts_total",
    help: "Model service attempts per model and deployment, by outcome (ok, or the failure's kind)",
    labelNames: ["model", "deployment", "outcome"] as const,
    registers: [this.registry],
  });

  readonly deploymentLatency = new Histogram({
    name: "tds_deployment_latency_seconds",
    help: "Duration of one model service attempt per model and deployment",
    labelNames: ["model", "deployment"] as const,
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [this.registry],
  });

  private deployments: () => Array<{
    model: string;
    waiting: number;
    deployments: Array<{ name: string; state: string; outstanding: number }>;
  }> = () => [];

  readonly deploymentOutstanding = new Gauge({
    name: "tds_deployment_outstanding",
    help: "Model service calls running per model and deployment",
    labelNames: ["model", "deployment"] as const,
    registers: [this.registry],
    collect: () => this.collectDeployments(),
  });

  readonly deploymentHealthy = new Gauge({
    name: "tds_deployment_healthy",
    help: "1 while a deployment takes calls (healthy), 0 while it cools down after failures or waits for its probe",
    labelNames: ["model", "deployment", "state"] as const,
    registers: [this.registry],
  });

  readonly modelWaiting = new Gauge({
    name: "tds_model_waiting",
    help: "Calls waiting for a deployment below its max_concurrency, per model",
    labelNames: ["model"] as const,
    registers: [this.registry],
  });

  /** Sources of the pool and queue gauges, read at each scrape. */
  private modelPools: () => Array<{ model: string; busy: number; size: number; waiting: number }> = () => [];
  private dbPool: () => { total: number; idle: number; waiting: number } | null = () => null;

  readonly modelPoolBusy = new Gauge({
    name: "tds_model_pool_busy",
    help: "In-process engine contexts evaluating a request",
    labelNames: ["model"] as const,
    registers: [this.registry],
    collect: () => this.collectModelPools(),
  });

  readonly modelPoolSize = new Gauge({
    name: "tds_model_pool_size",
    help: "In-process engine contexts",
    labelNames: ["model"] as const,
    registers: [this.registry],
  });

  readonly modelQueueWaiting = new Gauge({
    name: "tds_model_queue_waiting",
    help: "Requests waiting for an in-process engine context",
    labelNames: ["model"] as const,
    registers: [this.registry],
  });

  readonly dbConnections = new Gauge({
    name: "tds_db_pool_connections",
    help: "Database pool connections by state (total, idle, waiting clients)",
    labelNames: ["state"] as const,
    registers: [this.registry],
    collect: () => {
      const stats = this.dbPool();
      if (!stats) return;
      for (const [state, value] of Object.entries(stats)) this.dbConnections.set({ state }, value);
    },
  });

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
