import {
  type Attributes,
  type Context,
  context,
  DiagLogLevel,
  diag,
  propagation,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter as JsonTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { OTLPTraceExporter as ProtobufTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { resourceFromAttributes } from "@opentelemetry/resources";
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BasicTracerProvider,
  BatchSpanProcessor,
  ParentBasedSampler,
  type Sampler,
  type SpanExporter,
  TraceIdRatioBasedSampler,
} from "@opentelemetry/sdk-trace-base";
import { ATTR_ERROR_TYPE } from "@opentelemetry/semantic-conventions";
import { ServiceError } from "../domain/errors.ts";
import type { DecisionStep, DecisionTracer, TraceAttributes, TraceStep } from "../gateway/observer.ts";
import { ModelServiceError } from "../models/model-service.ts";
import type { AttemptSpan, AttemptTracer } from "../models/routing/types.ts";
import { MODEL_CALL_SPAN } from "../models/systemone-http/call-span.ts";
import { SERVICE_VERSION } from "../version.ts";
import type { TracingSettings } from "./tracing-settings.ts";

/** The span attributes of this service's own (not in the OpenTelemetry semantic conventions). */
export const SPAN_ATTRIBUTES = {
  requestId: "tds.request_id",
  organizationId: "tds.organization_id",
  model: "tds.model",
  outcome: "tds.outcome",
  deployment: "tds.deployment",
  attempt: "tds.attempt",
  attempts: "tds.attempts",
  batchId: "tds.batch_id",
  batchPosition: "tds.batch_position",
} as const;

/** The tracing of one gateway (started only when the OTEL_* variables ask for it: tracing-settings.ts). */
export interface Tracing {
  readonly tracer: Tracer;
  readonly settings: TracingSettings;
  /** The decision pipeline's steps (admission, model call, completion) and the batch requests' own traces. */
  readonly decisions: DecisionTracer;
  /** The routers' attempts: a CLIENT span per call to a deployment. */
  readonly attempts: AttemptTracer;
  /** Exports the spans ended so far. */
  forceFlush(): Promise<void>;
  /** Exports what is left, then stops; spans ended afterwards are dropped. */
  shutdown(): Promise<void>;
}

export interface TracingOptions {
  /** Told of the SDK's own problems (an export that failed): the first, then at most one a minute. */
  warn?: (message: string) => void;
  /** Replaces the OTLP exporter (tests). */
  exporter?: SpanExporter;
}

const DIAG_QUIET_MS = 60_000;
let globalsRegistered = false;

/**
 * The process-wide parts, registered once: the context manager (AsyncLocalStorage: a request's span follows its
 * async work) and the W3C trace-context propagator (traceparent, tracestate). The tracer provider is each Tracing's
 * own, so that several gateways in one process (tests) trace apart.
 */
function registerGlobals(warn: ((message: string) => void) | undefined): void {
  if (globalsRegistered) return;
  globalsRegistered = true;
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  if (warn) {
    let quietUntil = 0;
    let dropped = 0;
    const report = (message: string, ...args: unknown[]) => {
      const now = Date.now();
      if (now < quietUntil) {
        dropped++;
        return;
      }
      quietUntil = now + DIAG_QUIET_MS;
      const extra = args.length > 0 ? ` ${args.map((a) => (a instanceof Error ? a.message : String(a))).join(" ")}` : "";
      warn(`OpenTelemetry: ${message}${extra}${dropped > 0 ? ` (${dropped} more problems not logged)` : ""}`);
      dropped = 0;
    };
    const quiet = () => {};
    diag.setLogger({ error: report, warn: report, info: quiet, debug: quiet, verbose: quiet }, DiagLogLevel.WARN);
  }
}

function samplerOf({ name, ratio }: TracingSettings["sampler"]): Sampler {
  switch (name) {
    case "always_on":
      return new AlwaysOnSampler();
    case "always_off":
      return new AlwaysOffSampler();
    case "traceidratio":
      return new TraceIdRatioBasedSampler(ratio);
    case "parentbased_always_on":
      return new ParentBasedSampler({ root: new AlwaysOnSampler() });
    case "parentbased_always_off":
      return new ParentBasedSampler({ root: new AlwaysOffSampler() });
    case "parentbased_traceidratio":
      return new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(ratio) });
  }
}

