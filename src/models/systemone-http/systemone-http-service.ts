import type { IncomingHttpHeaders } from "node:http";
import type { Span } from "@opentelemetry/api";
import { type Dispatcher, Pool } from "undici";
import {
  type CallOptions,
  type ModelAnswerSet,
  type ModelCall,
  type ModelService,
  ModelServiceError,
  type UpstreamModel,
} from "../model-service.ts";
import { positiveInteger } from "../option-checks.ts";
import { traceExchange, traceStatus } from "./call-span.ts";
import { saysContextExceeded } from "./context-rejection.ts";
import { bodySnippet, parseDecideEnvelope, parseJsonBody, parseModelList, truncate, upstreamDetail } from "./parse-response.ts";

export interface SystemOneHttpOptions {
  /** Origin of the model service, e.g. `http://127.0.0.1:9090` (a path prefix is allowed; no `/v1`). */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** Maximum pooled keep-alive connections (default 32). */
  connections?: number;
  /** Largest accepted response body in bytes (default 8 MiB); larger is `invalid_response`. */
  maxResponseBytes?: number;
}

export const DEFAULT_CONNECTIONS = 32;
export const DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024;
/** Error bodies are read only this far, to find a `detail` (for the log, and to recognise a context rejection). */
const MAX_ERROR_BODY_BYTES = 64 * 1024;
/** setTimeout's largest delay. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Network error codes that mean "the model service cannot be reached / went away". */
const UNAVAILABLE_CODES: Record<string, string> = {
  ECONNREFUSED: "connection refused",
  ECONNRESET: "connection reset",
  EPIPE: "connection closed while sending",
  ENOTFOUND: "host not found (DNS)",
  EAI_AGAIN: "DNS lookup failed",
  EHOSTUNREACH: "host unreachable",
  ENETUNREACH: "network unreachable",
  ETIMEDOUT: "connect timed out",
  ECONNABORTED: "connection aborted",
  UND_ERR_SOCKET: "connection closed by the model service",
  UND_ERR_CONNECT_TIMEOUT: "connect timed out",
  UND_ERR_RES_CONTENT_LENGTH_MISMATCH: "connection closed before the full body arrived",
  UND_ERR_CLOSED: "the model service client is closed",
  UND_ERR_DESTROYED: "the model service client is closed",
  ERR_TLS_CERT_ALTNAME_INVALID: "TLS certificate does not match the host",
  DEPTH_ZERO_SELF_SIGNED_CERT: "self-signed TLS certificate",
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: "TLS certificate cannot be verified",
  CERT_HAS_EXPIRED: "TLS certificate has expired",
};

/** Raised internally (never thrown to callers) as the abort reason of our own deadline / caller abort. */
class StopReason extends Error {
  constructor(readonly why: "timeout" | "aborted") {
    super(why);
  }
}

interface Exchange {
  status: number;
  headers: IncomingHttpHeaders;
  body: Uint8Array;
}

