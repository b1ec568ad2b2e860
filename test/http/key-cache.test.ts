/**
 * TDS_KEY_CACHE_MS through real gateway processes (src/server.ts) on one SQLite file, one after the other, beside a
 * store of the test's own on the same file (as the tds command or another instance would be): with the default (0) a
 * key revoked there is refused at the next request; with 60 s it is still served, while a key revoked through the
 * gateway's own admin API is refused at once.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import { openStore } from "../../src/store/open-store.ts";
import type { Store } from "../../src/store/store.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { sampleRequest } from "../support/gateway-harness.ts";
import { type GatewayProcess, startGatewayProcess } from "../support/gateway-process.ts";

const ADMIN_TOKEN = "adm-keycache-4Hq9Tz2Wm7Lx5Rv8Pc3Nb6Js";

async function decide(url: string, key: string): Promise<number> {
  const res = await fetch(`${url}/v1/systemone`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(sampleRequest()),
  });
  await res.arrayBuffer();
  return res.status;
}

describe("TDS_KEY_CACHE_MS in a gateway process", () => {
  let dir: string;
  let fake: FakeModelServer;
  let store: Store;
  let orgId: string;
  let env: Record<string, string>;
  let gateway: GatewayProcess | undefined;

  const newKey = async () => {
    const key = generateApiKey();
    await store.createApiKey({ id: key.id, orgId, name: null, hash: key.hash, nowMs: Date.now() });
    return key;
  };

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "tds-key-cache-"));
    fake = await startFakeModelServer();
    const url = `sqlite:${join(dir, "gateway.sqlite")}`;
    store = await openStore(url);
    orgId = (await store.createOrganization({ id: newOrganizationId(), name: "cached-keys", nowMs: Date.now() })).id;
    env = { TDS_DATABASE_URL: url, TDS_MODEL_SERVICE_URL: fake.url, TDS_ADMIN_TOKEN: ADMIN_TOKEN };
  });
  after(async () => {
    await gateway?.stop();
    await store.close();
    await fake.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("by default (0) reads the key for every request: a key revoked on the database is refused at the next one", async () => {
    gateway = await startGatewayProcess(env);
    try {
      const key = await newKey();
      assert.equal(await decide(gateway.url, key.raw), 200);
      assert.equal(await store.revokeApiKey(key.id, Date.now()), true);
      assert.equal(await decide(gateway.url, key.raw), 401);
    } finally {
      await gateway.stop();
      gateway = undefined;
    }
  });

  it("with 60 s keeps a key it read: revoked on the database it is still served; revoked through this gateway, refused at once", async () => {
    gateway = await startGatewayProcess({ ...env, TDS_KEY_CACHE_MS: "60000" });
    try {
      const [elsewhere, here] = [await newKey(), await newKey()];
      assert.equal(await decide(gateway.url, elsewhere.raw), 200);
      assert.equal(await decide(gateway.url, here.raw), 200);

      assert.equal(await store.revokeApiKey(elsewhere.id, Date.now()), true);
      assert.equal(await decide(gateway.url, elsewhere.raw), 200, "kept for up to 60 s: not read again");

      const revoked = await fetch(`${gateway.url}/admin/v1/keys/${here.id}`, {
        method: "DELETE",
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
      });
      assert.equal(revoked.status, 204);
      assert.equal(await decide(gateway.url, here.raw), 401, "a revocation through this gateway applies at once");
      assert.equal(await decide(gateway.url, elsewhere.raw), 401, "and every kept key is read again after it");
    } finally {
      await gateway.stop();
      gateway = undefined;
    }
  });
});
