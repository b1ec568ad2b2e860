/**
 * The first start as an operator sees it: offline without a model service (one message naming the three ways out,
 * no warning per retry, a summary that says where the default model comes from and that it is not loaded), a model
 * service URL given with /v1, LOG_LEVEL in any case. The processes run src/server.ts, as `npm run dev` does.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { ConfigError, loadConfig } from "../../src/config.ts";
import type { EngineStatus } from "../../src/models/model-service.ts";
import { correctedUrlWarnings } from "../../src/startup/model-service-urls.ts";
import { startupSummary } from "../../src/startup/summary.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { startGatewayProcess } from "../support/gateway-process.ts";
import { freePort } from "../support/redis-server.ts";

const DEFAULT_SOURCE = "hf:bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q8_0";
const URL = "http://127.0.0.1:8080";

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), "tds-first-start-"));
});
after(() => rmSync(dir, { recursive: true, force: true }));

function count(text: string, needle: string): number {
  return text.split(needle).length - 1;
}

/** The summary's text for a configuration whose engine deployments all have `status`. */
function summaryWith(env: Record<string, string>, status: EngineStatus | null): string {
  const config = loadConfig({ TDS_DATABASE_URL: "sqlite::memory:", ...env });
  return startupSummary({ config, url: URL, listed: [], defaultModel: config.models[0]?.name ?? null, engineStatus: () => status }).text;
}

describe("the start-up summary: where the model comes from, and never 'ready' for one that is not loaded", () => {
  const offline: EngineStatus = { state: "retrying", detail: "…", lastError: "cannot download …", failedAttempts: 1, offline: true };

  test("nothing configured: the built-in default model, not TDS_MODEL_PATH; 'listening', not 'ready'", () => {
    const text = summaryWith({}, offline);
    const [head] = text.split("\n");
    assert.equal(head?.startsWith("Typed Decision Service "), true);
    assert.match(head ?? "", / listening at http:\/\/127\.0\.0\.1:8080; not ready: "qwen2\.5-0\.5b-instruct" \(see models\)$/);
    assert.doesNotMatch(text, /ready at/);
    assert.match(
      text,
      /models +qwen2\.5-0\.5b-instruct \(default\) from the in-process engine, hf:bartowski\/Qwen2\.5-0\.5B-Instruct-GGUF:Q8_0 \(the built-in default model\) — cannot be downloaded \(offline\?\)/,
    );
    assert.doesNotMatch(text, /TDS_MODEL_PATH|TDS_MODEL_SERVICE_URL/);
  });

  test("each engine state in words: downloading, loading, retrying, failed, loaded", () => {
    const words = (status: EngineStatus) =>
      summaryWith({}, status)
        .split("\n")
        .find((l) => l.startsWith("  models"));
    assert.match(words({ state: "loading", detail: `downloading ${DEFAULT_SOURCE}`, progress: 0.123 }) ?? "", / — downloading \(12%\)$/);
    assert.match(words({ state: "loading", detail: "loading the model file", progress: 0.5 }) ?? "", / — loading \(50%\)$/);
    assert.match(
      words({ state: "retrying", lastError: "no model file at the configured path", failedAttempts: 2 }) ?? "",
      / — retrying: no model file at the configured path \(requests get 503\)$/,
    );
    assert.match(words({ state: "failed", detail: "…" }) ?? "", / — FAILED to load/);
    const ready = summaryWith({}, { state: "ready" });
    assert.match(ready, /^Typed Decision Service \S+ ready at http:\/\/127\.0\.0\.1:8080\n/);
    assert.match(ready, /\(the built-in default model\) — loaded$/m);
  });

  test("a model the operator named: TDS_MODEL_PATH, or its config file entry", () => {
    assert.match(
      summaryWith({ TDS_MODEL_PATH: "/models/x.gguf" }, { state: "ready" }),
      /from the in-process engine, \/models\/x\.gguf \(TDS_MODEL_PATH\) — loaded/,
    );
    const file = join(dir, "engine.json");
    writeFileSync(file, JSON.stringify({ models: [{ name: "local", engine: "llama", source: "/models/y.gguf" }] }));
    assert.match(
      summaryWith({ TDS_CONFIG: file }, { state: "loading", detail: "starting", progress: 0 }),
      /local \(default\) from the in-process engine, \/models\/y\.gguf \(models\[\]\.source of "local" in the config file \(TDS_CONFIG\)\) — loading \(0%\)/,
    );
  });
});

