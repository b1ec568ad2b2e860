/** What the pipeline reports as it runs (metrics implement it; tests may too). */
export interface DecisionObserver {
  decided(gatewayMs: number, modelMs: number): void;
  modelFailed(kind: string): void;
  reservation(outcome: "reserved" | "insufficient" | "settled" | "released" | "expired"): void;
  rejected(
    reason:
      | "rate_limited"
      | "key_rate_limited"
      | "model_not_allowed"
      | "preview_quota_org"
      | "preview_quota_global"
      | "insufficient_credits"
      | "key_budget_exhausted"
      | "token_bound_over_reserve",
  ): void;
}

export const silentObserver: DecisionObserver = {
  decided: () => {},
  modelFailed: () => {},
  reservation: () => {},
  rejected: () => {},
};

export type DecisionStep = "admission" | "model call" | "completion";
export type TraceAttributes = Readonly<Record<string, string | number>>;

/** The decision's steps as trace spans (src/observability/spans.ts implements it); absent while tracing is off. */
export interface DecisionTracer {
  /** A span of one step under the current one (the request's); null when nothing is traced now. */
  step(name: DecisionStep, attributes?: TraceAttributes): TraceStep | null;
  /** Attributes of the current span: the request's own (its server span, or a batch request's root span). */
  annotate(attributes: TraceAttributes): void;
  /** Runs `work` under a new root span: a batch request is a trace of its own. */
  root<T>(name: string, attributes: TraceAttributes, work: () => Promise<T>): Promise<T>;
}

export interface TraceStep {
  /** Runs `work` with this step's span current, so that what it starts (a model call's attempts) nests under it. */
  within<T>(work: () => Promise<T>): Promise<T>;
  /** Ends the span, with the error it failed with (a refusal is not an error status) and attributes. */
  end(error?: unknown, attributes?: TraceAttributes): void;
}
