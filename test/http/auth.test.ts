import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { errorBody } from "../support/contract-check.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";

describe("API keys", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway();
  });
  after(async () => gw.close());

  const post = (authorization?: string) =>
    fetch(`${gw.url}/v1/systemone`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(authorization ? { authorization } : {}) },
      body: JSON.stringify(sampleRequest()),
    });

  test("missing, malformed, unknown and tampered keys are 401 with WWW-Authenticate: Bearer", async () => {
    const tampered = gw.key.slice(0, -1) + (gw.key.endsWith("A") ? "B" : "A");
    for (const auth of [undefined, "Basic abc", "Bearer", "Bearer nope", `Bearer ${tampered}`, `bearer ${gw.key}x`]) {
      const res = await post(auth);
      const body = await errorBody(res, 401);
      assert.equal(res.headers.get("www-authenticate"), "Bearer", String(auth));
      assert.ok(!body.detail.includes(gw.key));
      assert.ok(res.headers.get("x-service-request-id"));
    }
    for (const path of ["/v1/models"]) {
      const res = await fetch(`${gw.url}${path}`);
      await errorBody(res, 401);
    }
  });

  test("the scheme is case-insensitive and the key works on both endpoints", async () => {
    assert.equal((await post(`bearer ${gw.key}`)).status, 200);
    assert.equal((await gw.get("/v1/models")).status, 200);
  });

  test("a revoked key is 401; another key of the same org keeps working", async () => {
    const other = await gw.newOrg("revocation-org");
    const { generateApiKey } = await import("../../src/domain/api-keys.ts");
    const second = generateApiKey();
    await gw.store.createApiKey({ id: second.id, orgId: other.orgId, name: null, hash: second.hash, nowMs: Date.now() });
    assert.equal((await post(`Bearer ${other.key}`)).status, 200);
    assert.equal(await gw.store.revokeApiKey(other.keyId, Date.now()), true);
    const body = await errorBody(await post(`Bearer ${other.key}`), 401);
    assert.match(body.detail, /revoked/);
    assert.equal((await post(`Bearer ${second.raw}`)).status, 200);
  });

  test("a paused organization gets 403 on decisions, before its body is read, and nothing is recorded", async () => {
    const paused = await gw.newOrg("paused-org");
    await gw.store.setOrganizationPaused(paused.orgId, true);
    const res = await fetch(`${gw.url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${paused.key}`, "content-type": "application/json" },
      body: "not even json",
    });
    const body = await errorBody(res, 403);
    assert.match(body.detail, /paused/);
    assert.equal((await gw.store.listUsage(paused.orgId, { limit: 10 })).records.length, 0);
    await gw.store.setOrganizationPaused(paused.orgId, false);
    const again = await fetch(`${gw.url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${paused.key}`, "content-type": "application/json" },
      body: JSON.stringify(sampleRequest()),
    });
    assert.equal(again.status, 200);
  });
});
