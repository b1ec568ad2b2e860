import type { ModelService } from "../model-service.ts";

/** What an in-process engine is doing, as /readyz shows it per model. Never a file-system path (API clients see it). */
export interface EngineStatus {
  /**
   * `loading` (an attempt is running), `retrying` (an attempt failed with a problem that can heal; the next one
   * is scheduled), `ready`, `failed` (a problem that cannot heal: no retry), `not_installed` (node-llama-cpp is
   * not installed).
   */
  state: "loading" | "retrying" | "ready" | "failed" | "not_installed";
  /** What is happening, or what went wrong and what to do: the `detail` of the 503 its calls get. */
  detail?: string;
  /** 0 … 1 while loading: the download's, then the model load's progress. */
  progress?: number;
  /** After a failed attempt, until the model is ready: what went wrong the last time. */
  lastError?: string;
  /** Attempts that failed so far (set with `lastError`). */
  failedAttempts?: number;
  /** While retrying: when the next attempt starts (ms since the epoch). */
  nextAttemptAtMs?: number;
  /** Set while the last attempt could not reach the model's download server at all (no DNS, refused, unreachable). */
  offline?: true;
}

/** The engine status of a model service that has one (an in-process engine), else null. */
export function engineStatusOf(service: ModelService): EngineStatus | null {
  const status = (service as Partial<{ status(): EngineStatus }>).status;
  return typeof status === "function" ? status.call(service) : null;
}