export function openSystemOneHttpService(options: SystemOneHttpOptions): ModelService {
  const base = parseBaseUrl(options.baseUrl);
  const apiKey = options.apiKey;
  if (apiKey !== undefined && !/^[\x21-\x7e]+$/.test(apiKey)) {
    // Do not echo the key.
    throw new TypeError("apiKey must be non-empty printable ASCII without spaces");
  }
  const connections = options.connections ?? DEFAULT_CONNECTIONS;
  positiveInteger("connections", connections);
  const maxResponseBytes = options.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES;
  positiveInteger("maxResponseBytes", maxResponseBytes);

  const originUrl = new URL(base.origin);
  const pool = new Pool(base.origin, {
    connections,
    pipelining: 1,
    keepAliveTimeout: 4_000,
    keepAliveMaxTimeout: 60_000,
  });

  const baseHeaders: Record<string, string> = {
    accept: "application/json",
    "user-agent": "typed-decision-service",
  };
  if (apiKey !== undefined) baseHeaders.authorization = `Bearer ${apiKey}`;
  // Shared by every call (undici only reads them); a traced call sends a copy with its trace context.
  const postHeaders: Record<string, string> = { ...baseHeaders, "content-type": "application/json" };

  /** Removes the API key from any text that may leave this module. */
  function scrub(text: string): string {
    return apiKey === undefined ? text : text.split(apiKey).join("[redacted]");
  }

  /** `upstreamText`: the model service's own words, kept for the server log only (see ModelServiceError). */
  function fail(
    kind: ModelServiceError["kind"],
    message: string,
    status?: number,
    upstreamText?: string,
    retryAfterSeconds?: number,
  ): ModelServiceError {
    return new ModelServiceError(kind, scrub(message), status, {
      ...(upstreamText !== undefined ? { upstreamText: scrub(upstreamText) } : {}),
      ...(retryAfterSeconds !== undefined ? { retryAfterSeconds } : {}),
    });
  }

  /**
   * One HTTP exchange under a deadline covering connect, headers and the full body (a call still waiting for a pooled
   * connection fails when one takes it: see ExchangeHandler.stop). Non-2xx
   * statuses are turned into ModelServiceErrors here; a 2xx returns the (size-limited) body.
   */
  async function exchange(method: "GET" | "POST", path: string, payload: Buffer | undefined, call: CallOptions): Promise<Exchange> {
    const outer = call.signal;
    if (outer?.aborted) throw fail("aborted", "model call aborted before it started");
    const timeoutMs = call.timeoutMs;
    if (!(timeoutMs > 0)) throw fail("timeout", `model call deadline already passed (timeoutMs ${timeoutMs})`);

    const shared = payload === undefined ? baseHeaders : postHeaders;
    const traced = traceExchange(shared, method, originUrl, base.pathPrefix + path);
    const headers = traced?.headers ?? shared;
    const span = traced?.span;
    const ex = new ExchangeHandler(maxResponseBytes, span);
    const timer = setTimeout(deadlinePassed, Math.min(Math.ceil(timeoutMs), MAX_TIMER_MS), ex);
    // The handler itself is the listener (its handleEvent stops the exchange): no closure per call.
    outer?.addEventListener("abort", ex, { once: true });
    try {
      try {
        pool.dispatch({ method, path: base.pathPrefix + path, headers, body: payload }, ex);
      } catch (err) {
        // undici reports a refused dispatch to the handler; should it throw instead, it is the same failure.
        ex.onResponseError(undefined, err as Error);
      }
      await ex.done;
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", ex);
    }

    const stopped = (): ModelServiceError | undefined => {
      if (ex.stoppedBy === "timeout") return fail("timeout", `model service did not answer within ${timeoutMs} ms`);
      if (ex.stoppedBy === "aborted") return fail("aborted", "model call aborted");
      return undefined;
    };

    const status = ex.status;
    if (status === 0) throw stopped() ?? networkError(ex.error, "while connecting or waiting for the response");
    if (status >= 200 && status < 300) {
      if (ex.tooLarge) throw fail("invalid_response", `model service response is larger than ${maxResponseBytes} bytes`, status);
      if (!ex.complete) throw stopped() ?? networkError(ex.error, "while reading the response body");
      return { status, headers: ex.headers, body: Buffer.concat(ex.chunks, ex.size) };
    }

    // Non-2xx: a bounded part of the body was read for its message; the status (and, for 400 / 422, the message) decides
    // the kind. A body cut short (past the bound, an error, the deadline) leaves only the status; a caller abort still wins.
    let detail: string | undefined;
    if (ex.complete) {
      const errorBody = Buffer.concat(ex.chunks, ex.size);
      const parsed = parseJsonBody(errorBody);
      detail = parsed.ok ? upstreamDetail(parsed.value) : bodySnippet(errorBody);
    }
    if (ex.stoppedBy === "aborted") throw stopped();
    throw statusError(status, ex.headers, detail);
  }

  /** `detail`: the body's message, kept apart from ours (see `fail`). */
  function statusError(status: number, headers: IncomingHttpHeaders, detail: string | undefined): ModelServiceError {
    if (status === 429 || status === 529) {
      const retryAfter = retryAfterSeconds(headers);
      const hint = retryAfter !== undefined ? `; retry after ${retryAfter} s` : "";
      return fail("overloaded", `model service is overloaded (HTTP ${status}${hint})`, status, detail, retryAfter);
    }
    if (status === 413 || ((status === 400 || status === 422) && saysContextExceeded(detail))) {
      return fail("context_rejected", `model service rejected the request's context (HTTP ${status})`, status, detail);
    }
    if (status === 400 || status === 422) {
      return fail("refused", `model service refused the request (HTTP ${status})`, status, detail);
    }
    return fail("bad_status", `model service answered HTTP ${status}`, status, detail);
  }

  function networkError(err: unknown, when: string): ModelServiceError {
    const code = errorCode(err);
    if (code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_BODY_TIMEOUT") {
      return fail("timeout", `timed out ${when} (${code})`);
    }
    // undici's parser errors carry an HPE_ code, except some (an invalid status line) that carry none but their name.
    if (code?.startsWith("HPE_") || (err instanceof Error && err.name === "HTTPParserError")) {
      return fail("invalid_response", `malformed HTTP response (${code ?? truncate(errorMessage(err), 200)})`);
    }
    if (code === "UND_ERR_INVALID_ARG") {
      return fail("unavailable", `request could not be sent: ${truncate(errorMessage(err), 200)}`);
    }
    const what = code !== undefined ? UNAVAILABLE_CODES[code] : undefined;
    const reason =
      what !== undefined ? `${what} (${code})` : truncate(`${errorMessage(err)}${code !== undefined ? ` (${code})` : ""}`, 200);
    return fail("unavailable", `${reason} ${when}`);
  }

  function parseOrFail(body: Uint8Array, status: number): unknown {
    const parsed = parseJsonBody(body);
    if (!parsed.ok) throw fail("invalid_response", `unreadable answer: ${parsed.reason}`, status, bodySnippet(body));
    return parsed.value;
  }

  let closing: Promise<void> | undefined;

  return {
    async decide(call: ModelCall, callOptions: CallOptions): Promise<ModelAnswerSet> {
      const payload = decideRequestBody(call);
      const started = performance.now();
      const res = await exchange("POST", "/v1/systemone", payload, callOptions);
      const latencyMs = performance.now() - started;
      const envelope = parseDecideEnvelope(parseOrFail(res.body, res.status));
      if (!envelope.ok) throw fail("invalid_response", `unreadable answer: ${envelope.reason}`, res.status);
      return { answers: envelope.value.answers, usage: envelope.value.usage, latencyMs };
    },

    async listModels(callOptions: CallOptions): Promise<UpstreamModel[]> {
      const res = await exchange("GET", "/v1/models", undefined, callOptions);
      const list = parseModelList(parseOrFail(res.body, res.status));
      if (!list.ok) throw fail("invalid_response", `unreadable model list: ${list.reason}`, res.status);
      return list.value;
    },

    close(): Promise<void> {
      closing ??= pool.close();
      return closing;
    },
  };
}

