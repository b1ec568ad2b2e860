import {
  type Attributes,
  type Context,
  context,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from "@opentelemetry/api";
import { ATTR_ERROR_TYPE } from "@opentelemetry/semantic-conventions";
import { ServiceError } from "../domain/errors.ts";
import type { DecisionStep, DecisionTracer, TraceAttributes, TraceStep } from "../gateway/observer.ts";
import { ModelServiceError } from "../models/model-service.ts";
import type { AttemptSpan, AttemptTracer } from "../models/routing/types.ts";
import { MODEL_CALL_SPAN } from "../models/systemone-http/call-span.ts";
import type { TracingSettings } from "./tracing-settings.ts";

/*
 * The parts of tracing that need only @opentelemetry/api: what the app, the logger and the HTTP hooks use. The SDK
 * and its exporters (tracing.ts) are loaded only when tracing is on.
 */

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

/** The tracing of one gateway (started by tracing.ts only when the OTEL_* variables ask for it: tracing-settings.ts). */
export interface Tracing {
  readonly tracer: Tracer;
  readonly settings: TracingSettings;
  /** The decision pipeline's steps (admission, model call, completion) and the batch requests' own traces. */
  readonly decisions: DecisionTracer;
  /** The routers' attempts: a CLIENT span per call to a deployment. */
  readonly attempts: AttemptTracer;
  /** Exports the spans ended so far. */
  forceFlush(): Promise<void>;
  /**
   * Exports what is left, then stops; spans ended afterwards are dropped. Resolves false when the export did not
   * finish within `timeoutMs` (a collector down or not answering): the spans left are then lost.
   */
  shutdown(timeoutMs: number): Promise<boolean>;
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

/**
 * The active span while it still records: not one that ended already (the server span of a request whose client
 * went away) nor one the sampler left out.
 */
function recordingSpan(current: Context): Span | undefined {
  const span = trace.getSpan(current);
  return span?.isRecording() ? span : undefined;
}

export function decisionTracer(tracer: Tracer): DecisionTracer {
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
      if (recordingSpan(parent) === undefined) return null;
      return stepOf(tracer.startSpan(name, attributes ? { attributes: attributes as Attributes } : {}, parent), parent);
    },
    annotate(attributes: TraceAttributes): void {
      recordingSpan(context.active())?.setAttributes(attributes as Attributes);
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

export function attemptTracer(tracer: Tracer): AttemptTracer {
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
