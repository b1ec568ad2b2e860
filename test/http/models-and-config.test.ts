import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { assertShape, errorBody, json } from "../support/contract-check.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";

describe("GET /v1/models, GET /api/config, GET /openapi.json", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({
      env: {
        TDS_MAX_REQUEST_BYTES: "65536",
        TDS_REQUESTS_PER_MINUTE: "120",
        TDS_MAX_BATCH_REQUESTS: "2000",
        TDS_BATCH_COMPLETION_WINDOW_HOURS: "48",
        TDS_BATCH_PRICE_FACTOR: "0.50",
      },
    });
  });
  after(async () => gw.close());

  test("models come from the model service with their context metadata", async () => {
    const res = await gw.get("/v1/models");
    assert.equal(res.status, 200);
    const body = await json(res);
    assertShape("models", body);
    assert.deepEqual(body, {
      models: [{ name: "fake-small", context: { max_state: 4096, max_branch: 6144, strict: true } }, { name: "fake-large" }],
    });
  });

  test("/api/config needs no key and reports mode, pricing and every limit by the spec's names", async () => {
    const res = await fetch(`${gw.url}/api/config`);
    assert.equal(res.status, 200);
    const body = await json(res);
    assert.equal(body.service_mode, "preview");
    assert.deepEqual(Object.keys(body.limits).sort(), [
      "batch_completion_window_hours",
      "batch_concurrency",
      "batch_global_concurrency",
      "batch_price_factor",
      "batch_retention_days",
      "max_batch_bytes",
      "max_batch_requests",
      "max_input_tokens",
      "max_questions",
      "max_request_bytes",
      "preview_global_request_limit",
      "preview_request_limit",
      "read_requests_per_minute",
      "requests_per_minute",
      "reserve_tokens",
    ]);
    assert.equal(body.limits.max_request_bytes, 65536);
    assert.deepEqual(
      {
        max_batch_requests: body.limits.max_batch_requests,
        max_batch_bytes: body.limits.max_batch_bytes,
        batch_concurrency: body.limits.batch_concurrency,
        batch_global_concurrency: body.limits.batch_global_concurrency,
        batch_completion_window_hours: body.limits.batch_completion_window_hours,
        batch_retention_days: body.limits.batch_retention_days,
        batch_price_factor: body.limits.batch_price_factor,
      },
      {
        max_batch_requests: 2000,
        max_batch_bytes: 209_715_200,
        batch_concurrency: 16,
        batch_global_concurrency: 32,
        batch_completion_window_hours: 48,
        batch_retention_days: 7,
        batch_price_factor: "0.5",
      },
      "the batch settings, as configured or at their defaults",
    );
    assert.equal(body.limits.requests_per_minute, 120);
    assert.equal(body.pricing.price_per_million_input_usd, null);
    assert.deepEqual(
      { ...body.pricing.reservation, rule: typeof body.pricing.reservation.rule },
      {
        rule: "string",
        prompt_overhead_tokens: 256,
        question_overhead_tokens: 64,
        output_tokens_per_question: 1,
        cap_tokens: body.limits.reserve_tokens,
        over_cap_status: 413,
      },
    );
    assert.ok(!JSON.stringify(body).includes(gw.fake!.url), "the upstream URL is not published");
  });

  test("with an external model service and no configured default, default_model is the first model it lists", async () => {
    const body = await json(await fetch(`${gw.url}/api/config`));
    assert.equal(body.default_model, "fake-small");
    const down = await startGateway({ fake: false, env: { TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9" } });
    try {
      assert.equal((await json(await fetch(`${down.url}/api/config`))).default_model, null, "null while the service cannot be reached");
    } finally {
      await down.close();
    }
  });

  test("/openapi.json documents the endpoints with the validation schemas", async () => {
    const res = await fetch(`${gw.url}/openapi.json`);
    assert.equal(res.status, 200);
    const doc = await json(res);
    assert.equal(doc.openapi, "3.1.0");
    const post = doc.paths["/v1/systemone"].post;
    assert.deepEqual(post.requestBody.content["application/json"].schema.required, ["state", "questions"]);
    assert.equal(post.requestBody.content["application/json"].schema.additionalProperties, false);
    for (const status of ["200", "401", "402", "403", "409", "413", "422", "429", "502", "503"]) assert.ok(post.responses[status], status);
    assert.ok(doc.paths["/v1/models"].get.responses["200"]);
    assert.ok(doc.paths["/api/config"].get.responses["200"]);
  });

  test("unknown routes get a JSON 404", async () => {
    const res = await fetch(`${gw.url}/v2/systemone`);
    await errorBody(res, 404);
  });
});

describe("configured models, aliases and prices", () => {
  test("the config file names public models mapped to upstream names, with aliases and context", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-config-"));
    const path = join(dir, "config.json");
    writeFileSync(
      path,
      JSON.stringify({
        default_model: "decider",
        aliases: { "jev-latest": "decider" },
        models: [
          {
            name: "decider",
            upstream_name: "fake-large",
            aliases: ["decider-v1"],
            context: { max_state: 1000, max_branch: 1200 },
            price_per_million_input_usd: "2.50",
          },
          { name: "small", upstream_name: "fake-small" },
        ],
      }),
    );
    const gw = await startGateway({ env: { TDS_CONFIG: path, TDS_SERVICE_MODE: "paid" } });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000_000, nowMs: Date.now() });
      const models = await json(await gw.get("/v1/models"));
      const small = (await json(await fetch(`${gw.fake!.url}/v1/models`))).models.find((m: { name: string }) => m.name === "fake-small");
      assert.ok(small.context, "the fake publishes a context for fake-small");
      assert.deepEqual(
        models,
        {
          models: [
            { name: "decider", context: { max_state: 1000, max_branch: 1200 } },
            { name: "small", context: small.context },
          ],
        },
        "a configured context is published as is; otherwise the context its deployment publishes",
      );
      for (const [requested, name, upstream] of [
        ["decider-v1", "decider", "fake-large"],
        ["jev-latest", "decider", "fake-large"],
        [null, "decider", "fake-large"],
        ["small", "small", "fake-small"],
      ] as const) {
        const res = await gw.decide({ ...sampleRequest(), model: requested });
        const body = await json(res);
        assert.equal(res.status, 200, JSON.stringify(body));
        assert.equal(body.model, name);
        assert.equal(gw.fake!.received.at(-1)!.model, upstream);
        assert.equal(body.usage.price_per_million_input_usd, name === "decider" ? "2.5" : "0.5", "per-model price, else the default");
      }
      const unknown = await errorBody(await gw.decide({ ...sampleRequest(), model: "fake-large" }), 422);
      assert.equal(unknown.errors?.[0]?.field, "model");
      const config = await json(await fetch(`${gw.url}/api/config`));
      assert.deepEqual(config.pricing.models, [
        { name: "decider", price_per_million_input_usd: "2.5", price_per_million_output_usd: null },
      ]);
    } finally {
      await gw.close();
    }
  });
});