/**
 * The body of POST /v1/systemone for a call: the request's own text of `state` and `questions` when known (every value
 * exactly as the client wrote it), else their JSON.
 */
export function decideRequestBody(call: ModelCall): Buffer {
  return Buffer.from(
    call.text
      ? `{"state":${call.text.state},"questions":${call.text.questions},"model":${JSON.stringify(call.model)}}`
      : JSON.stringify({ state: call.state === undefined ? null : call.state, questions: call.questions, model: call.model }),
    "utf8",
  );
}

/** The abort reason of an exchange whose body passed its limit (never thrown to callers). */
class TooLarge extends Error {}

function deadlinePassed(ex: ExchangeHandler): void {
  ex.stop("timeout");
}

/**
 * One exchange as an undici dispatch handler (undici's handler API: the controller's abort() ends the request and closes
 * its connection). It keeps the final status, its headers (parsed by undici: lower-case names, string or string[] values)
 * and the body chunks, up to `okLimit` bytes for a 2xx and MAX_ERROR_BODY_BYTES otherwise: a declared content-length
 * over the limit stops it at the headers, a body growing past it as it passes. `done` resolves, never rejects, once the
 * exchange has ended one way or another; the fields then say how: `complete` (the whole body read), `tooLarge`,
 * `stoppedBy` (the deadline or the caller's abort, via stop()) or `error` (from undici). Only the first end counts.
 */
class ExchangeHandler implements Dispatcher.DispatchHandler {
  status = 0;
  headers: IncomingHttpHeaders = {};
  readonly chunks: Buffer[] = [];
  size = 0;
  complete = false;
  tooLarge = false;
  stoppedBy: "timeout" | "aborted" | null = null;
  error: unknown = undefined;
  readonly done: Promise<void>;
  private ended = false;
  private limit = MAX_ERROR_BODY_BYTES;
  private controller: Dispatcher.DispatchController | null = null;
  private resolve: () => void = noop;

