import { context, createContextKey, propagation, type Span } from "@opentelemetry/api";
import {
  ATTR_HTTP_REQUEST_METHOD,
  ATTR_HTTP_RESPONSE_STATUS_CODE,
  ATTR_SERVER_ADDRESS,
  ATTR_SERVER_PORT,
  ATTR_URL_FULL,
} from "@opentelemetry/semantic-conventions";

/**
 * Where the caller's tracing (src/observability/spans.ts) puts the span of one model call attempt: this adapter
 * gives it the HTTP exchange's attributes and sends its trace context to the model service (traceparent, tracestate).
 * Without tracing the context holds nothing and the adapter does nothing more.
 */
export const MODEL_CALL_SPAN = createContextKey("tds model call attempt span");

/**
 * The traced attempt this exchange belongs to, with the headers to send: a copy of `shared` with its trace context
 * added. Undefined when the exchange is not traced (`shared` is then sent as it is, and never changed).
 */
export function traceExchange(
  shared: Readonly<Record<string, string>>,
  method: string,
  origin: URL,
  path: string,
): { span: Span; headers: Record<string, string> } | undefined {
  const current = context.active();
  const span = current.getValue(MODEL_CALL_SPAN) as Span | undefined;
  if (span === undefined) return undefined;
  const headers = { ...shared };
  propagation.inject(current, headers);
  if (!span.isRecording()) return { span, headers };
  span.setAttributes({
    [ATTR_HTTP_REQUEST_METHOD]: method,
    [ATTR_SERVER_ADDRESS]: origin.hostname,
    [ATTR_SERVER_PORT]: Number(origin.port) || (origin.protocol === "https:" ? 443 : 80),
    [ATTR_URL_FULL]: `${origin.origin}${path}`,
  });
  return { span, headers };
}

/** The status the model service answered the traced exchange with (unless the attempt already ended: its deadline). */
export function traceStatus(span: Span, status: number): void {
  if (span.isRecording()) span.setAttribute(ATTR_HTTP_RESPONSE_STATUS_CODE, status);
}
