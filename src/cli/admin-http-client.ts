import type { TSchema } from "@sinclair/typebox";
import { AdminError } from "../admin/admin-error.ts";
import { ERROR_CATALOGUE } from "../domain/errors.ts";
import { answerProblem, answerValidator } from "./answer-schemas.ts";
import { describeAnswer, PROBE_PATH, probeGateway } from "./gateway-probe.ts";
import { safeText } from "./output.ts";

/** Sent as x-tds-client (`cli:` and the operator when known): the audit log records admin API changes with this client. */
export const CLI_CLIENT = "cli";
const DEFAULT_TIMEOUT_MS = 30_000;

export interface AdminRequest {
  method: "GET" | "POST" | "PATCH" | "DELETE";
  /** Under /admin/v1, already percent-encoded, such as `/organizations/org_abc/keys`. */
  path: string;
  query?: Record<string, string | number | undefined>;
  body?: unknown;
  headers?: Record<string, string>;
}

export interface AdminHttpClientOptions {
  /** The gateway's origin (and base path, if any), without a trailing slash: http://127.0.0.1:8080 */
  url: string;
  token: string;
  /** Who runs the CLI (--actor or the OS user), sent as x-tds-client `cli:NAME`; default: just `cli`. */
  operator?: string;
  timeoutMs?: number;
  fetch?: typeof fetch;
}

/** Calls the gateway's admin API (/admin/v1) with the admin token; every failure is an AdminError the CLI can print. */
export class AdminHttpClient {
  private readonly fetch: typeof fetch;
  private readonly timeoutMs: number;

  constructor(private readonly options: AdminHttpClientOptions) {
    this.fetch = options.fetch ?? globalThis.fetch;
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  }

  get url(): string {
    return this.options.url;
  }

  /** A 2xx answer's body, checked against `schema` (null for a body-less answer such as 204), and its headers. */
  async call<T>(request: AdminRequest, schema: TSchema | null): Promise<{ body: T; headers: Headers }> {
    const target = this.target(request);
    let response: Response;
    let text: string;
    try {
      response = await this.fetch(target, {
        method: request.method,
        headers: {
          authorization: `Bearer ${this.options.token}`,
          accept: "application/json",
          "x-tds-client": this.options.operator === undefined ? CLI_CLIENT : `${CLI_CLIENT}:${this.options.operator}`,
          ...(request.body === undefined ? {} : { "content-type": "application/json" }),
          ...request.headers,
        },
        ...(request.body === undefined ? {} : { body: JSON.stringify(request.body) }),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      text = await response.text();
    } catch (err) {
      throw this.unreachable(err);
    }
    if (!response.ok) throw await this.diagnosed(this.failure(response, text, request), response, text, request);
    if (schema === null) return { body: null as T, headers: response.headers };
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      throw await this.diagnosed(this.unexpected(request, "not JSON"), response, text, request);
    }
    const validate = answerValidator(schema);
    if (!validate(body)) {
      const problem = answerProblem(validate);
      throw await this.diagnosed(this.unexpected(request, problem), response, text, request);
    }
    return { body: body as T, headers: response.headers };
  }

  /**
   * `error` when the URL is a gateway's; else that it is not one, with what it answered. Asked only after an answer
   * that something else could have given (a 4xx, or a 2xx unlike the contract's), so a normal command stays one request.
   */
  private async diagnosed(error: AdminError, response: Response, text: string, request: AdminRequest): Promise<AdminError> {
    if (response.status >= 500) return error;
    const probe = await probeGateway(this.url, this.fetch);
    if (probe.kind !== "other") return error;
    const answered = describeAnswer(response.status, response.headers.get("content-type"), text);
    return new AdminError(
      "unavailable",
      `${this.url} is not a Typed Decision Service gateway (${request.method} /admin/v1${request.path} answered ${answered}; GET ${PROBE_PATH} answered ${probe.seen})`,
    );
  }

  private target(request: AdminRequest): string {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(request.query ?? {})) if (value !== undefined) params.set(name, String(value));
    const query = params.toString() === "" ? "" : `?${params}`;
    return `${this.options.url}/admin/v1${request.path}${query}`;
  }

  private unreachable(err: unknown): AdminError {
    const error = err as Error & { cause?: { message?: string; code?: string } };
    if (error.name === "TimeoutError")
      return new AdminError("unavailable", `the gateway at ${this.url} did not answer within ${this.timeoutMs / 1000} s`);
    const reason = error.cause?.message ?? error.message ?? String(err);
    return new AdminError("unavailable", `cannot reach the gateway at ${this.url}: ${safeText(reason)}`);
  }

  private unexpected(request: AdminRequest, problem: string): AdminError {
    return new AdminError(
      "unavailable",
      `the gateway at ${this.url} answered ${request.method} /admin/v1${request.path} unexpectedly (${safeText(problem)}); is it a Typed Decision Service of this version?`,
    );
  }

  /** An error answer ({detail, errors?}) as the AdminError the operation on the database would have thrown. */
  private failure(response: Response, text: string, request: AdminRequest): AdminError {
    let detail = `${response.status} ${response.statusText}`.trim();
    let field: string | undefined;
    try {
      const body = JSON.parse(text) as { detail?: unknown; errors?: Array<{ field?: unknown }> };
      if (typeof body.detail === "string") detail = body.detail;
      if (typeof body.errors?.[0]?.field === "string") field = body.errors[0].field;
    } catch {
      // Not the gateway's JSON (a proxy's error page, say): the status line says what happened.
    }
    detail = safeText(detail);
    switch (response.status) {
      case 401:
        return new AdminError(
          "unavailable",
          `the gateway at ${this.url} refused the admin token (${detail}); TDS_ADMIN_TOKEN must be the server's admin token`,
        );
      case 404:
        // With no admin token configured on the server, every /admin path is an unknown route.
        if (detail === ERROR_CATALOGUE.route_not_found.detail) {
          return new AdminError("unavailable", `the gateway at ${this.url} has no admin API enabled (set TDS_ADMIN_TOKEN on the server)`);
        }
        return new AdminError("not_found", detail);
      case 409:
        return new AdminError(field === "name" ? "name_taken" : "conflict", detail);
      case 422:
        if (field === undefined && request.headers?.["idempotency-key"] !== undefined)
          return new AdminError("idempotency_key_reused", detail);
        return new AdminError("invalid", detail, field);
      default:
        return new AdminError("unavailable", `the gateway at ${this.url} answered ${response.status}: ${detail}`);
    }
  }
}
