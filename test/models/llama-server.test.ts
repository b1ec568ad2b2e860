import assert from "node:assert/strict";
import { copyFileSync, renameSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import { ENGINE_NOT_INSTALLED } from "../../src/models/llama/engine-absent.ts";
import { openStore } from "../../src/store/open-store.ts";
import { type ModelDir, makeModelDir } from "../fixtures/gguf/tiny-model.ts";
import { json } from "../support/contract-check.ts";
import { sampleRequest } from "../support/gateway-harness.ts";
import { type GatewayProcess, startGatewayProcess } from "../support/gateway-process.ts";
import { eventually } from "../support/timer-race.ts";

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
    type Listed = { models: Array<{ name: string; context?: { max_state: number; max_branch: number } }> };
    const listed = await eventually<Listed>(
      "the model to become ready",
      async () => {
        const res = await fetch(`${gw.url}/v1/models`, { headers: auth });
        if (res.status === 200) return (await json(res)) as Listed;
        await res.arrayBuffer();
        return undefined;
      },
      120_000,
      100,
    );
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

  test("a model file that is not there yet: the server starts, answers 503 naming the setting (never the path), retries and serves it once it appears", async () => {
    const db = `sqlite:${join(models.dir, "missing.sqlite")}`;
    const key = await keyFor(db);
    const missing = join(models.dir, "later-model.gguf");
    const gw = await startGatewayProcess({ TDS_DATABASE_URL: db, TDS_MODEL_PATH: missing, TDS_MODEL_NAME: "local-engine" });
    started.push(gw);
    const auth = { authorization: `Bearer ${key}` };
    const bodies: string[] = [];
    const detail = await eventually("the first attempt to fail", async () => {
      const res = await fetch(`${gw.url}/v1/models`, { headers: auth });
      assert.equal(res.status, 503);
      const text = await res.text();
      bodies.push(text);
      const shown: string = JSON.parse(text).detail;
      return /attempt \d+ failed/.test(shown) ? shown : undefined;
    });
    // Attempt 1, or a later one on a machine slow enough to miss the second's start.
    assert.match(
      detail,
      /is still loading: attempt \d+ failed \(no model file at the configured path\), the next starts at .*; set TDS_MODEL_PATH to a local GGUF file/,
    );
    const decide = () =>
      fetch(`${gw.url}/v1/systemone`, {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body: JSON.stringify(sampleRequest()),
      });
    const decision = await decide();
    assert.equal(decision.status, 503);
    const decisionText = await decision.text();
    bodies.push(decisionText);
    assert.match(JSON.parse(decisionText).detail, /TDS_MODEL_PATH/);
    const ready = await fetch(`${gw.url}/readyz`);
    assert.equal(ready.status, 503);
    const readyText = await ready.text();
    bodies.push(readyText);
    const engine = JSON.parse(readyText).models["local-engine"].engine;
    assert.equal(engine.state, "retrying");
    assert.equal(engine.last_error, "no model file at the configured path");
    for (const body of bodies) {
      for (const shown of [models.dir, tmpdir(), "later-model", ".gguf"])
        assert.ok(!body.includes(shown), `an API body shows ${shown}: ${body}`);
    }
    const failures = gw.lines.filter((l) => l.includes("failed to load (attempt 1)"));
    assert.equal(failures.length, 1, "each failure is logged once");
    assert.ok(
      failures[0]!.includes('"level":40') && failures[0]!.includes(missing) && /retrying in 1 s, at /.test(failures[0]!),
      failures[0],
    );

    // The file appears (whole: written beside it, then renamed): the next attempt loads it.
    copyFileSync(models.model("tiny"), `${missing}.part`);
    renameSync(`${missing}.part`, missing);
    await eventually(
      "a decision from the loaded model",
      async () => {
        const res = await decide();
        await res.arrayBuffer();
        return res.status === 200 ? true : undefined;
      },
      120_000,
      50,
    );
    assert.ok(
      gw.lines.some((l) => l.includes('"level":30') && /model \\"local-engine\\" ready after \d+ attempts/.test(l)),
      "a line when it loads",
    );
    assert.equal(gw.lines.filter((l) => l.includes('"level":50')).length, 0, "no error lines");
    assert.equal(gw.child.exitCode, null, "never crashes");
  });

  test("without node-llama-cpp installed: the server starts with one warning, the engine's model answers 503 with how to add it", async () => {
    const db = `sqlite:${join(models.dir, "absent.sqlite")}`;
    const key = await keyFor(db);
    const hook = fileURLToPath(new URL("./fixtures/without-node-llama-cpp.mjs", import.meta.url));
    const gw = await startGatewayProcess({
      TDS_DATABASE_URL: db,
      TDS_MODEL_PATH: models.model("tiny"),
      TDS_MODEL_NAME: "local-engine",
      NODE_OPTIONS: `--import=${hook}`,
    });
    started.push(gw);
    const res = await fetch(`${gw.url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(sampleRequest()),
    });
    const body = await json(res);
    assert.equal(res.status, 503, JSON.stringify(body));
    assert.ok(body.detail.includes(`is not ready: ${ENGINE_NOT_INSTALLED.slice(0, -1)}; `), body.detail);
    const ready = await json(await fetch(`${gw.url}/readyz`));
    assert.equal(ready.models["local-engine"].engine.state, "not_installed");
    // Besides the request's own "model call failed" line.
    const warnings = gw.lines.filter((l) => l.includes("The embedded engine is not installed") && !l.includes("model call failed"));
    assert.equal(warnings.length, 1);
    assert.ok(warnings[0]!.includes('"level":40'), warnings[0]);
    assert.equal(gw.child.exitCode, null);
  });
});
