/**
 * A key's own limits through the admin API of a real listening gateway: set at creation, shown in the list and by
 * id, changed and cleared with PATCH, checked beyond the schema (422 with field errors, nothing changed), rotation
 * (201 with a working new key; the old one shown as replaced), the audit entries, the 404 and 409 cases, and the
 * organization's count of the keys that work.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const ADMIN_TOKEN = "adm-keysettings-3Fq8Lp2Wz7Xc1Vb6Nm4Hk9Jd";
const ORG_RPM = 600;

interface Json {
  [key: string]: any;
}

describe("admin API: a key's own limits and its rotation", () => {
  let gw: Gateway;
  let fake: FakeModelServer;
  let dir: string;
  let orgId: string;

  const call = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${gw.url}/admin/v1${path}`, {
      method,
      headers: {
        authorization: `Bearer ${ADMIN_TOKEN}`,
        "x-tds-client": "key-test",
        ...(body === undefined ? {} : { "content-type": "application/json" }),
      },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await res.text();
    return { status: res.status, headers: res.headers, text, json: (text ? JSON.parse(text) : null) as Json };
  };
  const future = (days: number) => new Date(Date.now() + days * 86_400_000).toISOString();
  const keysOf = async () => (await call("GET", `/organizations/${orgId}/keys`)).json.data as Json[];
  const auditOf = async () => (await call("GET", `/audit?org=${orgId}`)).json.data as Json[];

  before(async () => {
    fake = await startFakeModelServer();
    dir = mkdtempSync(join(tmpdir(), "tds-key-settings-"));
    const config = join(dir, "config.json");
    writeFileSync(
      config,
      JSON.stringify({
        model_services: [{ name: "a", url: fake.url }],
        models: [
          { name: "decider", deployments: [{ service: "a", upstream_name: "fake-small" }] },
          { name: "helper", deployments: [{ service: "a", upstream_name: "fake-large" }] },
        ],
      }),
      { mode: 0o600 },
    );
    gw = await startGateway({
      fake: false,
      env: { TDS_CONFIG: config, TDS_ADMIN_TOKEN: ADMIN_TOKEN, TDS_REQUESTS_PER_MINUTE: String(ORG_RPM) },
    });
    const org = await call("POST", "/organizations", { name: "Keyed" });
    assert.equal(org.status, 201, org.text);
    orgId = org.json.id;
  });
  after(async () => {
    await gw?.close();
    await fake?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("create with every setting: answered with the key once, then shown in the list and by id", async () => {
    const expiresAt = future(30);
    const created = await call("POST", `/organizations/${orgId}/keys`, {
      name: "ci",
      expires_at: expiresAt,
      models: ["decider"],
      requests_per_minute: 30,
      budget: { usd: "12.50", period: "month" },
    });
    assert.equal(created.status, 201, created.text);
    assert.equal(created.headers.get("cache-control"), "no-store");
    assert.match(created.json.key, /^tds_/);
    assert.deepEqual(
      { ...created.json, id: undefined, key: undefined, created_at: undefined },
      {
        id: undefined,
        key: undefined,
        created_at: undefined,
        org_id: orgId,
        name: "ci",
        expires_at: expiresAt,
        models: ["decider"],
        requests_per_minute: 30,
        budget: { usd: "12.5", period: "month" },
      },
    );
    const shown = await call("GET", `/keys/${created.json.id}`);
    assert.equal(shown.status, 200, shown.text);
    assert.deepEqual(shown.json, {
      id: created.json.id,
      org_id: orgId,
      name: "ci",
      created_at: created.json.created_at,
      revoked_at: null,
      expires_at: expiresAt,
      models: ["decider"],
      requests_per_minute: 30,
      budget: { usd: "12.5", period: "month" },
      replaced_by: null,
      retires_at: null,
      last_used_at: null,
    });
    assert.ok(!shown.text.includes(created.json.key), "never the key again");
    const listed = (await keysOf()).find((k) => k.id === created.json.id);
    assert.deepEqual(listed, shown.json);

    const plain = await call("POST", `/organizations/${orgId}/keys`, {});
    assert.equal(plain.status, 201, plain.text);
    assert.deepEqual(
      [plain.json.expires_at, plain.json.models, plain.json.requests_per_minute, plain.json.budget],
      [null, null, null, null],
    );
    const entry = (await auditOf()).find((e) => e.action === "key.created" && e.target === created.json.id);
    assert.deepEqual(entry?.details, {
      name: "ci",
      expires_at: expiresAt,
      models: '["decider"]',
      requests_per_minute: 30,
      budget_microusd: 12_500_000,
      budget_period: "month",
    });
  });

  test("PATCH changes what is given, keeps what is absent, and null clears; audited with the changed fields", async () => {
    const created = await call("POST", `/organizations/${orgId}/keys`, { name: "app", models: ["decider"], requests_per_minute: 10 });
    const id = created.json.id as string;
    const changed = await call("PATCH", `/keys/${id}`, { requests_per_minute: 20, budget: { usd: "5", period: "day" } });
    assert.equal(changed.status, 200, changed.text);
    assert.equal(changed.json.requests_per_minute, 20);
    assert.deepEqual(changed.json.models, ["decider"], "absent: kept");
    assert.deepEqual(changed.json.budget, { usd: "5", period: "day" });
    assert.equal(changed.json.name, "app");

    const cleared = await call("PATCH", `/keys/${id}`, { name: null, models: null, requests_per_minute: null, budget: null });
    assert.equal(cleared.status, 200, cleared.text);
    assert.deepEqual(
      [cleared.json.name, cleared.json.models, cleared.json.requests_per_minute, cleared.json.budget],
      [null, null, null, null],
    );
    assert.deepEqual((await call("GET", `/keys/${id}`)).json, cleared.json);

    const updates = (await auditOf()).filter((e) => e.action === "key.updated" && e.target === id);
    assert.deepEqual(
      updates.map((e) => e.details),
      [
        { name: null, models: null, requests_per_minute: null, budget_microusd: null, budget_period: null },
        { requests_per_minute: 20, budget_microusd: 5_000_000, budget_period: "day" },
      ],
      "newest first, only the fields changed",
    );
    assert.ok(updates.every((e) => e.source === "http" && e.client === "key-test"));
    assert.equal((await call("PATCH", `/keys/${id}`, {})).status, 422, "an empty change");
  });

  test("settings the schema allows but the service does not: 422 with field errors, nothing changed", async () => {
    const created = await call("POST", `/organizations/${orgId}/keys`, { name: "strict", requests_per_minute: 5 });
    const id = created.json.id as string;
    const before = (await call("GET", `/keys/${id}`)).json;
    const auditBefore = (await auditOf()).length;
    const keysBefore = (await keysOf()).length;
    const cases: [Json, string, RegExp][] = [
      [{ budget: { usd: "1.0000001", period: "day" } }, "budget.usd", /at most 6 decimals/],
      [{ budget: { usd: "-1", period: "day" } }, "budget.usd", /decimal USD/],
      [{ budget: { usd: " 1", period: "day" } }, "budget.usd", /decimal USD/],
      [{ expires_at: new Date(Date.now() - 60_000).toISOString() }, "expires_at", /in the future/],
      // Dates Date.parse would take, as another day.
      [{ expires_at: "2030-02-30T00:00:00Z" }, "expires_at", /RFC 3339/],
      [{ expires_at: "2030-04-31T12:00:00Z" }, "expires_at", /RFC 3339/],
      [{ expires_at: "2030-01-01T24:00:00Z" }, "expires_at", /RFC 3339/],
      [{ expires_at: "2030-01-01T12:60:00Z" }, "expires_at", /RFC 3339/],
      [{ expires_at: "2030-01-01T12:00:00+24:00" }, "expires_at", /RFC 3339/],
      [{ models: ["decider", "nope"] }, "models[1]", /unknown model "nope"/],
      [
        { requests_per_minute: ORG_RPM + 1 },
        "requests_per_minute",
        new RegExp(`at most ${ORG_RPM}, the organization's requests_per_minute`),
      ],
    ];
    for (const [body, field, message] of cases) {
      for (const res of [await call("PATCH", `/keys/${id}`, body), await call("POST", `/organizations/${orgId}/keys`, body)]) {
        assert.equal(res.status, 422, `${JSON.stringify(body)} → ${res.text}`);
        assert.ok(
          (res.json.errors as Json[]).some((e) => e.field === field && message.test(e.message)),
          `${JSON.stringify(body)}: ${res.text}`,
        );
      }
    }
    const both = await call("PATCH", `/keys/${id}`, { requests_per_minute: ORG_RPM + 1, models: ["nope"] });
    assert.deepEqual(
      (both.json.errors as Json[]).map((e) => e.field),
      ["models[0]", "requests_per_minute"],
      "every problem at once",
    );
    for (const body of [{ budget: { usd: "1", period: "week" } }, { models: [] }, { requests_per_minute: 0 }, { expires_at: "tomorrow" }]) {
      assert.equal((await call("PATCH", `/keys/${id}`, body)).status, 422, JSON.stringify(body));
    }
    assert.deepEqual((await call("GET", `/keys/${id}`)).json, before, "nothing changed");
    assert.equal((await auditOf()).length, auditBefore, "nothing recorded");
    assert.equal((await keysOf()).length, keysBefore, "no key created");
    assert.equal(
      (await call("POST", `/organizations/${orgId}/keys`, { requests_per_minute: ORG_RPM })).status,
      201,
      "the organization's own limit is allowed",
    );
  });

  test("rotate: 201 with a new working key and the same settings; the old key shown as replaced; audited", async () => {
    const expiresAt = future(10);
    const created = await call("POST", `/organizations/${orgId}/keys`, {
      name: "rotating",
      expires_at: expiresAt,
      models: ["helper"],
      budget: { usd: "3", period: "day" },
    });
    const oldId = created.json.id as string;
    const t0 = Date.now();
    const rotated = await call("POST", `/keys/${oldId}/rotate`, { grace_seconds: 3600 });
    assert.equal(rotated.status, 201, rotated.text);
    assert.equal(rotated.headers.get("cache-control"), "no-store");
    assert.notEqual(rotated.json.id, oldId);
    assert.equal(rotated.json.replaces, oldId);
    assert.match(rotated.json.key, /^tds_/);
    assert.deepEqual(
      [
        rotated.json.org_id,
        rotated.json.name,
        rotated.json.expires_at,
        rotated.json.models,
        rotated.json.requests_per_minute,
        rotated.json.budget,
      ],
      [orgId, "rotating", expiresAt, ["helper"], null, { usd: "3", period: "day" }],
    );
    const retiresAt = Date.parse(rotated.json.old_key_retires_at);
    assert.ok(retiresAt >= t0 + 3_600_000 - 1000 && retiresAt <= Date.now() + 3_600_000, rotated.json.old_key_retires_at);

    const org = await fetch(`${gw.url}/v1/organization`, { headers: { authorization: `Bearer ${rotated.json.key}` } });
    assert.equal(org.status, 200, "the new key works");
    const old = (await call("GET", `/keys/${oldId}`)).json;
    assert.equal(old.replaced_by, rotated.json.id);
    assert.equal(old.retires_at, rotated.json.old_key_retires_at);
    assert.equal(old.revoked_at, null);
    const listed = await keysOf();
    assert.ok(listed.some((k) => k.id === oldId && k.replaced_by === rotated.json.id));
    assert.ok(listed.some((k) => k.id === rotated.json.id && k.replaced_by === null));

    const audit = await auditOf();
    const entry = audit.find((e) => e.action === "key.rotated" && e.target === oldId);
    assert.deepEqual(entry?.details, { name: "rotating", new_key_id: rotated.json.id, retires_at: rotated.json.old_key_retires_at });
    const createdEntry = audit.find((e) => e.action === "key.created" && e.target === rotated.json.id);
    assert.deepEqual(createdEntry?.details, {
      name: "rotating",
      rotated_from: oldId,
      expires_at: expiresAt,
      models: '["helper"]',
      budget_microusd: 3_000_000,
      budget_period: "day",
    });
    assert.deepEqual(
      [createdEntry.at, createdEntry.source, createdEntry.client, createdEntry.org_id],
      [entry?.at, "http", "key-test", orgId],
      "written with the rotation",
    );
    assert.ok(!JSON.stringify(await auditOf()).includes(rotated.json.key), "never the key");

    const again = await call("POST", `/keys/${oldId}/rotate`, {});
    assert.equal(again.status, 409, again.text);
    assert.match(again.json.detail, /already rotated/);
  });

  test("rotate without a body: one day of grace", async () => {
    const created = await call("POST", `/organizations/${orgId}/keys`, { name: "no-body" });
    const res = await fetch(`${gw.url}/admin/v1/keys/${created.json.id}/rotate`, {
      method: "POST",
      headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
    });
    const body = (await res.json()) as Json;
    assert.equal(res.status, 201, JSON.stringify(body));
    const grace = Date.parse(body.old_key_retires_at) - Date.parse(body.created_at);
    assert.equal(grace, 86_400_000);
    assert.equal((await call("POST", `/keys/${body.id}/rotate`, { grace_seconds: 2_592_001 })).status, 422, "at most 30 days");
  });

  test("404 for an unknown key; 409 to change or rotate a revoked key", async () => {
    assert.equal((await call("PATCH", "/keys/nosuchkey", { requests_per_minute: 1 })).status, 404);
    assert.equal((await call("POST", "/keys/nosuchkey/rotate", {})).status, 404);
    const created = await call("POST", `/organizations/${orgId}/keys`, { name: "gone" });
    assert.equal((await call("DELETE", `/keys/${created.json.id}`)).status, 204);
    const patched = await call("PATCH", `/keys/${created.json.id}`, { requests_per_minute: 1 });
    assert.equal(patched.status, 409, patched.text);
    assert.match(patched.json.detail, /revoked/);
    const rotated = await call("POST", `/keys/${created.json.id}/rotate`, {});
    assert.equal(rotated.status, 409, rotated.text);
    assert.match(rotated.json.detail, /revoked/);
    assert.equal((await keysOf()).filter((k) => k.name === "gone").length, 1, "no new key");
  });

  test("409 to change a rotated key (its replacement is changed instead); a rotated key can still be revoked", async () => {
    const created = await call("POST", `/organizations/${orgId}/keys`, { name: "replaced", requests_per_minute: 7 });
    const oldId = created.json.id as string;
    const rotated = await call("POST", `/keys/${oldId}/rotate`, { grace_seconds: 3600 });
    assert.equal(rotated.status, 201, rotated.text);
    const auditBefore = (await auditOf()).length;
    const before = (await call("GET", `/keys/${oldId}`)).json;
    const patched = await call("PATCH", `/keys/${oldId}`, { requests_per_minute: 3 });
    assert.equal(patched.status, 409, patched.text);
    assert.match(patched.json.detail, new RegExp(`was rotated \\(replaced by ${rotated.json.id}\\); it cannot be changed`));
    assert.deepEqual((await call("GET", `/keys/${oldId}`)).json, before, "nothing changed");
    assert.equal((await auditOf()).length, auditBefore, "nothing recorded");
    const onNew = await call("PATCH", `/keys/${rotated.json.id}`, { requests_per_minute: 3 });
    assert.equal(onNew.status, 200, onNew.text);
    assert.equal((await call("DELETE", `/keys/${oldId}`)).status, 204, "revoking a rotated key ends its grace");
  });

  test("409 to rotate an expired key: no new key, nothing recorded; a later expiry makes it rotatable", async () => {
    const expiresAt = new Date(Date.now() + 1500).toISOString();
    const created = await call("POST", `/organizations/${orgId}/keys`, { name: "expiring", expires_at: expiresAt });
    assert.equal(created.status, 201, created.text);
    const id = created.json.id as string;
    while (Date.now() <= Date.parse(expiresAt) + 50) await new Promise((r) => setTimeout(r, 100));
    const auditBefore = (await auditOf()).length;
    const rotated = await call("POST", `/keys/${id}/rotate`, {});
    assert.equal(rotated.status, 409, rotated.text);
    assert.match(rotated.json.detail, /has expired; it cannot be rotated/);
    assert.equal((await call("GET", `/keys/${id}`)).json.replaced_by, null);
    assert.equal((await keysOf()).filter((k) => k.name === "expiring").length, 1, "no new key");
    assert.equal((await auditOf()).length, auditBefore, "nothing recorded");

    const extended = await call("PATCH", `/keys/${id}`, { expires_at: future(5) });
    assert.equal(extended.status, 200, extended.text);
    assert.equal((await call("POST", `/keys/${id}/rotate`, {})).status, 201);
  });

  test("an expiry with an offset and a fraction is taken as the instant it names", async () => {
    const year = new Date().getUTCFullYear() + 2;
    const created = await call("POST", `/organizations/${orgId}/keys`, { expires_at: `${year}-03-01T05:30:00.1239+05:30` });
    assert.equal(created.status, 201, created.text);
    assert.equal(created.json.expires_at, `${year}-03-01T00:00:00.123Z`);
    const leap = await call("PATCH", `/keys/${created.json.id}`, { expires_at: "2032-02-29T23:59:59z" });
    assert.equal(leap.status, 200, leap.text);
    assert.equal(leap.json.expires_at, "2032-02-29T23:59:59.000Z");
  });

  test("an organization's active keys are those that work now: not expired, retired or revoked", async () => {
    const org = await call("POST", "/organizations", { name: "Counted" });
    const id = org.json.id as string;
    const make = async (body: Json) => (await call("POST", `/organizations/${id}/keys`, body)).json.id as string;
    const expiresAt = new Date(Date.now() + 1500).toISOString();
    await make({ name: "active" });
    await make({ name: "expired", expires_at: expiresAt });
    assert.equal((await call("POST", `/keys/${await make({ name: "retired" })}/rotate`, { grace_seconds: 0 })).status, 201);
    assert.equal((await call("POST", `/keys/${await make({ name: "in grace" })}/rotate`, { grace_seconds: 3600 })).status, 201);
    assert.equal((await call("DELETE", `/keys/${await make({ name: "revoked" })}`)).status, 204);
    while (Date.now() <= Date.parse(expiresAt) + 50) await new Promise((r) => setTimeout(r, 100));
    // active, "in grace" (rotated) and the two new keys work; "expired", "retired" and "revoked" do not.
    const shown = await call("GET", `/organizations/${id}`);
    assert.equal(shown.status, 200, shown.text);
    assert.deepEqual(shown.json.keys, { active: 4, revoked: 1 });
    const listed = (await call("GET", "/organizations?limit=200")).json.data.find((o: Json) => o.id === id);
    assert.deepEqual(listed?.keys, { active: 4, revoked: 1 });
  });
});
