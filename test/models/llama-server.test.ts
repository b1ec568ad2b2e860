import assert from "node:assert/strict";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { generateApiKey, newOrganizationId } from "../../src/gateway/api-keys.ts";
import { openStore } from "../../src/store/open-store.ts";
import { makeModelDir, type ModelDir } from "../fixtures/gguf/tiny-model.ts";
import { json } from "../support/contract-check.ts";
import { sampleRequest } from "../support/gateway-harness.ts";
import { startGatewayProcess, type GatewayProcess } from "../support/gateway-process.ts";

async function keyFor(databaseUrl: string): Promise<string> {
  const store = await openStore(databaseUrl);
  const org = await store.createOrganization({ id: newOrganizationId(), name: "engine-org", nowMs: Date.now() });
  const key = generateApiKey();
  await store.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: Date.now() });
  await store.close();
  return key.raw;
}

describe("the embedded engine configured by TDS_MODEL_PATH, in a real server process", () => {
  let models: ModelDir;
  const started: GatewayProcess[] = [];
  before(() => {
    models = makeModelDir();
  });
  after(async () => {
    await Promise.all(started.map((g) => g.stop()));
    models.cleanup();
  });

  test("a local GGUF file: the model is listed with its context and answers all three types", async () => {
    const db = `sqlite:${join(models.dir, "ok.sqlite")}`;
    const key = await keyFor(db);
    const gw = await startGatewayProcess({ TDS_DATABASE_URL: db, TDS_MODEL_PATH: models.model("tiny"), TDS_MODEL_NAME: "tiny-local" });
    started.push(gw);
    const auth = { authorization: `Bearer ${key}` };
    let listed: { models: Array<{ name: string; context?: { max_state: number; max_branch: number } }> } | null = null;
    for (let i = 0; i < 50 && !listed; i++) {
      const res = await fetch(`${gw.url}/v1/models`, { headers: auth });
      if (res.status === 200) listed = await json(res);
      else await new Promise((r) => setTimeout(r, 100));
    }
    assert.ok(listed, "the model becomes ready");
    assert.equal(listed.models[0]!.name, "tiny-local");
    assert.ok(listed.models[0]!.context!.max_state >= 1);
    for (const model of ["tiny-local", "jev-latest", null]) {
      const res = await fetch(`${gw.url}/v1/systemone`, {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body: JSON.stringify({ ...sampleRequest(), model }),
      });
      const body = await json(res);
      assert.equal(res.status, 200, JSON.stringify(body));
      assert.equal(body.model, "tiny-local");
      assert.deepEqual(Object.keys(body.answers).sort(), ["refund", "topic", "urgency"]);
    }
  });

  test("a model that cannot be had: the server still starts, logs one clear message and answers 503 naming the setting, never the path", async () => {
    const db = `sqlite:${join(models.dir, "missing.sqlite")}`;
    const key = await keyFor(db);
    const missing = join(models.dir, "no-such-model.gguf");
    const gw = await startGatewayProcess({ TDS_DATABASE_URL: db, TDS_MODEL_PATH: missing, TDS_MODEL_NAME: "local-engine" });
    started.push(gw);
    const auth = { authorization: `Bearer ${key}` };
    const bodies: string[] = [];
    let detail = "";
    for (let i = 0; i < 50; i++) {
      const res = await fetch(`${gw.url}/v1/models`, { headers: auth });
      assert.equal(res.status, 503);
      const text = await res.text();
      bodies.push(text);
      detail = JSON.parse(text).detail;
      if (/failed to load/.test(detail)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.match(detail, /failed to load: no model file at the configured path; set TDS_MODEL_PATH to a local GGUF file/);
    const decision = await fetch(`${gw.url}/v1/systemone`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: JSON.stringify(sampleRequest()),
    });
    assert.equal(decision.status, 503);
    const decisionText = await decision.text();
    bodies.push(decisionText);
    assert.match(JSON.parse(decisionText).detail, /TDS_MODEL_PATH/);
    const ready = await fetch(`${gw.url}/readyz`);
    assert.equal(ready.status, 503);
    const readyText = await ready.text();
    bodies.push(readyText);
    assert.match(readyText, /no model file at the configured path/);
    for (const body of bodies) {
      for (const shown of [models.dir, tmpdir(), "no-such-model", ".gguf"]) assert.ok(!body.includes(shown), `an API body shows ${shown}: ${body}`);
    }
    const errors = gw.lines.filter((l) => l.includes('"level":50') && l.includes("failed to load"));
    assert.equal(errors.length, 1, "one clear message in the log");
    assert.ok(errors[0]!.includes(missing), "the log names the path");
    assert.equal(gw.child.exitCode, null, "never crashes");
  });
});
