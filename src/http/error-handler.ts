import { STATUS_CODES } from "node:http";
import type { Duplex } from "node:stream";
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { errorBody, errorResponse, type FieldError, serviceErrorAnswer, validationDetail } from "../contract/errors.ts";
import { MAX_FIELD_ERRORS, summarizeFieldErrors } from "../contract/validation.ts";
import { ERROR_CATALOGUE, type ErrorCode, ServiceError, statusOf } from "../domain/errors.ts";
import type { Store } from "../store/store.ts";

export interface ErrorReplyOptions {
  detail?: string;
  errors?: FieldError[];
  /** How many problems were found when `errors` lists only some of them (default: errors.length). */
  totalErrors?: number;
  retryAfterMs?: number;
}

/** Sends `{detail, errors?}` with the catalogue's status; errors[] is bounded and the detail says so. */
export function sendError(reply: FastifyReply, code: ErrorCode, options: ErrorReplyOptions = {}): FastifyReply {
  const entry = ERROR_CATALOGUE[code];
  const body = errorBody(code, options);
  if (entry.status === 401) reply.header("www-authenticate", "Bearer");
  if (options.retryAfterMs !== undefined) retryAfter(reply, options.retryAfterMs);
  return reply.code(entry.status).type("application/json; charset=utf-8").send(body);
}

function retryAfter(reply: FastifyReply, retryAfterMs: number): void {
  const ms = Math.max(0, Math.ceil(retryAfterMs));
  reply.header("retry-after", String(Math.ceil(ms / 1000)));
  reply.header("retry-after-ms", String(ms));
}

/** The catalogue code of a status Fastify or a plugin gave an error of its own (never its message: it may echo the URL). */
function codeOfStatus(status: number): ErrorCode {
  switch (status) {
    case 404:
      return "route_not_found";
    case 405:
      return "method_not_allowed";
    case 408:
      return "request_timeout";
    case 413:
      return "body_too_large";
    case 414:
      return "uri_too_long";
    case 415:
      return "unsupported_media_type";
    case 431:
      return "headers_too_large";
    default:
      return "bad_request";
  }
}

/**
 * Fastify's `frameworkErrors`: a URL it cannot route (bad percent-encoding, a path parameter past maxParamLength),
 * answered from the catalogue before any hook runs. The URL is not echoed.
 */
export function frameworkErrorHandler(error: FastifyError, request: FastifyRequest, reply: FastifyReply): void {
  reply.header("x-service-request-id", request.id);
  reply.header("x-typesafe-request-id", request.id);
  switch (error.code) {
    case "FST_ERR_BAD_URL":
      sendError(reply, "invalid_url");
      return;
    case "FST_ERR_MAX_PARAM_LENGTH":
      sendError(reply, "uri_too_long", {
        detail: `The request URL is too long: a path parameter may have at most ${request.server.initialConfig.maxParamLength ?? 100} characters.`,
      });
      return;
    default:
      request.log.error({ err: error }, "unexpected framework error");
      sendError(reply, "internal");
  }
}

export interface ClientErrorLimits {
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  maxHeaderSize: number;
}

/** A whole HTTP/1.1 answer from the catalogue, for a connection whose request could not be read (so no Fastify reply exists). */
function rawErrorResponse(code: ErrorCode, detail?: string): string {
  const { status } = ERROR_CATALOGUE[code];
  const body = JSON.stringify(errorResponse(code, detail));
  return (
    `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json; charset=utf-8\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`
  );
}

/**
 * Fastify's `clientErrorHandler`: malformed HTTP (bad framing, an invalid Content-Length), headers past the size
 * limit, and requests past their deadline get the contract's error body, then the connection is closed.
 */
export function clientErrorHandler(limits: ClientErrorLimits): (err: Error & { code?: string }, socket: Duplex) => void {
  return (err, socket) => {
    if (!socket.writable) {
      socket.destroy(err);
      return;
    }
    let answer: string;
    if (err.code === "ERR_HTTP_REQUEST_TIMEOUT") {
      answer = rawErrorResponse(
        "request_timeout",
        `The request did not arrive in time: its headers must arrive within ${limits.headersTimeoutMs / 1000} s and the whole request within ${limits.requestTimeoutMs / 1000} s.`,
      );
    } else if (err.code === "HPE_HEADER_OVERFLOW") {
      answer = rawErrorResponse(
        "headers_too_large",
        `The request's headers are too large: the request line and headers together may have at most ${limits.maxHeaderSize} bytes.`,
      );
    } else {
      answer = rawErrorResponse("malformed_http");
    }
    socket.end(answer);
  };
}

/**
 * The not-found and error handlers. An error the service can name is answered from the catalogue; a failure of the
 * storage, as the store reads it (`classifyFailure`), is 503 `storage_unavailable`; anything else is 500 `internal`.
 */
export function installErrorHandling(app: FastifyInstance, store: Pick<Store, "classifyFailure">): void {
  app.setNotFoundHandler((_request, reply) => sendError(reply, "route_not_found"));

  app.setErrorHandler((error: FastifyError | ServiceError, request, reply) => {
    if (error instanceof ServiceError) {
      if (error.code === "internal") request.log.error({ err: error }, "unhandled error");
      const answer = serviceErrorAnswer(error);
      if (error.status === 401) reply.header("www-authenticate", "Bearer");
      if (answer.retryAfterMs !== undefined) retryAfter(reply, answer.retryAfterMs);
      return reply.code(answer.status).type("application/json; charset=utf-8").send(answer.body);
    }
    const fe = error as FastifyError;
    if (fe.validation) {
      const where = fe.validationContext;
      // Only the listed problems get a message; the rest are counted (validation.ts, linear in the errors).
      const summary = summarizeFieldErrors(fe.validation as never, MAX_FIELD_ERRORS);
      let errors = summary.errors;
      if (where && where !== "body")
        errors = errors.map((e) => ({ field: `${where}.${e.field}`.replace(/\.\(body\)$/, ""), message: e.message }));
      const code = where === "body" ? "invalid_body" : "invalid_query";
      return sendError(reply, code, { detail: validationDetail(errors, summary.total), errors, totalErrors: summary.total });
    }
    switch (fe.code) {
      case "FST_ERR_CTP_BODY_TOO_LARGE":
        return sendError(reply, "body_too_large", {
          detail: `Request body exceeds max_request_bytes (${request.routeOptions.bodyLimit ?? "the limit"} bytes of UTF-8 JSON).`,
        });
      case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
        return sendError(reply, "unsupported_media_type");
      case "FST_ERR_CTP_EMPTY_JSON_BODY":
        return sendError(reply, "invalid_json", { detail: "Request body is empty; send a JSON object." });
      case "FST_ERR_CTP_INVALID_CONTENT_LENGTH":
        return sendError(reply, "invalid_json", { detail: "Request body length does not match its Content-Length." });
      default:
        break;
    }
    if (request.raw.socket?.destroyed) {
      // The client went away before its request was read (an abort, a reset): nobody to answer, nothing wrong here.
      request.log.info({ code: fe.code }, "client closed the connection before the request was read");
      return reply.code(statusOf("bad_request")).send();
    }
    if (store.classifyFailure(error) !== "other") {
      request.log.error({ err: error }, "storage unavailable");
      return sendError(reply, "storage_unavailable");
    }
    const status = typeof fe.statusCode === "number" ? fe.statusCode : 500;
    if (status >= 400 && status < 500) {
      request.log.info({ code: fe.code, status }, "client error answered from the catalogue");
      return sendError(reply, codeOfStatus(status));
    }
    request.log.error({ err: error }, "unhandled error");
    return sendError(reply, "internal");
  });
}
