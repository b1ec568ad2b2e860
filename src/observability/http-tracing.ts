import type { IncomingMessage, ServerResponse } from "node:http";
import { context, propagation, ROOT_CONTEXT, type Span, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import {
  ATTR_ERROR_TYPE,
  ATTR_HTTP_REQUEST_METHOD,
  ATTR_HTTP_RESPONSE_STATUS_CODE,
  ATTR_HTTP_ROUTE,
  ATTR_URL_PATH,
  ATTR_URL_SCHEME,
  ATTR_USER_AGENT_ORIGINAL,
} from "@opentelemetry/semantic-conventions";
import type { FastifyInstance } from "fastify";
import { SPAN_ATTRIBUTES, type Tracing } from "./spans.ts";

type RequestListener = (req: IncomingMessage, res: ServerResponse) => void;

const serverSpans = new WeakMap<IncomingMessage, Span>();

/** The longest url.path and user_agent.original kept on a span (a client may send kilobytes of either). */
export const MAX_PATH_CHARS = 1024;
export const MAX_USER_AGENT_CHARS = 256;
/** error.type of a request whose connection closed before its answer was sent. */
export const CLIENT_CLOSED = "client_closed";

/**
 * A SERVER span per HTTP request, continuing the client's W3C trace context (traceparent, tracestate). Fastify's
 * request listener runs inside the span's context, and the request and response emitters are bound to it, so that
 * everything the request does (hooks, body parsing, the handler, the log lines, the model calls) sees its span.
 * The span is named `METHOD /route/template` once the route is known, and ends when the response is closed: with
 * the status sent, or without one (error.type client_closed) when the connection closed before the answer was sent.
 */
export function traceRequests(app: FastifyInstance, tracing: Tracing): void {
  const { tracer } = tracing;
  const server = app.server;
  const listeners = server.listeners("request") as RequestListener[];
  server.removeAllListeners("request");
  for (const listener of listeners) {
    server.on("request", (req: IncomingMessage, res: ServerResponse) => {
      const parent = propagation.extract(ROOT_CONTEXT, req.headers);
      const method = req.method ?? "_OTHER";
      const url = req.url ?? "/";
      const query = url.indexOf("?");
      const span = tracer.startSpan(
        method,
        {
          kind: SpanKind.SERVER,
          attributes: {
            [ATTR_HTTP_REQUEST_METHOD]: method,
            [ATTR_URL_PATH]: (query < 0 ? url : url.slice(0, query)).slice(0, MAX_PATH_CHARS),
            [ATTR_URL_SCHEME]: "http",
            ...(req.headers["user-agent"] ? { [ATTR_USER_AGENT_ORIGINAL]: req.headers["user-agent"].slice(0, MAX_USER_AGENT_CHARS) } : {}),
          },
        },
        parent,
      );
      serverSpans.set(req, span);
      const current = trace.setSpan(parent, span);
      context.bind(current, req);
      context.bind(current, res);
      res.once("close", () => {
        // Without headers sent, res.statusCode is Node's default 200: nothing was answered.
        if (!res.headersSent) {
          span.setAttribute(ATTR_ERROR_TYPE, CLIENT_CLOSED);
          span.end();
          return;
        }
        const status = res.statusCode;
        span.setAttribute(ATTR_HTTP_RESPONSE_STATUS_CODE, status);
        if (status >= 500) {
          span.setAttribute(ATTR_ERROR_TYPE, String(status));
          span.setStatus({ code: SpanStatusCode.ERROR });
        } else if (!res.writableFinished) {
          span.setAttribute(ATTR_ERROR_TYPE, "aborted");
        }
        span.end();
      });
      context.with(current, listener, server, req, res);
    });
  }
  app.addHook("onRequest", (request, _reply, done) => {
    const span = serverSpans.get(request.raw);
    if (span !== undefined) {
      const route = request.routeOptions.url;
      span.setAttribute(SPAN_ATTRIBUTES.requestId, request.id);
      if (route !== undefined) {
        span.updateName(`${request.method} ${route}`);
        span.setAttribute(ATTR_HTTP_ROUTE, route);
      }
    }
    done();
  });
  app.addHook("onResponse", (request, _reply, done) => {
    const orgId = request.auth?.org.id;
    const span = serverSpans.get(request.raw);
    if (orgId !== undefined && span?.isRecording()) span.setAttribute(SPAN_ATTRIBUTES.organizationId, orgId);
    done();
  });
}
