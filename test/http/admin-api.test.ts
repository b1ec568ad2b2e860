/**
 * The admin API (/admin/v1) through a real listening gateway: every endpoint, the security cases, idempotent credit
 * grants (also through a lost response), and the audit log.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { assertLedgerMatches } from "../support/books.ts";
import { errorBody } from "../support/contract-check.ts";
import { decideWithKey, type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { startLossyProxy } from "../support/lossy-proxy.ts";

const ADMIN_TOKEN = "adm-7Yq2pVx9Lr4Tz8Kw1Nc6Hs3Bd5Fg0Jm";

interface Json {
  [key: string]: any;
}

function adminClient(gw: Gateway, token = ADMIN_TOKEN) {
  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(`${gw.url}/admin/v1${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }), ...headers },
      ...(body === undefined ? {} : { body: typeof body === "string" ? body : JSON.stringify(body) }),
    });
    const text = await res.text();
    return { status: res.status, headers: res.headers, text, json: (text ? JSON.parse(text) : null) as Json };
  };
  return {
    call,
    get: (path: string) => call("GET", path),
    post: (path: string, body: unknown, headers?: Record<string, string>) => call("POST", path, body, headers),
    patch: (path: string, body: unknown) => call("PATCH", path, body),
    del: (path: string) => call("DELETE", path),
  };
}

describe("admin API: security", () => {
  let gw: Gateway;
  let off: Gateway;
  before(async () => {
    gw = await startGateway({ env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN } });
    off = await startGateway();
  });
  after(async () => {
    await gw.close();
    await off.close();
  });

  test("no admin token configured: every admin route answers 404, whatever is sent", async () => {
    for (const [method, path] of [
      ["GET", "/organizations"],
      ["POST", "/organizations"],
      ["GET", "/audit"],
      ["DELETE", "/keys/abc"],
      ["GET", "/usage/summary"],
    ] as const) {
      const res = await adminClient(off).call(method, path, method === "POST" ? { name: "x" } : undefined);
      assert.equal(res.status, 404, `${method} ${path}`);
      assert.ok(typeof res.json.detail === "string");
    }
    const doc = (await (await fetch(`${off.url}/openapi.json`)).json()) as Json;
    assert.equal(
      Object.keys(doc.paths).some((p) => p.startsWith("/admin/")),
      false,
      "not documented when disabled",
    );
  });

  test("missing, malformed and wrong tokens get 401; API keys are never accepted on /admin", async () => {
    const none = await fetch(`${gw.url}/admin/v1/organizations`);
    const noneBody = await errorBody(none, 401);
    assert.match(noneBody.detail, /Missing admin token/);
    assert.equal(none.headers.get("www-authenticate"), "Bearer");
    const malformed = await fetch(`${gw.url}/admin/v1/organizations`, { headers: { authorization: `Basic ${ADMIN_TOKEN}` } });
    assert.match((await errorBody(malformed, 401)).detail, /Bearer <admin token>/);
    const wrong = await adminClient(gw, `${ADMIN_TOKEN}x`).get("/organizations");
    assert.equal(wrong.status, 401);
    assert.equal(wrong.json.detail, "Invalid admin token.");
    const shorter = await adminClient(gw, ADMIN_TOKEN.slice(0, -1)).get("/organizations");
    assert.equal(shorter.status, 401);
    const apiKey = await adminClient(gw, gw.key).get("/organizations");
    assert.equal(apiKey.status, 401);
    assert.match(apiKey.json.detail, /API keys are not accepted by the admin API/);
    // A write with an API key changes nothing.
    const created = await adminClient(gw, gw.key).post("/organizations", { name: "sneaky" });
    assert.equal(created.status, 401);
    assert.equal(await gw.store.findOrganization("sneaky"), null);
  });

  test("the admin token is never accepted on /v1", async () => {
    for (const path of ["/v1/organization", "/v1/usage", "/v1/models"]) {
      const res = await fetch(`${gw.url}${path}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
      assert.equal((await errorBody(res, 401)).detail, "Invalid API key.", path);
    }
    const res = await fetch(`${gw.url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" },
      body: JSON.stringify(sampleRequest()),
    });
    await errorBody(res, 401);
  });

  test("the token is checked before the body: an unauthenticated bad body is a 401, not a 422", async () => {
    const res = await adminClient(gw, "nope-nope-nope-nope-nope-nope-nope-nope").post("/organizations", "{not json");
    assert.equal(res.status, 401);
  });

  test("/openapi.json documents the admin routes with their own security scheme", async () => {
    const doc = (await (await fetch(`${gw.url}/openapi.json`)).json()) as Json;
    assert.equal(doc.components.securitySchemes.admin.scheme, "bearer");
    for (const [path, method] of [
      ["/admin/v1/organizations", "get"],
      ["/admin/v1/organizations", "post"],
      ["/admin/v1/organizations/{org}", "get"],
      ["/admin/v1/organizations/{org}", "patch"],
      ["/admin/v1/organizations/{org}/keys", "post"],
      ["/admin/v1/organizations/{org}/keys", "get"],
      ["/admin/v1/keys/{key_id}", "delete"],
      ["/admin/v1/organizations/{org}/credits", "post"],
      ["/admin/v1/organizations/{org}/usage", "get"],
      ["/admin/v1/usage/summary", "get"],
      ["/admin/v1/audit", "get"],
    ]) {
      const op = doc.paths[path!]?.[method!];
      assert.ok(op, `${method} ${path}`);
      assert.deepEqual(op.security, [{ admin: [] }], `${method} ${path}`);
      assert.match(op.responses["401"].description, /admin token/);
    }
    assert.deepEqual(doc.paths["/v1/systemone"].post.security, [{ bearer: [] }]);
  });
});

describe("admin API: organizations, keys, credits, usage, audit", () => {
  let gw: Gateway;
  let admin: ReturnType<typeof adminClient>;
  before(async () => {
    gw = await startGateway({ env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN, TDS_SERVICE_MODE: "paid" } });
    admin = adminClient(gw);
  });
  after(async () => gw.close());

  test("create an organization: 201 with its status; names are unique, trimmed and checked", async () => {
    const created = await admin.post("/organizations", { name: "  Acme Corp  " });
    assert.equal(created.status, 201, created.text);
    assert.match(created.json.id, /^org_[a-z0-9]{12}$/);
    assert.equal(created.json.name, "Acme Corp");
    assert.equal(created.json.paused, false);
    assert.deepEqual(created.json.keys, { active: 0, revoked: 0 });
    assert.equal(created.json.balance.available_microusd, 0);
    assert.equal(created.json.preview.used, 0);

    const again = await admin.post("/organizations", { name: "Acme Corp" });
    assert.equal(again.status, 409);
    assert.match(again.json.detail, /already exists/);
    assert.deepEqual(again.json.errors, [{ field: "name", message: "is already in use" }]);

    for (const [body, field, message] of [
      [{ name: "   " }, "name", /must not be empty/],
      [{ name: "a\u0007b" }, "name", /control characters/],
      [{ name: "x".repeat(101) }, "name", /100/],
      [{ name: "org_abcdefabcdef" }, "name", /must not look like an organization id/],
      [{}, "name", /required/],
      [{ name: "ok", extra: 1 }, "extra", /not allowed|unknown|must NOT have additional/i],
      [{ name: 5 }, "name", /string/],
    ] as const) {
      const res = await admin.post("/organizations", body);
      assert.equal(res.status, 422, `${JSON.stringify(body)} → ${res.text}`);
      assert.ok(
        (res.json.errors as Json[]).some((e) => e.field === field && message.test(e.message)),
        `${JSON.stringify(body)}: ${res.text}`,
      );
    }
    const notJson = await admin.post("/organizations", "{");
    assert.equal(notJson.status, 422);
  });

  test("list organizations with paging; get one by id or by name; 404 for an unknown one", async () => {
    for (const name of ["Page A", "Page B", "Page C"]) assert.equal((await admin.post("/organizations", { name })).status, 201);
    const seen: string[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const res = await admin.get(`/organizations?limit=2${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
      assert.equal(res.status, 200, res.text);
      assert.ok(res.json.data.length <= 2);
      seen.push(...res.json.data.map((o: Json) => o.name));
      cursor = res.json.next_cursor;
      pages++;
    } while (cursor && pages < 20);
    const all = (await gw.store.listOrganizations()).map((o) => o.name);
    assert.deepEqual(seen, all, "every organization once, oldest first");
    assert.equal((await admin.get("/organizations?limit=0")).status, 422);
    assert.equal((await admin.get("/organizations?cursor=garbage!")).status, 422);

    const byName = await admin.get(`/organizations/${encodeURIComponent("Page B")}`);
    assert.equal(byName.status, 200);
    const byId = await admin.get(`/organizations/${byName.json.id}`);
    assert.deepEqual(byId.json, byName.json);
    const missing = await admin.get("/organizations/nobody-here");
    assert.equal(missing.status, 404);
    assert.match(missing.json.detail, /No organization with id or name "nobody-here"/);
  });

  test("keys: created once with the key, listed without it, revoked at once (also on another instance)", async () => {
    const org = (await admin.post("/organizations", { name: "Keyed" })).json;
    const created = await admin.post(`/organizations/${org.id}/keys`, { name: "backend" });
    assert.equal(created.status, 201, created.text);
    assert.equal(created.headers.get("cache-control"), "no-store");
    assert.match(created.json.key, /^tds_[a-z0-9]{12}_[A-Za-z0-9_-]{43}$/);
    const noSettings = { expires_at: null, models: null, requests_per_minute: null, budget: null };
    assert.deepEqual(created.json, {
      id: created.json.id,
      org_id: org.id,
      name: "backend",
      key: created.json.key,
      created_at: created.json.created_at,
      ...noSettings,
    });
    const unnamed = await admin.post(`/organizations/Keyed/keys`, {});
    assert.equal(unnamed.status, 201);
    assert.deepEqual(unnamed.json, {
      id: unnamed.json.id,
      org_id: org.id,
      name: null,
      key: unnamed.json.key,
      created_at: unnamed.json.created_at,
      ...noSettings,
    });
    const listedKey = (k: Json, name: string | null, lastUsedAt: string | null) => ({
      id: k.id,
      org_id: org.id,
      name,
      created_at: k.created_at,
      revoked_at: null,
      ...noSettings,
      replaced_by: null,
      retires_at: null,
      last_used_at: lastUsedAt,
    });

    const other = await startGateway({ env: { TDS_DATABASE_URL: gw.config.databaseUrl }, orgName: "second-instance-org" });
    try {
      await gw.store.grantCredits({ orgId: org.id, amountMicrousd: 1_000_000, nowMs: Date.now() });
      assert.equal(await decideWithKey(gw, created.json.key), 200, "the new key works at once");
      assert.equal(await decideWithKey(other, created.json.key), 200, "on every instance");

      await gw.app.flushKeyUse();
      await other.app.flushKeyUse();
      const listed = await admin.get(`/organizations/${org.id}/keys`);
      assert.equal(listed.status, 200);
      const lastUsedAt: string = listed.json.data[0].last_used_at;
      assert.deepEqual(listed.json.data, [listedKey(created.json, "backend", lastUsedAt), listedKey(unnamed.json, null, null)]);
      assert.ok(
        Date.parse(lastUsedAt) >= Date.parse(created.json.created_at) && Date.parse(lastUsedAt) <= Date.now(),
        `used after its creation: ${lastUsedAt}`,
      );
      const stored = (await gw.store.listApiKeys(org.id))[0]!;
      assert.ok(!listed.text.includes(stored.hash) && !listed.text.includes(created.json.key), "never the hash or the key");

      const one = await admin.get(`/keys/${created.json.id}`);
      assert.equal(one.status, 200);
      assert.deepEqual(one.json, listedKey(created.json, "backend", lastUsedAt));
      assert.equal((await admin.get("/keys/nosuchkey123")).status, 404);
      const revoked = await admin.del(`/keys/${created.json.id}`);
      assert.equal(revoked.status, 204);
      assert.equal(revoked.text, "");
      assert.equal(await decideWithKey(gw, created.json.key), 401, "revoked: 401 on the next request");
      assert.equal(await decideWithKey(other, created.json.key), 401, "on every instance");
      assert.equal((await admin.del(`/keys/${created.json.id}`)).status, 204, "revoking again is not an error");
      assert.equal((await admin.del("/keys/nosuchkey123")).status, 404);
      const after = (await admin.get(`/organizations/${org.id}/keys`)).json.data.find((k: Json) => k.id === created.json.id);
      assert.ok(after.revoked_at);
      assert.deepEqual((await admin.get(`/organizations/${org.id}`)).json.keys, { active: 1, revoked: 1 });
      assert.equal((await admin.post("/organizations/nobody/keys", {})).status, 404);
      assert.equal((await admin.post(`/organizations/${org.id}/keys`, { name: "" })).status, 422);
    } finally {
      await other.close();
    }
  });

  test("pause and resume: decision requests get 403 while paused", async () => {
    const org = (await admin.post("/organizations", { name: "Pausable" })).json;
    const key = (await admin.post(`/organizations/${org.id}/keys`, {})).json.key;
    await gw.store.grantCredits({ orgId: org.id, amountMicrousd: 1_000_000, nowMs: Date.now() });
    const paused = await admin.patch(`/organizations/${org.id}`, { paused: true });
    assert.equal(paused.status, 200);
    assert.equal(paused.json.paused, true);
    assert.equal(await decideWithKey(gw, key), 403);
    assert.equal((await admin.patch(`/organizations/${org.id}`, { paused: "yes" })).status, 422);
    assert.equal((await admin.patch(`/organizations/${org.id}`, {})).status, 422);
    const resumed = await admin.patch("/organizations/Pausable", { paused: false });
    assert.equal(resumed.json.paused, false);
    assert.equal(await decideWithKey(gw, key), 200);
  });

  test("grant credits: the new balance; amounts are exact decimal USD; bad amounts are 422", async () => {
    const org = (await admin.post("/organizations", { name: "Funded" })).json;
    const granted = await admin.post(`/organizations/${org.id}/credits`, { amount_usd: "12.50", note: "first invoice" });
    assert.equal(granted.status, 200, granted.text);
    assert.deepEqual(granted.json, {
      org_id: org.id,
      available_microusd: 12_500_000,
      available_usd: "12.5",
      reserved_microusd: 0,
      reserved_usd: "0",
      spent_microusd: 0,
      spent_usd: "0",
      granted_microusd: 12_500_000,
      granted_usd: "12.5",
    });
    const small = await admin.post(`/organizations/${org.id}/credits`, { amount_usd: "0.000001" });
    assert.equal(small.json.available_microusd, 12_500_001);
    for (const amount of ["0", "0.0", "-1", "1.1234567", "1e3", " 1", "", 12.5, "01"]) {
      const res = await admin.post(`/organizations/${org.id}/credits`, { amount_usd: amount });
      assert.equal(res.status, 422, `${JSON.stringify(amount)} → ${res.text}`);
      assert.equal(res.json.errors[0].field, "amount_usd");
      assert.match(res.json.errors[0].message, /decimal USD amount|more than 0|string|at least 1/, res.text);
    }
    assert.equal((await admin.post("/organizations/nobody/credits", { amount_usd: "1" })).status, 404);
    const ledger = await gw.store.listLedger(org.id);
    assert.deepEqual(
      ledger.map((e) => [e.kind, e.grantedDelta, e.note]),
      [
        ["grant", 12_500_000, "first invoice"],
        ["grant", 1, null],
      ],
    );
    await assertLedgerMatches(gw.store, org.id);
  });

  test("grant credits with an Idempotency-Key: a retry is applied once; another grant with the same key is 422", async () => {
    const org = (await admin.post("/organizations", { name: "Idempotent" })).json;
    const headers = { "idempotency-key": "grant-inv-1001" };
    const first = await admin.post(`/organizations/${org.id}/credits`, { amount_usd: "5" }, headers);
    assert.equal(first.status, 200);
    assert.equal(first.headers.get("idempotent-replayed"), null);
    const retry = await admin.post(`/organizations/${org.id}/credits`, { amount_usd: "5" }, headers);
    assert.equal(retry.status, 200);
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.deepEqual(retry.json, first.json);
    assert.equal((await gw.store.getBalance(org.id)).granted, 5_000_000, "granted once");
    const other = await admin.post(`/organizations/${org.id}/credits`, { amount_usd: "6" }, headers);
    assert.equal(other.status, 422);
    assert.match(other.json.detail, /already used with a different grant/);
    const bad = await admin.post(`/organizations/${org.id}/credits`, { amount_usd: "5" }, { "idempotency-key": "sp ace" });
    assert.equal(bad.status, 422);
    // Parallel retries of one grant: still once.
    const parallel = await Promise.all(
      Array.from({ length: 8 }, () =>
        admin.post(`/organizations/${org.id}/credits`, { amount_usd: "1" }, { "idempotency-key": "grant-par" }),
      ),
    );
    assert.deepEqual(
      parallel.map((r) => r.status),
      Array(8).fill(200),
    );
    assert.equal(parallel.filter((r) => r.headers.get("idempotent-replayed") === null).length, 1);
    assert.equal((await gw.store.getBalance(org.id)).granted, 6_000_000);
    assert.equal((await gw.store.listLedger(org.id)).length, 2);
  });

  test("a grant whose response is lost and is sent again with its Idempotency-Key is applied once", async () => {
    const org = (await admin.post("/organizations", { name: "Lossy" })).json;
    const proxy = await startLossyProxy(new URL(gw.url));
    try {
      const send = () =>
        fetch(`${proxy.url}/admin/v1/organizations/${org.id}/credits`, {
          method: "POST",
          headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json", "idempotency-key": "lost-1" },
          body: JSON.stringify({ amount_usd: "3.25" }),
        });
      await assert.rejects(send(), "the first response is lost");
      assert.equal(proxy.dropped(), 1);
      const retry = await send();
      assert.equal(retry.status, 200);
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(((await retry.json()) as Json).granted_microusd, 3_250_000);
      assert.equal((await gw.store.getBalance(org.id)).granted, 3_250_000, "applied once");
    } finally {
      await proxy.close();
    }
  });

  test("usage of one organization with the filters of /v1/usage, and the summary across organizations", async () => {
    const a = (await admin.post("/organizations", { name: "Usage A" })).json;
    const b = (await admin.post("/organizations", { name: "Usage B" })).json;
    for (const [org, n] of [
      [a, 3],
      [b, 1],
    ] as const) {
      await admin.post(`/organizations/${org.id}/credits`, { amount_usd: "10" });
      const key = (await admin.post(`/organizations/${org.id}/keys`, {})).json.key;
      for (let i = 0; i < n; i++) assert.equal(await decideWithKey(gw, key), 200);
    }
    const usage = await admin.get(`/organizations/${a.id}/usage?limit=2`);
    assert.equal(usage.status, 200);
    assert.equal(usage.json.data.length, 2);
    assert.ok(usage.json.next_cursor);
    const rest = await admin.get(`/organizations/${a.id}/usage?limit=2&cursor=${encodeURIComponent(usage.json.next_cursor)}`);
    assert.equal(rest.json.data.length, 1);
    assert.equal(rest.json.next_cursor, null);
    assert.equal((await admin.get(`/organizations/${a.id}/usage?outcome=model_error`)).json.data.length, 0);
    assert.equal((await admin.get(`/organizations/${a.id}/usage?outcome=nope`)).status, 422);
    assert.equal((await admin.get(`/organizations/${a.id}/usage?from=yesterday`)).status, 422);
    const requestId = usage.json.data[0].request_id;
    const record = await admin.get(`/organizations/${a.id}/usage/${requestId}`);
    assert.equal(record.status, 200);
    assert.deepEqual(record.json, usage.json.data[0]);
    assert.equal((await admin.get(`/organizations/${b.id}/usage/${requestId}`)).status, 404, "another organization's request");
    assert.equal((await admin.get(`/organizations/${a.id}/usage/req_nope`)).status, 404);

    const summary = await admin.get("/usage/summary?days=3");
    assert.equal(summary.status, 200, summary.text);
    assert.equal(summary.json.days.length, 3);
    const today = summary.json.days.at(-1);
    const records = [
      ...(await gw.store.listUsage(a.id, { limit: 200 })).records,
      ...(await gw.store.listUsage(b.id, { limit: 200 })).records,
    ];
    const byOrg = new Map<string, Json>((summary.json.organizations as Json[]).map((o) => [o.id, o]));
    const usageA = byOrg.get(a.id)!;
    const usageB = byOrg.get(b.id)!;
    assert.equal(usageA.requests, 3);
    assert.equal(usageA.name, "Usage A");
    assert.equal(usageB.requests, 1);
    assert.equal(
      usageA.cost_microusd + usageB.cost_microusd,
      records.reduce((s, r) => s + r.costMicrousd, 0),
    );
    assert.ok(today.requests >= 4);
    assert.equal((await admin.get("/usage/summary?days=0")).status, 422);
    assert.equal((await admin.get("/usage/summary?days=32")).status, 422);
  });

  test("the audit log: every change with its time, action, target, source, client and address, newest first", async () => {
    const client = { "x-tds-client": "console" };
    const org = (await admin.call("POST", "/organizations", { name: "Audited" }, client)).json;
    const key = (await admin.call("POST", `/organizations/${org.id}/keys`, { name: "k1" }, client)).json;
    await admin.call("POST", `/organizations/${org.id}/credits`, { amount_usd: "2.5", note: "trial" }, client);
    await admin.call("PATCH", `/organizations/${org.id}`, { paused: true }, client);
    await admin.call("PATCH", `/organizations/${org.id}`, { paused: true }, client); // no change: not recorded
    await admin.call("PATCH", `/organizations/${org.id}`, { paused: false }, client);
    await admin.call("DELETE", `/keys/${key.id}`, undefined, client);
    await admin.call("DELETE", `/keys/${key.id}`, undefined, client); // already revoked: not recorded

    const audit = await admin.get(`/audit?org=${org.id}`);
    assert.equal(audit.status, 200, audit.text);
    assert.deepEqual(
      audit.json.data.map((e: Json) => [e.action, e.target]),
      [
        ["key.revoked", key.id],
        ["organization.resumed", org.id],
        ["organization.paused", org.id],
        ["credits.granted", org.id],
        ["key.created", key.id],
        ["organization.created", org.id],
      ],
    );
    for (const e of audit.json.data as Json[]) {
      assert.equal(e.org_id, org.id);
      assert.equal(e.org_name, "Audited");
      assert.equal(e.source, "http");
      assert.equal(e.client, "console");
      assert.equal(e.remote_address, "127.0.0.1");
      assert.ok(Math.abs(Date.parse(e.at) - Date.now()) < 60_000);
    }
    const byAction = new Map((audit.json.data as Json[]).map((e) => [e.action, e.details]));
    assert.deepEqual(byAction.get("organization.created"), { name: "Audited" });
    assert.deepEqual(byAction.get("key.created"), { name: "k1" });
    assert.deepEqual(byAction.get("credits.granted"), { amount_microusd: 2_500_000, note: "trial" });
    assert.ok(!audit.text.includes(key.key), "never the key");

    const ids = (audit.json.data as Json[]).map((e) => e.id);
    assert.deepEqual(
      [...ids].sort((x, y) => y - x),
      ids,
      "newest first",
    );
    const page1 = await admin.get(`/audit?org=Audited&limit=4`);
    const page2 = await admin.get(`/audit?org=Audited&limit=4&cursor=${encodeURIComponent(page1.json.next_cursor)}`);
    assert.deepEqual(
      [...page1.json.data, ...page2.json.data].map((e: Json) => e.id),
      ids,
    );
    assert.equal(page2.json.next_cursor, null);
    const everything = await admin.get("/audit?limit=200");
    assert.ok(everything.json.data.length > ids.length, "without org: every organization's entries");
    assert.equal((await admin.get("/audit?org=nobody")).status, 404);
  });
});
