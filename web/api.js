// The public API, called with the signed-in key, and the admin API, called with the admin token. Every call is
// same-origin; the key and the token are sent only in the Authorization header.

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
    this.retryAfterMs =
      Number.isFinite(ms) && response.headers.has("retry-after-ms")
        ? ms
        : Number.isFinite(seconds) && response.headers.has("retry-after")
          ? seconds * 1000
          : null;
  }
}

/**
 * fetch wrapper for calls with `Authorization: Bearer <getBearer()>` (when there is one) and `fixedHeaders`.
 * `send` resolves to {status, ok, headers, text, json, ms} for every HTTP answer; `call` throws ApiError for non-2xx.
 * Network failures throw TypeError as fetch does.
 */
function createRequester(getBearer, fixedHeaders = {}) {
  async function send(method, path, { body, headers = {}, auth = true } = {}) {
    const h = { accept: "application/json", ...fixedHeaders, ...headers };
    const bearer = getBearer();
    if (auth && bearer) h.authorization = `Bearer ${bearer}`;
    if (body !== undefined && !h["content-type"]) h["content-type"] = "application/json";
    const started = performance.now();
    const res = await fetch(new URL(path.replace(/^\//, ""), API_ROOT), {
      method,
      headers: h,
      body,
      cache: "no-store",
      credentials: "omit",
    });
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
  return { send, call };
}

/** The public API, called with the signed-in organization's key. */
export function createApi(getKey) {
  const { send, call } = createRequester(getKey);
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
    batches: ({ limit, cursor } = {}) => call("GET", `/v1/batches${query({ limit, cursor })}`),
    batch: (id) => call("GET", `/v1/batches/${seg(id)}`),
    /** POST /v1/batches with the file (a File or Blob) as the NDJSON body; `model` for the lines that name none. */
    submitBatch: (file, model) =>
      call("POST", `/v1/batches${query({ model })}`, { body: file, headers: { "content-type": "application/x-ndjson" } }),
    cancelBatch: (id) => call("POST", `/v1/batches/${seg(id)}/cancel`),
    /** GET /v1/batches/{id}/results: the NDJSON as a Blob (not parsed); ApiError for non-2xx. */
    async batchResults(id) {
      const key = getKey();
      const res = await fetch(new URL(`v1/batches/${seg(id)}/results`, API_ROOT), {
        headers: { accept: "application/x-ndjson", ...(key ? { authorization: `Bearer ${key}` } : {}) },
        cache: "no-store",
        credentials: "omit",
      });
      if (res.ok) return await res.blob();
      const text = await res.text();
      let json = null;
      try {
        json = text ? JSON.parse(text) : null;
      } catch {
        json = null;
      }
      throw new ApiError({ status: res.status, ok: false, headers: res.headers, text, json, ms: 0 });
    },
  };
}

const ADMIN = "/admin/v1";
const seg = (value) => encodeURIComponent(value);
const query = (params) => {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) if (value !== undefined && value !== null && value !== "") q.set(name, String(value));
  const text = q.toString();
  return text ? `?${text}` : "";
};

/**
 * The admin API (/admin/v1), called with the admin token. Every call says `x-tds-client: console`, so the audit log
 * names the console as the client of each change.
 */
export function createAdminApi(getToken) {
  const { send, call } = createRequester(getToken, { "x-tds-client": "console" });
  const json = (value) => JSON.stringify(value);
  return {
    organizations: ({ limit, cursor } = {}) => call("GET", `${ADMIN}/organizations${query({ limit, cursor })}`),
    createOrganization: (name) => call("POST", `${ADMIN}/organizations`, { body: json({ name }) }),
    organization: (org) => call("GET", `${ADMIN}/organizations/${seg(org)}`),
    setPaused: (org, paused) => call("PATCH", `${ADMIN}/organizations/${seg(org)}`, { body: json({ paused }) }),
    keys: (org) => call("GET", `${ADMIN}/organizations/${seg(org)}/keys`),
    /** `body`: the name and settings to send (CreateKey); absent ones are left out. */
    createKey: (org, body = {}) => call("POST", `${ADMIN}/organizations/${seg(org)}/keys`, { body: json(body) }),
    /** PATCH with the changed settings only; null clears one. */
    updateKey: (keyId, changes) => call("PATCH", `${ADMIN}/keys/${seg(keyId)}`, { body: json(changes) }),
    rotateKey: (keyId, graceSeconds) => call("POST", `${ADMIN}/keys/${seg(keyId)}/rotate`, { body: json({ grace_seconds: graceSeconds }) }),
    revokeKey: (keyId) => call("DELETE", `${ADMIN}/keys/${seg(keyId)}`),
    /** Resolves to {balance, replayed}: `replayed` when the Idempotency-Key had already been applied (nothing granted again). */
    async grantCredits(org, body, idempotencyKey) {
      const response = await send("POST", `${ADMIN}/organizations/${seg(org)}/credits`, {
        body: json(body),
        headers: { "idempotency-key": idempotencyKey },
      });
      if (!response.ok) throw new ApiError(response);
      return { balance: response.json, replayed: response.headers.get("idempotent-replayed") === "true" };
    },
    audit: ({ limit, cursor, org } = {}) => call("GET", `${ADMIN}/audit${query({ limit, cursor, org })}`),
  };
}

/**
 * A random UUID (v4). crypto.randomUUID exists only in secure contexts (https or localhost); a gateway reached over
 * plain http on another address still gets one from crypto.getRandomValues.
 */
export function randomUuid() {
  if (typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