  constructor(
    private readonly okLimit: number,
    private readonly span: Span | undefined,
  ) {
    this.done = new Promise<void>((resolve) => {
      this.resolve = resolve;
    });
  }

  /** The deadline passed or the caller aborted: ends the exchange and its request (a queued one when a connection takes it). */
  stop(why: "timeout" | "aborted"): void {
    if (this.ended || this.stoppedBy !== null) return;
    this.stoppedBy = why;
    // Still waiting in the pool's queue: it ends when a connection takes it (onRequestStart), not before. Ended now, it
    // would free its caller (and the router's slot) while it stays queued in undici, where each such request later
    // costs the connection that takes it (aborting it closes that socket): calls given up in a burst would pile up.
    if (this.controller === null) return;
    this.end();
    this.controller.abort(new StopReason(why));
  }

  /** The caller's signal fired (this object is its "abort" listener). */
  handleEvent(): void {
    this.stop("aborted");
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    // Stopped while it waited in the pool's queue for a connection: it is not sent.
    if (this.stoppedBy !== null && !this.ended) {
      this.end();
      controller.abort(new StopReason(this.stoppedBy));
    }
  }

  onResponseStart(controller: Dispatcher.DispatchController, statusCode: number, headers: IncomingHttpHeaders): void {
    if (statusCode < 200) return; // 1xx informational: the response is still to come
    this.status = statusCode;
    this.headers = headers;
    if (this.span !== undefined) traceStatus(this.span, statusCode);
    if (statusCode < 300) this.limit = this.okLimit;
    const declared = Number(headers["content-length"]);
    if (Number.isFinite(declared) && declared > this.limit) this.overLimit(controller);
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.ended) return;
    this.size += chunk.byteLength;
    if (this.size > this.limit) {
      this.overLimit(controller);
      // As undici does for a handler that throws here: stop feeding this (now closed) connection's parser.
      controller.pause();
      return;
    }
    this.chunks.push(chunk);
  }

  onResponseEnd(): void {
    if (this.ended) return;
    this.complete = true;
    this.end();
  }

  /** `controller` is undefined when the dispatch failed before the request started (e.g. the pool is closed). */
  onResponseError(_controller: Dispatcher.DispatchController | undefined, err: Error): void {
    if (this.ended) return;
    this.error = err;
    this.end();
  }

  private overLimit(controller: Dispatcher.DispatchController): void {
    if (this.ended) return;
    this.tooLarge = true;
    this.end();
    controller.abort(new TooLarge());
  }

  private end(): void {
    this.ended = true;
    this.resolve();
  }
}

function noop(): void {}

function retryAfterSeconds(headers: IncomingHttpHeaders): number | undefined {
  const raw = headers["retry-after"];
  const value = Array.isArray(raw) ? raw[0] : raw;
  if (value === undefined) return undefined;
  if (/^\s*\d+\s*$/.test(value)) return Number(value);
  const date = Date.parse(value);
  if (Number.isNaN(date)) return undefined;
  return Math.max(0, Math.ceil((date - Date.now()) / 1000));
}

function errorCode(err: unknown): string | undefined {
  if (typeof err !== "object" || err === null) return undefined;
  const code = (err as { code?: unknown }).code;
  if (typeof code === "string") return code;
  // AggregateError (e.g. happy-eyeballs connect to several addresses): use the first inner code.
  const inner = (err as { errors?: unknown }).errors;
  if (Array.isArray(inner))
    for (const e of inner) {
      const c = errorCode(e);
      if (c !== undefined) return c;
    }
  const cause = (err as { cause?: unknown }).cause;
  return cause !== undefined && cause !== err ? errorCode(cause) : undefined;
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function parseBaseUrl(baseUrl: string): { origin: string; pathPrefix: string } {
  let url: URL;
  try {
    url = new URL(baseUrl);
  } catch {
    throw new TypeError("baseUrl must be an absolute http(s) URL");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new TypeError("baseUrl must use http or https");
  if (url.username !== "" || url.password !== "") throw new TypeError("baseUrl must not contain credentials; use apiKey");
  if (url.search !== "" || url.hash !== "") throw new TypeError("baseUrl must not have a query or fragment");
  const pathPrefix = url.pathname.replace(/\/+$/, "");
  return { origin: url.origin, pathPrefix };
}