describe("a model service URL with the API path in it", () => {
  const base = { TDS_DATABASE_URL: "sqlite::memory:" };

  test("/v1, /v1/, /v1/systemone, /v1/models are dropped, with one warning naming the setting and the URL used", () => {
    for (const given of [
      "http://127.0.0.1:9090/v1",
      "http://127.0.0.1:9090/v1/",
      "http://127.0.0.1:9090/v1/systemone",
      "http://127.0.0.1:9090/V1/models/",
    ]) {
      const config = loadConfig({ ...base, TDS_MODEL_SERVICE_URL: given });
      assert.equal(config.modelServices[0]?.url, "http://127.0.0.1:9090", given);
      assert.deepEqual(correctedUrlWarnings(config), [
        `TDS_MODEL_SERVICE_URL is ${given}, but the gateway adds /v1/systemone and /v1/models itself: using http://127.0.0.1:9090. ` +
          "Remove the path from TDS_MODEL_SERVICE_URL to silence this warning.",
      ]);
    }
  });

  test("a proxy's path prefix is kept (only a trailing API path goes); no warning without one; the config file's services too", () => {
    const prefixed = loadConfig({ ...base, TDS_MODEL_SERVICE_URL: "https://gw.example/ollama/v1/" });
    assert.equal(prefixed.modelServices[0]?.url, "https://gw.example/ollama");
    const plain = loadConfig({ ...base, TDS_MODEL_SERVICE_URL: "https://gw.example/ollama/, http://127.0.0.1:9090" });
    assert.deepEqual(
      plain.modelServices.map((s) => s.url),
      ["https://gw.example/ollama", "http://127.0.0.1:9090"],
    );
    assert.deepEqual(correctedUrlWarnings(plain), []);
    const file = join(dir, "services.json");
    writeFileSync(file, JSON.stringify({ model_services: [{ name: "gpu", url: "http://user:pw@10.0.0.5:8000/v1" }] }));
    const named = loadConfig({ ...base, TDS_CONFIG: file });
    assert.equal(named.modelServices[0]?.url, "http://user:pw@10.0.0.5:8000");
    const [warning] = correctedUrlWarnings(named);
    assert.match(
      warning ?? "",
      /^model_services "gpu" url is http:\/\/user@10\.0\.0\.5:8000\/v1, .* using http:\/\/user@10\.0\.0\.5:8000\. /,
    );
    assert.doesNotMatch(warning ?? "", /pw/, "no password in the log");
  });
});

describe("LOG_LEVEL", () => {
  test("in any case: INFO, Debug, warn; anything else is still refused", () => {
    for (const [given, level] of [
      ["INFO", "info"],
      ["Debug", "debug"],
      ["warn", "warn"],
    ] as const)
      assert.equal(loadConfig({ TDS_DATABASE_URL: "sqlite::memory:", LOG_LEVEL: given }).logLevel, level);
    assert.throws(
      () => loadConfig({ TDS_DATABASE_URL: "sqlite::memory:", LOG_LEVEL: "Verbose" }),
      (err: unknown) => err instanceof ConfigError && /^LOG_LEVEL must be one of fatal, error, warn, info/.test(err.problems[0] ?? ""),
    );
  });
});

