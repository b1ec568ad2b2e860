import type { UpstreamModel } from "../model-service.ts";
import { type HealthConfig, HealthTracker } from "./health.ts";
import type { Deployment, DeploymentInput, HealthChange, HealthState } from "./types.ts";

/** A deployment at run time: its configuration, the calls running on it, its health and its last known list entry. */
export class DeploymentRuntime {
  /** `decide` calls sent to it whose service call has not settled yet. */
  outstanding = 0;
  readonly health: HealthTracker;
  /**
   * Its model's entry in its most recent successful `listModels` answer (from an active check or the router's
   * `listModels`); null when its list did not include `upstreamName`; undefined before any successful list.
   */
  listed: UpstreamModel | null | undefined = undefined;
  /** Whether an active check of it is running (checks never overlap). */
  checking = false;

  constructor(
    readonly spec: Deployment,
    config: HealthConfig,
    onChange: (deployment: DeploymentRuntime, state: HealthState, change: HealthChange) => void,
  ) {
    this.health = new HealthTracker(config, (state, change) => onChange(this, state, change));
  }

  get name(): string {
    return this.spec.name;
  }

  get weight(): number {
    return this.spec.weight;
  }

  get fallback(): boolean {
    return this.spec.fallback;
  }

  /** Below its maxConcurrency. */
  hasSlot(): boolean {
    return this.spec.maxConcurrency === null || this.outstanding < this.spec.maxConcurrency;
  }
}

/** Fills in the defaults and checks a deployment list; throws TypeError on a bad one. */
export function normalizeDeployments(model: string, inputs: readonly DeploymentInput[]): Deployment[] {
  if (inputs.length === 0) throw new TypeError(`model ${JSON.stringify(model)}: at least one deployment is needed`);
  const names = new Set<string>();
  return inputs.map((input, i) => {
    const where = `model ${JSON.stringify(model)}, deployment ${i}`;
    if (typeof input.name !== "string" || input.name === "") throw new TypeError(`${where}: name must be a non-empty string`);
    if (names.has(input.name)) throw new TypeError(`${where}: the name ${JSON.stringify(input.name)} is used twice`);
    names.add(input.name);
    if (typeof input.upstreamName !== "string" || input.upstreamName === "") {
      throw new TypeError(`${where} (${input.name}): upstreamName must be a non-empty string`);
    }
    if (typeof input.service?.decide !== "function" || typeof input.service.listModels !== "function") {
      throw new TypeError(`${where} (${input.name}): service must be a ModelService`);
    }
    const weight = input.weight ?? 1;
    if (typeof weight !== "number" || !Number.isFinite(weight) || weight <= 0) {
      throw new TypeError(`${where} (${input.name}): weight must be a finite number > 0`);
    }
    const maxConcurrency = input.maxConcurrency ?? null;
    if (maxConcurrency !== null && (!Number.isSafeInteger(maxConcurrency) || maxConcurrency < 1)) {
      throw new TypeError(`${where} (${input.name}): maxConcurrency must be an integer >= 1 or null`);
    }
    return {
      name: input.name,
      service: input.service,
      upstreamName: input.upstreamName,
      weight,
      maxConcurrency,
      fallback: input.fallback ?? false,
    };
  });
}
