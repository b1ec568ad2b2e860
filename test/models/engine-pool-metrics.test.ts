import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { LlamaService } from "../../src/models/llama/llama-service.ts";
import { type ModelDir, makeModelDir } from "../fixtures/gguf/tiny-model.ts";
import { startEngineGateway } from "./engine-gateway.ts";

let models: ModelDir;
before(() => {
  models = makeModelDir();
});
after(() => models?.cleanup());

/** The value of `name{model="…"}` in a Prometheus text exposition, or undefined. */
function gauge(text: string, name: string, model: string): number | undefined {
  const line = text.split("\n").find((l) => l.startsWith(`${name}{model="${model}"} `));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(" ") + 1));
}

describe("engine pool metrics", () => {
  test("GET /metrics shows each engine's pool as its ModelService poolStats() reports it", async () => {
    const gw = await startEngineGateway({ TDS_MODEL_PATH: models.model("tiny"), TDS_MODEL_NAME: "local" });
    try {
      const [engine] = [...gw.engines.values()] as LlamaService[];
      assert.ok(engine && typeof engine.poolStats === "function");
      await engine.ready();
      const stats = engine.poolStats();
      assert.ok(stats.size >= 1);
      assert.equal(stats.busy, 0);
      assert.equal(stats.waiting, 0);
      const text = await (await fetch(`${gw.url}/metrics`)).text();
      assert.equal(gauge(text, "tds_model_pool_size", "local"), stats.size);
      assert.equal(gauge(text, "tds_model_pool_busy", "local"), stats.busy);
      assert.equal(gauge(text, "tds_model_queue_waiting", "local"), stats.waiting);
    } finally {
      await gw.close();
    }
  });
});
