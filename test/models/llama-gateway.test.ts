import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { LlamaService } from "../../src/models/llama/llama-service.ts";
import { type ModelDir, makeModelDir, tinyService } from "../fixtures/gguf/tiny-model.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";

let models: ModelDir;
let service: LlamaService;
let gateway: Gateway;

before(async () => {
  models = makeModelDir();
  service = tinyService(models.model("tiny"));
  await service.ready();
  gateway = await startGateway({ modelService: service });
});

after(async () => {
  await gateway?.close(); // closes the model service too
  models?.cleanup();
});

describe("embedded engine behind the real gateway", () => {
  test("GET /v1/models lists the model with its context limits", async () => {
    const res = await gateway.get("/v1/models");
    assert.equal(res.status, 200);
    const body = (await res.json()) as { models: Array<{ name: string; context?: Record<string, unknown> }> };
    assert.deepEqual(body.models, [{ name: "tiny", context: { max_state: 4096 - 8 - 64, max_branch: 4096 - 8, strict: true } }]);
  });

  test("POST /v1/systemone answers choice, score and noul", async () => {
    const res = await gateway.decide(sampleRequest());
    const text = await res.text();
    assert.equal(res.status, 200, text);
    const body = JSON.parse(text) as {
      model: string;
      answers: Record<string, Record<string, unknown>>;
      usage: { input_tokens: number; output_tokens: number };
      latency_ms?: number;
    };
    assert.equal(body.model, "tiny");
    assert.deepEqual(Object.keys(body.answers), ["topic", "urgency", "refund"]);
    assert.equal(body.answers.topic?.type, "choice");
    assert.deepEqual(Object.keys(body.answers.topic?.probabilities as object), ["billing", "bug", "other"]);
    assert.equal(body.answers.urgency?.type, "score");
    assert.deepEqual(Object.keys(body.answers.urgency?.probabilities as object), ["0", "1", "2", "3"]);
    assert.equal(body.answers.refund?.type, "noul");
    assert.equal(typeof body.answers.refund?.noul, "number");
    assert.ok(body.usage.input_tokens > 100, `input tokens ${body.usage.input_tokens}`);
    assert.equal(body.usage.output_tokens, 3);
    assert.ok(typeof body.latency_ms === "number" && body.latency_ms >= 0);
  });

  test("a state over the model's max_state is a 422 that names the limit", async () => {
    const res = await gateway.decide(sampleRequest({ state: { notes: "lorem ipsum dolor sit amet ".repeat(800) } }));
    const body = (await res.json()) as { detail: string };
    assert.equal(res.status, 422, JSON.stringify(body));
    assert.match(body.detail, /state is \d+ tokens; the model's max_state is 4024/);
  });
});
