/**
 * An empty body with a JSON Content-Type (many HTTP clients send that header on every request): no body where the
 * route takes none (a DELETE of the admin API, an unknown path), "Request body is empty" where the route needs one.
 * Through a real listening gateway, with the exact headers written by node:http.
 */
import assert from "node:assert/strict";
import { request as httpRequest } from "node:http";
import { after, before, describe, test } from "node:test";
import { assertShape } from "../support/contract-check.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const ADMIN_TOKEN = "adm-3Hq8pVz2Lr6Tx1Kw9Nc4Hs7Bd5Fg0Jm";
const EMPTY = "Request body is empty; send a JSON object.";

interface Sent {
  method: string;
  path: string;
  headers: Record<string, string>;
  /** Written as is, with its Content-Length unless `chunked`. */
  body?: string;
  chunked?: boolean;
}

function send(gw: Gateway, s: Sent): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${gw.url}${s.path}`, { method: s.method, headers: s.headers }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode!, text }));
    });
    req.on("error", reject);
    if (s.chunked) req.setHeader("transfer-encoding", "chunked");
    else if (s.body !== undefined) req.setHeader("content-length", String(Buffer.byteLength(s.body)));
    req.end(s.body ?? "");
  });
}

describe("an empty body with a JSON Content-Type", () => {
  let gw: Gateway;
  const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };
  before(async () => {
    gw = await startGateway({ env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN } });
  });
  after(async () => gw.close());

  async function newKeyId(): Promise<string> {
    const res = await send(gw, {
      method: "POST",
      path: `/admin/v1/organizations/${gw.orgId}/keys`,
      headers: { ...admin, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(res.status, 201, res.text);
    return (JSON.parse(res.text) as { id: string }).id;
  }

  test("DELETE /admin/v1/keys/{id}: revoked (204), whatever the empty body's framing", async () => {
    const framings: Array<{ name: string; headers: Record<string, string>; chunked?: boolean; contentType?: string }> = [
      { name: "Content-Length: 0", headers: { "content-length": "0" } },
      { name: "chunked, no chunk", headers: {}, chunked: true },
      { name: "charset in the Content-Type", headers: { "content-length": "0" }, contentType: "application/json; charset=utf-8" },
    ];
    for (const framing of framings) {
      const id = await newKeyId();
      const res = await send(gw, {
        method: "DELETE",
        path: `/admin/v1/keys/${id}`,
        headers: { ...admin, "content-type": framing.contentType ?? "application/json", ...framing.headers },
        chunked: framing.chunked ?? false,
      });
      assert.equal(res.status, 204, `${framing.name}: ${res.text}`);
      assert.equal(res.text, "");
      const key = await send(gw, { method: "GET", path: `/admin/v1/keys/${id}`, headers: admin });
      assert.notEqual((JSON.parse(key.text) as { revoked_at: string | null }).revoked_at, null, `${framing.name}: revoked`);
    }
  });

  test("a body sent to a route that takes none is still read as JSON: {} is accepted, broken JSON is not", async () => {
    const ok = await send(gw, {
      method: "DELETE",
      path: `/admin/v1/keys/${await newKeyId()}`,
      headers: { ...admin, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(ok.status, 204, ok.text);
    const broken = await send(gw, {
      method: "DELETE",
      path: `/admin/v1/keys/${await newKeyId()}`,
      headers: { ...admin, "content-type": "application/json" },
      body: "{",
    });
    assert.equal(broken.status, 422);
    assert.match((JSON.parse(broken.text) as { detail: string }).detail, /not valid JSON/);
  });

  test("an unknown path: 404, not a complaint about the body", async () => {
    const res = await send(gw, {
      method: "POST",
      path: "/v1/nothing-here",
      headers: { "content-type": "application/json", "content-length": "0" },
    });
    assert.equal(res.status, 404, res.text);
    assertShape("error", JSON.parse(res.text));
  });

  test("routes that need a body still say it is empty (422)", async () => {
    for (const s of [
      { method: "POST", path: "/v1/systemone", headers: { authorization: `Bearer ${gw.key}` } },
      { method: "POST", path: "/admin/v1/organizations", headers: admin },
      { method: "PATCH", path: `/admin/v1/organizations/${gw.orgId}`, headers: admin },
      { method: "POST", path: `/admin/v1/organizations/${gw.orgId}/keys`, headers: admin },
    ]) {
      for (const chunked of [false, true]) {
        const res = await send(gw, {
          ...s,
          headers: { ...s.headers, "content-type": "application/json", ...(chunked ? {} : { "content-length": "0" }) },
          chunked,
        });
        assert.equal(res.status, 422, `${s.method} ${s.path}: ${res.text}`);
        const body = JSON.parse(res.text) as { detail: string };
        assertShape("error", body);
        assert.equal(body.detail, EMPTY, `${s.method} ${s.path}`);
      }
    }
  });
});