/** Starts the SDK: a tracer provider with the configured sampler and resource, a batch span processor and the OTLP/HTTP exporter. */
export function startTracing(settings: TracingSettings, options: TracingOptions = {}): Tracing {
  registerGlobals(options.warn);
  const exporter =
    options.exporter ??
    (settings.protocol === "http/json" ? new JsonTraceExporter({ url: settings.url }) : new ProtobufTraceExporter({ url: settings.url }));
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes(settings.resource),
    sampler: samplerOf(settings.sampler),
    spanProcessors: [new BatchSpanProcessor(exporter)],
  });
  const tracer = provider.getTracer("typed-decision-service", SERVICE_VERSION);
  return {
    tracer,
    settings,
    decisions: decisionTracer(tracer),
    attempts: attemptTracer(tracer),
    forceFlush: () => provider.forceFlush(),
    shutdown: () => provider.shutdown(),
  };
}

/** The error's attributes and status on a span that ends with it: a refusal (4xx) is no error of this service. */
export function endWithError(span: Span, error: unknown): void {
  if (error instanceof ServiceError) {
    span.setAttribute(ATTR_ERROR_TYPE, error.code);
    if (error.status >= 500) span.setStatus({ code: SpanStatusCode.ERROR, message: error.code });
    return;
  }
  const type = error instanceof ModelServiceError ? error.kind : error instanceof Error ? error.name : "unexpected";
  span.setAttribute(ATTR_ERROR_TYPE, type);
  span.setStatus({ code: SpanStatusCode.ERROR, message: type });
}

function decisionTracer(tracer: Tracer): DecisionTracer {
  const stepOf = (span: Span, parent: Context): TraceStep => ({
    within: (work) => context.with(trace.setSpan(parent, span), work),
    end: (error, attributes) => {
      if (attributes) span.setAttributes(attributes);
      if (error !== undefined) endWithError(span, error);
      span.end();
    },
  });
  return {
    step(name: DecisionStep, attributes?: TraceAttributes): TraceStep | null {
      const parent = context.active();
      if (trace.getSpan(parent) === undefined) return null;
      return stepOf(tracer.startSpan(name, attributes ? { attributes: attributes as Attributes } : {}, parent), parent);
    },
    annotate(attributes: TraceAttributes): void {
      trace.getSpan(context.active())?.setAttributes(attributes as Attributes);
    },
    root(name, attributes, work) {
      const span = tracer.startSpan(name, { root: true, attributes: attributes as Attributes });
      return context.with(trace.setSpan(ROOT_CONTEXT, span), async () => {
        try {
          return await work();
        } catch (err) {
          endWithError(span, err);
          throw err;
        } finally {
          span.end();
        }
      });
    },
  };
}

function attemptTracer(tracer: Tracer): AttemptTracer {
  return {
    start(model: string, deployment: string, attempt: number): AttemptSpan | null {
      const parent = context.active();
      if (trace.getSpan(parent) === undefined) return null;
      const span = tracer.startSpan(
        deployment,
        {
          kind: SpanKind.CLIENT,
          attributes: { [SPAN_ATTRIBUTES.model]: model, [SPAN_ATTRIBUTES.deployment]: deployment, [SPAN_ATTRIBUTES.attempt]: attempt },
        },
        parent,
      );
      const current = trace.setSpan(parent, span).setValue(MODEL_CALL_SPAN, span);
      return {
        within: (call) => context.with(current, call),
        end(outcome, error) {
          span.setAttribute(SPAN_ATTRIBUTES.outcome, outcome);
          if (error !== null) endWithError(span, error);
          span.end();
        },
      };
    },
  };
}

/**
 * pino's mixin while tracing is on: the trace and span ids of the request a log line is written for. A new object
 * each time: pino merges the line's own fields into it.
 */
export function traceLogFields(): Record<string, string> {
  const span = trace.getSpan(context.active());
  if (span === undefined) return {};
  const { traceId, spanId } = span.spanContext();
  return { trace_id: traceId, span_id: spanId };
}
