/** Model services, models and their deployments, and the routing settings, as read from the environment and the config file. */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { ConfigError, loadConfig } from "../src/config.ts";
import { ROUTER_DEFAULTS } from "../src/config-defaults.ts";

const dir = mkdtempSync(join(tmpdir(), "tds-config-models-"));
after(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;

function withFile(content: unknown, env: Record<string, string> = {}) {
  const path = join(dir, `config-${++files}.json`);
  writeFileSync(path, JSON.stringify(content), { mode: 0o600 });
  return loadConfig({ TDS_CONFIG: path, ...env });
}

function problemsOf(content: unknown, env: Record<string, string> = {}): string[] {
  try {
    withFile(content, env);
  } catch (err) {
    assert.ok(err instanceof ConfigError, String(err));
    return err.problems;
  }
  assert.fail("the configuration was accepted");
}

describe("model services and deployments", () => {
  test("TDS_MODEL_SERVICE_URL takes a comma-separated list: replicas named host:port, each serving every configured model", () => {
    const config = withFile(
      { models: [{ name: "decider", upstream_name: "qwen" }] },
      { TDS_MODEL_SERVICE_URL: " http://10.0.0.5:8000/ , https://gpu-b.example ", TDS_MODEL_SERVICE_KEY: "k" },
    );
    assert.deepEqual(
      config.modelServices.map((s) => [s.name, s.url, s.apiKey]),
      [
        ["10.0.0.5:8000", "http://10.0.0.5:8000", "k"],
        ["gpu-b.example:443", "https://gpu-b.example", "k"],
      ],
    );
    assert.deepEqual(
      config.models[0]!.deployments.map((d) => [d.name, d.service, d.upstreamName, d.weight, d.maxConcurrency, d.fallback]),
      [
        ["10.0.0.5:8000", "10.0.0.5:8000", "qwen", 1, null, false],
        ["gpu-b.example:443", "gpu-b.example:443", "qwen", 1, null, false],
      ],
    );
  });

  test("model_services and models[].deployments: services, weights, limits, engines and fallbacks", () => {
    const config = withFile({
      model_services: [
        { name: "gpu-a", url: "http://10.0.0.5:8000", api_key: "secret", weight: 2, max_concurrency: 64 },
        { name: "gpu-b", url: "http://10.0.0.6:8000" },
      ],
      models: [
        {
          name: "decider",
          deployments: [
            { service: "gpu-a", upstream_name: "qwen2.5-7b" },
            { service: "gpu-b", upstream_name: "qwen2.5-7b", weight: 0.5, max_concurrency: 8 },
            { engine: "llama", source: "./models/small.gguf", fallback: true, threads: 2 },
          ],
        },
        { name: "plain" },
      ],
    });
    const decider = config.models[0]!;
    assert.deepEqual(
      decider.deployments.map((d) => [d.name, d.service, d.upstreamName, d.weight, d.maxConcurrency, d.fallback]),
      [
        ["gpu-a", "gpu-a", "qwen2.5-7b", 2, 64, false],
        ["gpu-b", "gpu-b", "qwen2.5-7b", 0.5, 8, false],
        ["in-process", null, "decider", 1, null, true],
      ],
    );
    assert.equal(decider.deployments[2]!.llama?.source, "./models/small.gguf");
    assert.equal(decider.deployments[2]!.llama?.threads, 2);
    assert.equal(config.modelServices[0]!.apiKey, "secret");
    assert.deepEqual(
      config.models[1]!.deployments.map((d) => d.name),
      ["gpu-a", "gpu-b"],
      "a model without deployments is served by every named service when TDS_MODEL_SERVICE_URL is not set",
    );
  });

  test("the old forms keep their meaning: model_service.url and an engine model", () => {
    const config = withFile({
      model_service: { url: "http://127.0.0.1:11434" },
      models: [{ name: "up" }, { name: "local", engine: "llama", source: "./m.gguf" }],
    });
    assert.deepEqual(
      config.modelServices.map((s) => s.name),
      ["127.0.0.1:11434"],
    );
    assert.deepEqual(
      config.models.map((m) => m.deployments.map((d) => d.name)),
      [["127.0.0.1:11434"], ["in-process"]],
    );
  });

  test("every mistake is named, all at once", () => {
    const problems = problemsOf({
      model_services: [
        { name: "a", url: "ftp://x" },
        { name: "a", url: "http://127.0.0.1:1" },
      ],
      models: [
        { name: "m1", deployments: [{ service: "nowhere" }, { engine: "llama" }, { service: "a", engine: "llama", source: "x.gguf" }] },
        { name: "m3", upstream_name: "x", deployments: [{ service: "a" }, { service: "a" }] },
        { name: "m4", deployments: [{ upstream_name: "y" }] },
      ],
    });
    for (const expected of [
      /model_services "a" url must be an http\(s\) URL/,
      /the name "a" is used twice/,
      /names the service "nowhere", which model_services does not list/,
      /the engine deployment of "m1" has no source/,
      /names both a service and engine "llama"/,
      /"m3" has deployments; engine, source and upstream_name go into each deployment/,
      /"m3" has two deployments on the service "a"/,
      /a deployment of "m4" names neither a service/,
    ]) {
      assert.ok(
        problems.some((p) => expected.test(p)),
        `${expected} in ${JSON.stringify(problems, null, 2)}`,
      );
    }
  });

  test("an empty deployments list is rejected", () => {
    assert.match(problemsOf({ models: [{ name: "m", deployments: [] }] }).join("\n"), /models\.0\.deployments must have at least 1 items/);
  });

  test("unknown fields in model_services and deployments are rejected, not ignored", () => {
    const problems = problemsOf({
      model_services: [{ name: "a", url: "http://127.0.0.1:1", weigth: 2 }],
      models: [{ name: "m", deployments: [{ service: "a", fallbak: true }] }],
    });
    assert.ok(
      problems.some((p) => /weigth/.test(p)),
      JSON.stringify(problems),
    );
    assert.ok(
      problems.some((p) => /fallbak/.test(p)),
      JSON.stringify(problems),
    );
  });
});

describe("routing settings", () => {
  test("defaults: the router's, with an attempt timeout of half the model timeout", () => {
    const config = withFile({ model_timeout_ms: 8000 }, { TDS_MODEL_SERVICE_URL: "http://127.0.0.1:1" });
    assert.deepEqual(config.routing, {
      maxAttempts: ROUTER_DEFAULTS.maxAttempts,
      attemptTimeoutMs: 4000,
      failureThreshold: ROUTER_DEFAULTS.failureThreshold,
      cooldownInitialMs: ROUTER_DEFAULTS.cooldownInitialMs,
      cooldownMaxMs: ROUTER_DEFAULTS.cooldownMaxMs,
      healthCheckIntervalMs: ROUTER_DEFAULTS.healthCheckIntervalMs,
    });
    assert.ok(ROUTER_DEFAULTS.cooldownMaxMs <= 30_000, "a deployment is tried again within 30 s by default");
  });

  test("the file's routing section, null turning off attempt timeouts and active checks", () => {
    const config = withFile(
      {
        routing: {
          max_attempts: 2,
          attempt_timeout_ms: null,
          failure_threshold: 5,
          cooldown_initial_ms: 500,
          cooldown_max_ms: 10_000,
          health_check_interval_ms: null,
        },
      },
      { TDS_MODEL_SERVICE_URL: "http://127.0.0.1:1" },
    );
    assert.deepEqual(config.routing, {
      maxAttempts: 2,
      attemptTimeoutMs: null,
      failureThreshold: 5,
      cooldownInitialMs: 500,
      cooldownMaxMs: 10_000,
      healthCheckIntervalMs: null,
    });
    const problems = problemsOf(
      { routing: { cooldown_initial_ms: 5000, cooldown_max_ms: 1000 } },
      { TDS_MODEL_SERVICE_URL: "http://127.0.0.1:1" },
    );
    assert.deepEqual(problems, ["routing.cooldown_max_ms (1000) must not be shorter than routing.cooldown_initial_ms (5000)"]);
  });
});

describe("the in-process engine's GPU setting", () => {
  test("TDS_MODEL_GPU=auto reaches the TDS_MODEL_PATH model and the default model; off or unset keeps the CPU", () => {
    const path = loadConfig({ TDS_MODEL_PATH: "/models/x.gguf", TDS_MODEL_GPU: "auto" });
    assert.equal(path.models[0]!.deployments[0]!.llama!.gpu, "auto");
    assert.equal(loadConfig({ TDS_MODEL_GPU: "auto" }).models[0]!.deployments[0]!.llama!.gpu, "auto");
    assert.equal(loadConfig({ TDS_MODEL_PATH: "/models/x.gguf", TDS_MODEL_GPU: "off" }).models[0]!.deployments[0]!.llama!.gpu, undefined);
    assert.equal(loadConfig({ TDS_MODEL_PATH: "/models/x.gguf" }).models[0]!.deployments[0]!.llama!.gpu, undefined);
  });

  test("the config file's gpu on an engine model and on a deployment; anything else is named", () => {
    const config = withFile({
      models: [
        { name: "a", engine: "llama", source: "/a.gguf", gpu: "auto" },
        { name: "b", deployments: [{ engine: "llama", source: "/b.gguf", gpu: false }] },
      ],
    });
    assert.equal(config.models[0]!.deployments[0]!.llama!.gpu, "auto");
    assert.equal(config.models[1]!.deployments[0]!.llama!.gpu, false);
    assert.match(problemsOf({}, { TDS_MODEL_GPU: "cuda" }).join("\n"), /TDS_MODEL_GPU must be "auto" or "off"/);
    assert.match(problemsOf({ models: [{ name: "a", engine: "llama", source: "/a.gguf", gpu: "cuda" }] }).join("\n"), /gpu/);
  });
});
