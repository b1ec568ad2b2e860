import type { TSchema } from "@sinclair/typebox";
import { Ajv, type ValidateFunction } from "ajv";
import { AdminError } from "../admin/admin-error.ts";
import { ERROR_CATALOGUE } from "../domain/errors.ts";
import { safeText } from "./output.ts";

/** Sent as x-tds-client: the audit log records admin API changes made by the CLI with this client. */
export const CLI_CLIENT = "cli";
const DEFAULT_TIMEOUT_MS = 30_000;

// Answers are checked against the contract's schemas; fields a newer gateway adds are dropped rather than refused.
const ajv = new Ajv({
  allErrors: false,
  coerceTypes: false,
  removeAdditional: "all",
  useDefaults: false,
  strict: false,
  validateFormats: false,
});
const validators = new WeakMap<TSchema, ValidateFunction>();

function validatorOf(schema: TSchema): ValidateFunction {
  let validate = validators.get(schema);
  if (!validate) {
    validate = ajv.compile(schema);
    validators.set(schema, validate);
  }
  return validate;
}

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
          "x-tds-client": CLI_CLIENT,
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
    if (!response.ok) throw this.failure(response, text, request);
    if (schema === null) return { body: null as T, headers: response.headers };
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      throw this.unexpected(request, "not JSON");
    }
    const validate = validatorOf(schema);
    if (!validate(body)) throw this.unexpected(request, ajv.errorsText(validate.errors, { dataVar: "body" }));
    return { body: body as T, headers: response.headers };
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
        return new AdminError("name_taken", detail);
      case 422:
        if (field === undefined && request.headers?.["idempotency-key"] !== undefined)
          return new AdminError("idempotency_key_reused", detail);
        return new AdminError("invalid", detail, field);
      default:
        return new AdminError("unavailable", `the gateway at ${this.url} answered ${response.status}: ${detail}`);
    }
  }
}
