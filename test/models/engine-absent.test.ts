import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { loadConfig } from "../../src/config.ts";
import { DEFAULT_EMBEDDED_MODEL } from "../../src/config-defaults.ts";
import { engineKey } from "../../src/config-models.ts";
import { ENGINE_NOT_INSTALLED, ENGINE_PACKAGE, isEnginePackageMissing } from "../../src/models/llama/engine-absent.ts";
import { type ModelService, ModelServiceError } from "../../src/models/model-service.ts";
import { openEngines } from "../../src/models/open-model-service.ts";
import { recordingLogger } from "../fixtures/gguf/tiny-model.ts";
import { type EngineGateway, startEngineGateway } from "./engine-gateway.ts";

/** The error Node's ESM loader throws for a package that is not installed. */
function notFound(specifier: string, from = "/srv/tds/src/models/llama/backend.ts"): Error {
  return Object.assign(new Error(`Cannot find package '${specifier}' imported from ${from}`), { code: "ERR_MODULE_NOT_FOUND" });
}

const withoutEngine = { importEngine: () => Promise.reject(notFound("node-llama-cpp")) };

describe("the embedded engine not installed", () => {
  test("only node-llama-cpp itself missing counts as the engine being absent", async () => {
    assert.equal(isEnginePackageMissing(notFound("node-llama-cpp")), true);
    // One of node-llama-cpp's own dependencies missing is a broken install, not an omitted one.
    assert.equal(isEnginePackageMissing(notFound("@huggingface/jinja", "/srv/tds/node_modules/node-llama-cpp/dist/index.js")), false);
    assert.equal(isEnginePackageMissing(notFound("node-llama-cpp-extra")), false);
    assert.equal(isEnginePackageMissing(new Error("Cannot find package 'node-llama-cpp' imported from x")), false, "no code");
    // The real loader's error for a package that is not installed has that shape.
    const real = await import("node-llama-cpp-is-not-a-package" as string).catch((e: unknown) => e);
    assert.equal((real as NodeJS.ErrnoException).code, "ERR_MODULE_NOT_FOUND");
    assert.match((real as Error).message, /^Cannot find package 'node-llama-cpp-is-not-a-package' /);
  });

  test("the install command names the version package.json pins", () => {
    const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as {
      optionalDependencies: Record<string, string>;
    };
    assert.equal(ENGINE_PACKAGE, `node-llama-cpp@${pkg.optionalDependencies["node-llama-cpp"]}`);
  });

  test("another module that cannot be imported still fails the start", async () => {
    const config = loadConfig({ TDS_MODEL_PATH: "/models/x.gguf" });
    await assert.rejects(
      openEngines(config, recordingLogger(), { importEngine: () => Promise.reject(notFound("@huggingface/jinja")) }),
      /@huggingface\/jinja/,
    );
  });

  test("nothing configured: the default model is on the absent engine", async () => {
    const logger = recordingLogger();
    const engines = await openEngines(loadConfig({}), logger, withoutEngine);
    const [[key, engine]] = [...engines] as [[string, ModelService]];
    assert.equal(key, engineKey(DEFAULT_EMBEDDED_MODEL.name, 0));
    assert.deepEqual(engine.status?.(), { state: "not_installed", detail: ENGINE_NOT_INSTALLED });
    await assert.rejects(engine.decide({ model: "m", state: null, questions: {} }, { timeoutMs: 1000 }), (err: unknown) => {
      assert.ok(err instanceof ModelServiceError);
      assert.equal(err.kind, "not_ready");
      assert.equal(err.message, ENGINE_NOT_INSTALLED);
      return true;
    });
    assert.equal(logger.lines.length, 1);
  });

  test("no engine model configured: node-llama-cpp is never imported", async () => {
    let imported = 0;
    const engines = await openEngines(loadConfig({ TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9" }), recordingLogger(), {
      importEngine: () => {
        imported++;
        return Promise.reject(notFound("node-llama-cpp"));
      },
    });
    assert.equal(engines.size, 0);
    assert.equal(imported, 0);
  });

  describe("behind the real gateway, next to a model service", () => {
    let gw: EngineGateway;
    before(async () => {
      gw = await startEngineGateway({ TDS_MODEL_PATH: "/models/local.gguf", TDS_MODEL_NAME: "local" }, withoutEngine);
    });
    after(() => gw?.close());

    test("one warning at start names the fix and the models", () => {
      assert.deepEqual(gw.log.lines, [{ level: "warn", msg: `${ENGINE_NOT_INSTALLED} The models on it answer 503: "local".` }]);
    });

    test("the engine's model answers 503 with how to add the engine", async () => {
      const { status, body } = await gw.decide("local");
      assert.equal(status, 503, JSON.stringify(body));
      assert.ok(
        body.detail?.startsWith(`The model (deployment "in-process") is not ready: ${ENGINE_NOT_INSTALLED.slice(0, -1)}; `),
        body.detail,
      );
      assert.match(body.detail ?? "", /npm install node-llama-cpp@3\.21\.1/);
    });

    test("/readyz: 503, the model unavailable, its engine not_installed with the same detail", async () => {
      const { status, body } = await gw.readyz();
      assert.equal(status, 503);
      assert.equal(body.checks.database, "ok");
      assert.deepEqual(body.models.local, {
        state: "unavailable",
        healthy: 0,
        deployments: 1,
        engine: { state: "not_installed", detail: ENGINE_NOT_INSTALLED },
      });
      assert.equal(body.models["fake-small"]?.state, "ok");
      assert.equal(body.models["fake-small"]?.engine, undefined);
    });

    test("a model of the model service still answers 200", async () => {
      const { status, body } = await gw.decide("fake-small");
      assert.equal(status, 200, JSON.stringify(body));
      assert.equal(body.model, "fake-small");
    });

    test("still one log line after the requests", () => {
      assert.equal(gw.log.lines.length, 1);
    });
  });
});
