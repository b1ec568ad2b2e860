import { context, DiagLogLevel, diag, propagation, ROOT_CONTEXT } from "@opentelemetry/api";
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
import { SERVICE_VERSION } from "../version.ts";
import { attemptTracer, decisionTracer, type Tracing } from "./spans.ts";
import type { TracingSettings } from "./tracing-settings.ts";

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
      const text = `OpenTelemetry: ${message}${extra}${dropped > 0 ? ` (${dropped} more problems not logged)` : ""}`;
      dropped = 0;
      // The SDK reports from whatever request's context it runs in (an export started when its span ended): the
      // line is about no request, so it carries no trace id.
      context.with(ROOT_CONTEXT, () => warn(text));
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

/**
 * Starts the SDK: a tracer provider with the configured sampler and resource, a batch span processor and the
 * OTLP/HTTP exporter (which reads OTEL_EXPORTER_OTLP_HEADERS and OTEL_EXPORTER_OTLP_TIMEOUT itself). Imported only
 * when tracing is on (server.ts), so that an untraced gateway does not load the SDK.
 */
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
    shutdown: (timeoutMs) => {
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(false), timeoutMs);
      });
      return Promise.race([provider.shutdown().then(() => true), late]).finally(() => clearTimeout(timer));
    },
  };
}
