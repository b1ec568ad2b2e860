import { ModelServiceError, type UpstreamModel } from "../model-service.ts";
import type { DeploymentRuntime } from "./deployment.ts";
import type { RouterTimers } from "./types.ts";
import { MAX_TIMER_MS } from "./wait-queue.ts";

export interface ListResult {
  ok: boolean;
  list?: UpstreamModel[];
  error?: ModelServiceError;
  ms: number;
}

/**
 * `listModels({timeoutMs})` on one deployment, bounded by the router's own timer too (a service that ignores its
 * deadline cannot hold a check or a list call longer). Never throws.
 */
export async function listDeployment(
  d: DeploymentRuntime,
  timeoutMs: number,
  timers: RouterTimers,
  nowMs: () => number,
  signal?: AbortSignal,
): Promise<ListResult> {
  const started = nowMs();
  const controller = new AbortController();
  let timer: unknown;
  const onAbort = () => controller.abort();
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    const deadline = new Promise<never>((_, reject) => {
      timer = timers.setTimeout(
        () => {
          controller.abort();
          reject(new ModelServiceError("timeout", `model list did not arrive within ${timeoutMs} ms`));
        },
        Math.min(Math.ceil(timeoutMs), MAX_TIMER_MS),
      );
    });
    const listed = Promise.resolve().then(() => d.spec.service.listModels({ timeoutMs, signal: controller.signal }));
    listed.catch(() => {}); // when the deadline won
    const list = await Promise.race([listed, deadline]);
    if (!Array.isArray(list)) throw new ModelServiceError("invalid_response", "model list is not an array");
    return { ok: true, list, ms: nowMs() - started };
  } catch (err) {
    const error = err instanceof ModelServiceError ? err : new ModelServiceError("invalid_response", `model list failed: ${String(err)}`);
    return { ok: false, error, ms: nowMs() - started };
  } finally {
    timers.clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
  }
}

export interface ActiveChecksOptions {
  intervalMs: number | null;
  checkTimeoutMs: number;
  timers: RouterTimers;
  nowMs: () => number;
  /** Called with every check's result (after which the router updates the deployment's health and list). */
  onResult(d: DeploymentRuntime, result: ListResult): void;
}

/** Periodic `listModels` checks of every deployment: one round at `start()`, then one every interval after the previous ended. */
export class ActiveChecks {
  private started = false;
  private stopped = false;
  private timer: unknown = undefined;

  constructor(
    private readonly deployments: readonly DeploymentRuntime[],
    private readonly options: ActiveChecksOptions,
  ) {}

  start(): void {
    if (this.started || this.stopped || this.options.intervalMs === null) return;
    this.started = true;
    void this.loop();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== undefined) this.options.timers.clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** One round now; a deployment whose check is already running is not checked twice. */
  async round(): Promise<void> {
    await Promise.all(this.deployments.map((d) => this.checkOne(d)));
  }

  private async loop(): Promise<void> {
    this.timer = undefined;
    if (this.stopped) return;
    await this.round();
    if (this.stopped || this.options.intervalMs === null) return;
    const handle = this.options.timers.setTimeout(() => void this.loop(), Math.min(this.options.intervalMs, MAX_TIMER_MS));
    (handle as { unref?: () => void } | null)?.unref?.();
    this.timer = handle;
  }

  private async checkOne(d: DeploymentRuntime): Promise<void> {
    if (d.checking || this.stopped) return;
    d.checking = true;
    try {
      const result = await listDeployment(d, this.options.checkTimeoutMs, this.options.timers, this.options.nowMs);
      if (!this.stopped) this.options.onResult(d, result);
    } finally {
      d.checking = false;
    }
  }
}
