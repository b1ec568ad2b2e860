import { type EngineStatus, ModelServiceError } from "../model-service.ts";
import { onBackendLog } from "./backend.ts";
import type { EngineSettings } from "./engine-settings.ts";
import { asLoadFailure, disposeEngine, type Engine, loadEngine } from "./load-engine.ts";
import { offlineAdvice } from "./offline-advice.ts";
import { pause, retryDelayMs } from "./retry.ts";

/** Said after every failure shown to API clients: the paths and the underlying errors are only logged. */
export const SEE_THE_LOG = "(details in the server log)";

/**
 * Loads an engine in the background from the moment it is constructed, attempt after attempt until the model
 * is ready, a failure cannot heal, or it is closed; keeps the status /readyz shows, and owns the engine
 * (disposes of it on close). A failed attempt is logged when its reason differs from the last one's — the first one
 * whose download server cannot be reached at all with the advice of what to do instead — and the same reason again
 * only at growing intervals.
 */
export class EngineLoader {
  private current: EngineStatus = { state: "loading", detail: "starting", progress: 0 };
  /** Since the first failed attempt: what the loading status carries on. */
  private lastFailure: Pick<EngineStatus, "lastError" | "failedAttempts" | "offline"> = {};
  /** Once said, the advice for a download server that cannot be reached is not repeated. */
  private offlineExplained = false;
  private loaded: Engine | null = null;
  private isClosed = false;
  private readonly closing = new AbortController();
  private readonly unlistenBackend: () => void;
  /** Settles (never rejects) when loading is over: ready, failed for good, or closed. */
  private readonly loading: Promise<void>;

  constructor(private readonly settings: EngineSettings) {
    // llama.cpp's own warnings and errors once the model is ready (while loading, errors go into the
    // one failure message instead). The backend is process-wide: every ready service logs them.
    this.unlistenBackend = onBackendLog((level, message) => {
      if (this.current.state !== "ready") return;
      if (level === "warn") settings.logger.warn(`llama.cpp: ${message}`);
      else settings.logger.error(`llama.cpp: ${message}`);
    });
    this.loading = this.loadUntilReady();
  }

  status(): EngineStatus {
    return { ...this.current };
  }

  /** The engine once ready (null before, after a failure for good, and once closed). */
  get engine(): Engine | null {
    return this.loaded;
  }

  get closed(): boolean {
    return this.isClosed;
  }

  /** The ready engine, else a ModelServiceError: `unavailable` once closed, `not_ready` (saying why) otherwise. */
  readyEngine(): Engine {
    if (this.isClosed) throw new ModelServiceError("unavailable", "the embedded model service is closed");
    if (this.loaded) return this.loaded;
    const status = this.current;
    if (status.state !== "loading") throw notReady(status.detail ?? "the model is not loaded");
    const pct = Math.floor((status.progress ?? 0) * 100);
    const last = status.lastError ? `; attempt ${status.failedAttempts} failed (${status.lastError})` : "";
    throw notReady(`the model is still loading (${pct}%)${status.detail ? `: ${status.detail}` : ""}${last}`);
  }

  /** Resolves when the model is ready; rejects with `not_ready` when loading failed for good or was closed. */
  async ready(): Promise<void> {
    await this.loading;
    if (this.loaded) return;
    throw notReady(this.current.detail ?? "the embedded model service is closed");
  }

  /**
   * Stops loading (an attempt in progress is cancelled), closes the pool's queue, lets `drain` finish the work
   * still using the engine, then disposes of the engine. Once only.
   */
  async close(drain: () => Promise<unknown>): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    this.unlistenBackend();
    this.closing.abort();
    const e = this.loaded;
    e?.pool.close(new ModelServiceError("unavailable", "the embedded model service is closed"));
    await drain();
    await this.loading;
    if (e) {
      this.loaded = null;
      await disposeEngine(e);
    }
  }

  /** Attempts to load until the model is ready, a failure cannot heal, or the loader is closed. */
  private async loadUntilReady(): Promise<void> {
    const { name, logger } = this.settings;
    for (let attempt = 1; ; attempt++) {
      let e: Engine;
      try {
        e = await loadEngine(this.settings, this.closing.signal, (detail, progress) => {
          // Progress means the download server (if any) answered: no longer offline.
          const { offline: _, ...failure } = this.lastFailure;
          this.lastFailure = failure;
          this.current = { state: "loading", detail, progress, ...failure };
        });
      } catch (err) {
        if (this.isClosed) break;
        const f = asLoadFailure(err, this.settings.hint);
        if (!f.canHeal) {
          this.current = { state: "failed", detail: `the model "${name}" failed to load: ${f.publicReason}; ${f.hint} ${SEE_THE_LOG}` };
          logger.error(`the model "${name}" failed to load: ${f.message}; ${f.hint}`);
          return;
        }
        const waitMs = retryDelayMs(attempt, this.settings.retry);
        const at = Date.now() + waitMs;
        const previousReason = this.lastFailure.lastError;
        this.lastFailure = { lastError: f.publicReason, failedAttempts: attempt, ...(f.network ? { offline: true as const } : {}) };
        const state = f.network ? "cannot be downloaded (offline?)" : "is still loading";
        this.current = {
          state: "retrying",
          detail: `the model "${name}" ${state}: attempt ${attempt} failed (${f.publicReason}), the next starts at ${new Date(at).toISOString()}; ${f.hint} ${SEE_THE_LOG}`,
          ...this.lastFailure,
          nextAttemptAtMs: at,
        };
        const retrying = `retrying in ${duration(waitMs)}, at ${new Date(at).toISOString()}`;
        const failed = `the model "${name}" failed to load (attempt ${attempt}): ${f.message}; ${retrying}`;
        if (f.network && !this.offlineExplained) {
          this.offlineExplained = true;
          logger.warn(`${failed}\n${offlineAdvice(this.settings, f.network)}`);
        } else if (f.publicReason !== previousReason) {
          logger.warn(failed);
        } else if (isReminderAttempt(attempt)) {
          logger.warn(`the model "${name}" still cannot be loaded after ${attempt} attempts (${f.publicReason}); ${retrying}`);
        }
        await pause(waitMs, this.closing.signal);
        if (this.isClosed) break;
        continue;
      }
      if (this.isClosed) {
        void disposeEngine(e);
        break;
      }
      this.loaded = e;
      this.current = { state: "ready" };
      logger.info(
        `model "${name}" ready${attempt > 1 ? ` after ${attempt} attempts` : ""}: ${e.model.typeDescription} on ${e.gpu === false ? "the CPU" : e.gpu}, ` +
          `context ${e.contexts[0]?.contextSize} tokens × ${this.settings.poolSize}, max_state ${e.maxState}, max_branch ${e.maxBranch}, ` +
          `chat template ${e.prompt.wrapperName}`,
      );
      return;
    }
    this.current = { state: "failed", detail: "the model service was closed while loading" };
  }
}

/**
 * A failure for the same reason as the one before is logged again only at attempts 8, 16, 32, …: at growing intervals,
 * so a long outage still shows in the log without a line per attempt.
 */
function isReminderAttempt(attempt: number): boolean {
  return attempt >= 8 && (attempt & (attempt - 1)) === 0;
}

function duration(ms: number): string {
  return ms < 1000 ? `${ms} ms` : `${ms / 1000} s`;
}

/** Why the engine cannot take calls yet, in words a client may read (the 503's detail). */
function notReady(why: string): ModelServiceError {
  return new ModelServiceError("not_ready", why, undefined, { note: why });
}
