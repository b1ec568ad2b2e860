/**
 * The production install, as docs/deployment.md and the Dockerfile do it: the files package.json ships ("files",
 * package.json, package-lock.json) copied to a scratch folder, `npm ci --omit=dev` there, then `node dist/server.js`
 * answering real requests through the fake model server, and the `tds` CLI working from that folder. Then the same
 * folder without the optional engine package: external model services still work and an engine model gets a 503 that
 * says how to add it. Needs dist/ (npm test builds it) and the npm registry or npm's cache.
 *
 * better-sqlite3's install script runs as in any install; its prebuilt binary comes from this checkout's
 * node_modules (packed once as the prebuild it would otherwise download, or compile from source for minutes when
 * offline): the same package version on the same machine, which a production install cannot change.
 */
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { sampleRequest } from "../support/gateway-harness.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const manifest = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { files: string[]; version: string };

interface Server {
  url: string;
  output: () => string;
  stop(): Promise<void>;
}

/** `node dist/server.js` in the install folder; resolves once the start-up summary says where it listens. */
function startServer(cwd: string, env: Record<string, string>): Promise<Server> {
  const child = spawn(process.execPath, ["dist/server.js"], {
    cwd,
    env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", HOST: "127.0.0.1", PORT: "0", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no start within 30 s:\n${output}`)), 30_000);
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (output += chunk));
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
      output += chunk;
      // "listening at" while a model cannot answer yet (the engine model without its package, below).
      const match = /(?:ready|listening) at (http:\/\/127\.0\.0\.1:\d+)/.exec(output);
      if (match) {
        clearTimeout(timer);
        resolve({
          url: match[1]!,
          output: () => output,
          stop: async () => {
            child.kill("SIGTERM");
            await exited;
          },
        });
      }
    });
    void exited.then(() => reject(new Error(`the server exited:\n${output}`)));
  });
}

/**
 * Waits until /readyz reports `model` usable. A busy machine can time out the first model listing and put the only
 * deployment out of rotation for a moment; a test that sends at once would get 502 (the server is listening, not ready).
 * /readyz as a whole may stay 503 here: the second test configures an engine model that is never available.
 */
async function waitForModel(url: string, model: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = "";
  while (Date.now() < deadline) {
    try {
      const res = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(5000) });
      const body = (await res.json()) as { models?: Record<string, { state?: string }> };
      last = JSON.stringify(body);
      if (body.models?.[model]?.state === "ok") return;
    } catch (err) {
      last = String(err);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${model} not usable within ${timeoutMs} ms; last /readyz: ${last}`);
}

/**
 * This checkout's compiled better-sqlite3 packed into `folder` under the name prebuild-install looks for (its own
 * download name for this platform and Node.js ABI).
 */
function packSqlitePrebuild(folder: string): void {
  const sqlite = join(ROOT, "node_modules", "better-sqlite3");
  const nameScript =
    'const pkg = require("./package.json"); const opts = { ...require("prebuild-install/rc")(pkg), pkg };' +
    'process.stdout.write(require("node:path").basename(require("prebuild-install/util").getDownloadUrl(opts)));';
  const name = spawnSync(process.execPath, ["-e", nameScript], { cwd: sqlite, encoding: "utf8" });
  assert.equal(name.status, 0, `the prebuild's name: ${name.stderr}`);
  mkdirSync(folder, { recursive: true });
  const tar = spawnSync("tar", ["-czf", join(folder, name.stdout), "-C", sqlite, "build/Release/better_sqlite3.node"], {
    encoding: "utf8",
  });
  assert.equal(tar.status, 0, `packing the prebuild: ${tar.stderr}`);
}

function tds(cwd: string, args: string[], env: Record<string, string> = {}) {
  const result = spawnSync(process.execPath, ["bin/tds.mjs", ...args], {
    cwd,
    encoding: "utf8",
    env: { PATH: process.env.PATH ?? "", ...env },
  });
  assert.equal(result.status, 0, `tds ${args.join(" ")}: ${result.stderr}`);
  return result.stdout;
}

async function decide(url: string, key: string, body: Record<string, unknown>) {
  const res = await fetch(`${url}/v1/systemone`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, any> };
}

