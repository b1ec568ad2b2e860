import type { FastifyError, FastifyInstance, FastifyReply } from "fastify";
import type { ErrorResponse, FieldError } from "../contract/errors.ts";
import { MAX_FIELD_ERRORS, summarizeFieldErrors } from "../contract/validation.ts";
import { ERROR_CATALOGUE, type ErrorCode, ServiceError } from "../domain/errors.ts";
import { isStoreUnavailable } from "../store/store-errors.ts";

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
  let detail = options.detail ?? entry.detail;
  const body: ErrorResponse = { detail };
  if (options.errors && options.errors.length > 0) {
    const total = Math.max(options.totalErrors ?? 0, options.errors.length);
    body.errors = options.errors.slice(0, MAX_FIELD_ERRORS);
    if (total > MAX_FIELD_ERRORS) detail = `${detail} (showing the first ${MAX_FIELD_ERRORS} of ${total} problems)`;
    body.detail = detail;
  }
  if (entry.status === 401) reply.header("www-authenticate", "Bearer");
  if (options.retryAfterMs !== undefined) {
    const ms = Math.max(0, Math.ceil(options.retryAfterMs));
    reply.header("retry-after", String(Math.ceil(ms / 1000)));
    reply.header("retry-after-ms", String(ms));
  }
  return reply.code(entry.status).type("application/json; charset=utf-8").send(body);
}

function validationDetail(errors: FieldError[], total = errors.length): string {
  const first = errors[0];
  const summary = first ? `${first.field}: ${first.message}` : "";
  return total > 1 ? `Invalid request body: ${summary} (and ${total - 1} more)` : `Invalid request body: ${summary}`;
}

export function installErrorHandling(app: FastifyInstance): void {
  app.setNotFoundHandler((_request, reply) => sendError(reply, "route_not_found"));

  app.setErrorHandler((error: FastifyError | ServiceError, request, reply) => {
    if (error instanceof ServiceError) {
      const errors = error.extra.errors;
      const detail = error.detail ?? (errors && errors.length > 0 ? validationDetail(errors) : undefined);
      return sendError(reply, error.code, {
        ...(detail !== undefined ? { detail } : {}),
        ...(errors ? { errors } : {}),
        ...(error.extra.retryAfterMs !== undefined ? { retryAfterMs: error.extra.retryAfterMs } : {}),
      });
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
      return reply.code(400).send();
    }
    if (isStoreUnavailable(error)) {
      request.log.error({ err: error }, "storage unavailable");
      return sendError(reply, "storage_unavailable");
    }
    const status = typeof fe.statusCode === "number" ? fe.statusCode : 500;
    if (status === 405) return sendError(reply, "method_not_allowed");
    if (status >= 400 && status < 500) {
      return reply
        .code(status)
        .type("application/json; charset=utf-8")
        .send({ detail: fe.message || "Bad request." });
    }
    request.log.error({ err: error }, "unhandled error");
    return sendError(reply, "internal");
  });
}