describe("the gateway process", { timeout: 120_000 }, () => {
  let fake: FakeModelServer;
  before(async () => {
    fake = await startFakeModelServer();
  });
  after(async () => fake?.close());

  test("offline, nothing configured: one message with the three ways out, quiet retries, a summary that says so", async () => {
    // node-llama-cpp's hub endpoint: a closed loopback port, as a machine without network access would see the hub.
    const hub = `http://127.0.0.1:${await freePort()}/`;
    const gw = await startGatewayProcess({
      TDS_DATABASE_URL: `sqlite:${join(dir, "offline.sqlite")}`,
      TDS_MODEL_CACHE_DIR: join(dir, "models"),
      MODEL_ENDPOINT: hub,
      TDS_LOG_FORMAT: "pretty",
    });
    try {
      const engine = await poll(async () => {
        const body = (await (await fetch(`${gw.url}/readyz`)).json()) as { models: Record<string, { engine?: Record<string, unknown> }> };
        const e = body.models["qwen2.5-0.5b-instruct"]?.engine;
        return Number(e?.failed_attempts ?? 0) >= 3 ? e : undefined;
      });
      assert.match(String(engine?.detail), /^the model "qwen2\.5-0\.5b-instruct" cannot be downloaded \(offline\?\): attempt \d+ failed/);
      const output = gw.lines.join("\n");
      for (const way of ["TDS_MODEL_SERVICE_URL", "TDS_MODEL_PATH", "npm run fake-model"])
        assert.equal(count(output, way), 1, `${way} named once:\n${output}`);
      assert.match(
        output,
        new RegExp(
          `The download of ${DEFAULT_SOURCE.replace(/[.]/g, "\\.")} \\(the built-in default model, about 531 MB\\) cannot succeed`,
        ),
      );
      const engineWarnings = gw.lines.filter((l) => /^\S+ WARN {2}\[embedded-engine\]/.test(l));
      assert.equal(engineWarnings.length, 1, `three failed attempts, one warning:\n${output}`);
      assert.doesNotMatch(output, /ready at/);
      assert.match(
        output,
        /INFO {2}Typed Decision Service \S+ listening at http:\/\/127\.0\.0\.1:\d+; not ready: "qwen2\.5-0\.5b-instruct" \(see models\)/,
      );
      assert.match(
        output,
        /^ {2}models +qwen2\.5-0\.5b-instruct \(default\) from the in-process engine, hf:\S+ \(the built-in default model\) — /m,
      );
    } finally {
      await gw.stop();
    }
  });

  test("TDS_MODEL_SERVICE_URL ending in /v1/: one warning, the corrected URL used; LOG_LEVEL=INFO accepted", async () => {
    const gw = await startGatewayProcess({
      TDS_DATABASE_URL: `sqlite:${join(dir, "v1.sqlite")}`,
      TDS_MODEL_SERVICE_URL: `${fake.url}/v1/`,
      TDS_LOG_FORMAT: "json",
      LOG_LEVEL: "INFO",
    });
    try {
      const records = await poll(() => {
        const parsed = gw.lines.filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as Record<string, any>);
        return parsed.some((r) => r.startup) ? parsed : undefined;
      });
      const warnings = records.filter((r) => r.level === 40);
      assert.deepEqual(
        warnings.map((r) => [r.component, r.msg]),
        [
          [
            "config",
            `TDS_MODEL_SERVICE_URL is ${fake.url}/v1/, but the gateway adds /v1/systemone and /v1/models itself: using ${fake.url}. ` +
              "Remove the path from TDS_MODEL_SERVICE_URL to silence this warning.",
          ],
        ],
      );
      const { startup } = records.find((r) => r.startup)!;
      assert.match(
        startup.models.join("\n"),
        /^fake-small \(default\), fake-large listed by model service /,
        "listed through the corrected URL",
      );
    } finally {
      await gw.stop();
    }
  });
});

/** Polls `probe` every 100 ms until it gives a value (at most 30 s). */
async function poll<T>(probe: () => Promise<T | undefined> | T | undefined): Promise<T> {
  const until = Date.now() + 30_000;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > until) assert.fail("gave up waiting");
    await new Promise((r) => setTimeout(r, 100));
  }
}