describe("production install: npm ci --omit=dev in a scratch folder", { timeout: 600_000 }, () => {
  let scratch: string;
  let dir: string;
  let fake: FakeModelServer;
  before(async () => {
    assert.ok(existsSync(join(ROOT, "dist", "server.js")), "dist/ is missing: run npm run build first");
    scratch = mkdtempSync(join(tmpdir(), "tds-production-"));
    dir = join(scratch, "install");
    for (const entry of ["package.json", "package-lock.json", ...manifest.files])
      cpSync(join(ROOT, entry), join(dir, entry), { recursive: true });
    const prebuilds = join(scratch, "prebuilds");
    packSqlitePrebuild(prebuilds);
    // prebuild-install's own settings file, found from the package's folder upwards: where to look before downloading.
    writeFileSync(join(scratch, ".prebuild-installrc"), JSON.stringify({ "local-prebuilds": prebuilds }));
    fake = await startFakeModelServer();
  });
  after(async () => {
    await fake?.close();
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });

  test("installs production dependencies only, without engine warnings, keeping the shipped dist/", () => {
    const started = process.hrtime.bigint();
    const install = spawnSync("npm", ["ci", "--omit=dev", "--no-audit", "--no-fund", "--prefer-offline"], {
      cwd: dir,
      encoding: "utf8",
      timeout: 480_000,
    });
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    assert.equal(install.status, 0, `npm ci --omit=dev failed:\n${install.stdout}\n${install.stderr}`);
    console.log(`# npm ci --omit=dev: ${seconds.toFixed(1)} s`);
    const sqliteBuild = join(dir, "node_modules", "better-sqlite3", "build", "Release");
    assert.ok(existsSync(join(sqliteBuild, "better_sqlite3.node")), "better-sqlite3's install script put its binary in place");
    assert.equal(existsSync(join(sqliteBuild, "obj.target")), false, "from the prebuild, not compiled again");
    assert.doesNotMatch(install.stderr, /EBADENGINE|Unknown env config/);
    for (const devOnly of ["tsx", "@types/node", "fast-check", "playwright-core", "autocannon"]) {
      assert.equal(existsSync(join(dir, "node_modules", devOnly)), false, `${devOnly} is a development dependency`);
    }
    assert.ok(existsSync(join(dir, "dist", "server.js")), "the prepare step kept dist/");
    assert.equal(existsSync(join(dir, "src")), false);
  });

  test("the compiled gateway answers: health, a decision, the console, the API reference, the CLI", async () => {
    const server = await startServer(dir, { TDS_MODEL_SERVICE_URL: fake.url, TDS_BOOTSTRAP: "true" });
    try {
      assert.equal((await fetch(`${server.url}/healthz`)).status, 200);
      await waitForModel(server.url, "fake-small");
      assert.equal((await fetch(`${server.url}/readyz`)).status, 200);
      const key = readFileSync(join(dir, "data", "bootstrap-key.txt"), "utf8").trim();
      const decision = await decide(server.url, key, sampleRequest());
      assert.equal(decision.status, 200, JSON.stringify(decision.body));
      assert.deepEqual(Object.keys(decision.body.answers).sort(), ["refund", "topic", "urgency"]);
      assert.equal(decision.body.model, "fake-small");
      const consolePage = await fetch(`${server.url}/console/`);
      assert.equal(consolePage.status, 200);
      assert.match(await consolePage.text(), /<html/i);
      assert.equal((await fetch(`${server.url}/docs/`)).status, 200);
      assert.equal(
        ((await (await fetch(`${server.url}/openapi.json`)).json()) as { info: { version: string } }).info.version,
        manifest.version,
      );

      const orgs = JSON.parse(tds(dir, ["org", "list", "--json"])) as Array<{ name: string }>;
      assert.deepEqual(
        orgs.map((o) => o.name),
        ["default"],
      );
      const created = JSON.parse(tds(dir, ["key", "create", "--org", "default", "--json"])) as { key: string };
      assert.equal((await decide(server.url, created.key, sampleRequest())).status, 200);
      assert.equal(tds(dir, ["--version"]), `tds (typed-decision-service) ${manifest.version}\n`);
    } finally {
      await server.stop();
    }
  });

  test("without the optional engine package: external model services work, an engine model gets a 503 that says how to add it", async () => {
    rmSync(join(dir, "node_modules", "node-llama-cpp"), { recursive: true, force: true });
    rmSync(join(dir, "node_modules", "@node-llama-cpp"), { recursive: true, force: true });
    const config = join(dir, "models.json");
    const models = {
      model_services: [{ name: "fake", url: fake.url }],
      models: [
        { name: "fake-small", deployments: [{ service: "fake" }] },
        { name: "local", engine: "llama", source: join(dir, "no-such-model.gguf") },
      ],
    };
    writeFileSync(config, JSON.stringify(models));
    const server = await startServer(dir, { TDS_CONFIG: config, TDS_BOOTSTRAP: "false" });
    try {
      const key = JSON.parse(tds(dir, ["key", "create", "--org", "default", "--json"])) as { key: string };
      await waitForModel(server.url, "fake-small");
      assert.equal((await decide(server.url, key.key, sampleRequest({ model: "fake-small" }))).status, 200);
      const engine = await decide(server.url, key.key, sampleRequest({ model: "local" }));
      assert.equal(engine.status, 503, JSON.stringify(engine.body));
      assert.match(engine.body.detail, /node-llama-cpp/);
      assert.match(engine.body.detail, /npm install node-llama-cpp/);
      const listed = (await (await fetch(`${server.url}/v1/models`, { headers: { authorization: `Bearer ${key.key}` } })).json()) as {
        models: Array<{ name: string; context?: unknown }>;
      };
      assert.deepEqual(
        listed.models.map((m) => [m.name, m.context !== undefined]),
        [
          ["fake-small", true],
          ["local", false],
        ],
        "listed, the engine model without a context",
      );
      assert.match(server.output(), /local from the in-process engine, .*NOT INSTALLED: npm install node-llama-cpp/);
    } finally {
      await server.stop();
    }
  });
});
