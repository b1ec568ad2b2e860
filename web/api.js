// The public API, called with the signed-in key. Every call is same-origin; the key is sent only
// in the Authorization header.

/** The gateway's origin root ("…/" above /console/), so the console also works behind a path prefix. */
export const API_ROOT = new URL("../", document.baseURI);

/** The base URL for SDK snippets: the origin (and prefix) without the trailing slash. */
export function apiBaseUrl() {
  return API_ROOT.href.replace(/\/$/, "");
}

/** A non-2xx answer, with the error body `{detail, errors[]}` and the Retry-After timing when given. */
export class ApiError extends Error {
  constructor(response) {
    const body = response.json && typeof response.json === "object" ? response.json : {};
    super(typeof body.detail === "string" ? body.detail : `HTTP ${response.status}`);
    this.name = "ApiError";
    this.status = response.status;
    this.detail = this.message;
    this.errors = Array.isArray(body.errors) ? body.errors : [];
    this.response = response;
    const ms = Number(response.headers.get("retry-after-ms"));
    const seconds = Number(response.headers.get("retry-after"));
    this.retryAfterMs = Number.isFinite(ms) && response.headers.has("retry-after-ms") ? ms : Number.isFinite(seconds) && response.headers.has("retry-after") ? seconds * 1000 : null;
  }
}

/**
 * fetch wrapper. Resolves to {status, ok, headers, text, json, ms} for every HTTP answer;
 * `call` throws ApiError for non-2xx. Network failures throw TypeError as fetch does.
 */
export function createApi(getKey) {
  async function send(method, path, { body, headers = {}, auth = true } = {}) {
    const h = { accept: "application/json", ...headers };
    const key = getKey();
    if (auth && key) h.authorization = `Bearer ${key}`;
    if (body !== undefined) h["content-type"] = "application/json";
    const started = performance.now();
    const res = await fetch(new URL(path.replace(/^\//, ""), API_ROOT), { method, headers: h, body, cache: "no-store", credentials: "omit" });
    const text = await res.text();
    const ms = performance.now() - started;
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = null;
    }
    return { status: res.status, ok: res.ok, headers: res.headers, text, json, ms };
  }
  async function call(method, path, options) {
    const response = await send(method, path, options);
    if (!response.ok) throw new ApiError(response);
    return response.json;
  }
  return {
    send,
    get: (path, options) => call("GET", path, options),
    config: () => call("GET", "/api/config", { auth: false }),
    organization: () => call("GET", "/v1/organization"),
    models: () => call("GET", "/v1/models"),
    /** GET /readyz: 200 or 503, both with per-model states; resolves for either. */
    readiness: () => send("GET", "/readyz", { auth: false }),
    usagePage: (params) => call("GET", `/v1/usage?${new URLSearchParams(params)}`),
    usageRecord: (requestId) => call("GET", `/v1/usage/${encodeURIComponent(requestId)}`),
    usageSummary: (days) => call("GET", `/v1/usage/summary?days=${days}`),
    /** POST /v1/systemone as the Playground: resolves for every status (the caller shows errors). */
    decide: (bodyText) => send("POST", "/v1/systemone", { body: bodyText, headers: { "x-tds-source": "playground" } }),
  };
}
