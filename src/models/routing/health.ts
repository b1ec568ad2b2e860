import type { ModelServiceError } from "../model-service.ts";
import type { HealthOutcome } from "./outcomes.ts";
import type { HealthChange, HealthState } from "./types.ts";

export interface HealthConfig {
  failureThreshold: number;
  cooldownInitialMs: number;
  cooldownMaxMs: number;
}

/** Handed out when a call starts on a deployment; its ending is judged against the state the call started in. */
export interface HealthTicket {
  readonly epoch: number;
  /** Whether this call is the one probe of a deployment whose cooldown is over. */
  readonly probe: boolean;
}

/** The n-th cooldown in a row (0-based): initial · 2^n, at most max. */
export function cooldownMs(level: number, config: Pick<HealthConfig, "cooldownInitialMs" | "cooldownMaxMs">): number {
  return Math.min(config.cooldownMaxMs, config.cooldownInitialMs * 2 ** Math.min(level, 52));
}

/**
 * The health state machine of one deployment (see HealthState), driven by the endings of calls (passive) and by
 * active checks. Time only moves it from `cooling_down` to `probing`, lazily, when it is looked at (`refresh`).
 *
 * Every state change starts a new epoch; a call's ending counts only when the deployment is still in the epoch the
 * call started in, so calls that were already running when a cooldown began (and whose failures caused it, or
 * failed with it) neither extend it nor end it, and only the probe decides a probing deployment's fate.
 */
export class HealthTracker {
  private current: HealthState = "healthy";
  private epoch = 0;
  /** Consecutive retryable failures while healthy. */
  private failures = 0;
  /** Cooldowns since the deployment was last healthy (the next cooldown's exponent). */
  private level = 0;
  private cooldownEndMs = 0;
  private probeRunning = false;
  /** The failure that caused the current cooldown (kept until the deployment is healthy again). */
  private last: ModelServiceError | null = null;

  constructor(
    private readonly config: HealthConfig,
    private readonly onChange: (state: HealthState, change: HealthChange) => void,
  ) {}

  /** The state at `nowMs` (a cooldown that is over turns into `probing`). */
  state(nowMs: number): HealthState {
    this.refresh(nowMs);
    return this.current;
  }

  /** Whether a call may start now (concurrency aside): healthy, or probing with no probe running. */
  open(nowMs: number): boolean {
    this.refresh(nowMs);
    return this.current === "healthy" || (this.current === "probing" && !this.probeRunning);
  }

  get probeInFlight(): boolean {
    return this.probeRunning;
  }

  /** The failure behind the current cooldown or probing state; null while healthy. */
  get lastFailure(): ModelServiceError | null {
    return this.last;
  }

  /** Milliseconds until the cooldown is over; null when not cooling down. */
  retryInMs(nowMs: number): number | null {
    this.refresh(nowMs);
    return this.current === "cooling_down" ? Math.max(0, this.cooldownEndMs - nowMs) : null;
  }

  /** A call starts (only when `open`). In the probing state it is the probe. */
  begin(nowMs: number): HealthTicket {
    this.refresh(nowMs);
    const probe = this.current === "probing";
    if (probe) this.probeRunning = true;
    return { epoch: this.epoch, probe };
  }

  /** A call ended. */
  end(ticket: HealthTicket, outcome: HealthOutcome, nowMs: number, error: ModelServiceError | null = null): void {
    if (ticket.epoch !== this.epoch) return; // started in an earlier state; it says nothing about this one
    if (ticket.probe) this.probeRunning = false;
    if (outcome === "neutral") return; // an aborted probe: the next call probes again
    if (this.current === "healthy") {
      if (outcome === "success") {
        this.failures = 0;
        return;
      }
      this.failures++;
      if (this.failures >= this.config.failureThreshold) this.coolDown(nowMs, error);
      return;
    }
    if (this.current === "probing" && ticket.probe) {
      if (outcome === "success") this.becomeHealthy();
      else this.coolDown(nowMs, error);
    }
  }

  /** An active check ended: a success ends a cooldown or a probing state; a failure starts a cooldown (unless one runs). */
  check(ok: boolean, nowMs: number, error: ModelServiceError | null = null): void {
    this.refresh(nowMs);
    if (ok) {
      if (this.current !== "healthy") this.becomeHealthy();
      return;
    }
    if (this.current !== "cooling_down") this.coolDown(nowMs, error);
  }

  private refresh(nowMs: number): void {
    if (this.current === "cooling_down" && nowMs >= this.cooldownEndMs) this.set("probing");
  }

  private coolDown(nowMs: number, error: ModelServiceError | null): void {
    this.cooldownEndMs = nowMs + cooldownMs(this.level, this.config);
    this.level++;
    this.failures = 0;
    this.probeRunning = false;
    if (error !== null) this.last = error;
    this.set("cooling_down");
  }

  private becomeHealthy(): void {
    this.level = 0;
    this.failures = 0;
    this.probeRunning = false;
    this.last = null;
    this.set("healthy");
  }

  private set(state: HealthState): void {
    this.epoch++;
    const from = this.current;
    this.current = state;
    if (state !== from) this.onChange(state, { from, failure: this.last });
  }
}
