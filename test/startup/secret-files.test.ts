/**
 * The compiled server (`node dist/server.js`, as the container runs it) with its secrets in files, as Compose and
 * Docker secrets give them: the tokens, the database URL and the model service key are read from the files the
 * *_FILE variables name; a file that cannot be read stops the start with one line naming the setting and the path.
 * `npm test` builds dist/ first.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";

const SERVER = fileURLToPath(new URL("../../dist/server.js", import.meta.url));
const ADMIN = "adm-secret-file-5Rt8Kq2Zx7Lw4Nv9Bc3";
const METRICS = "c2a9e71f5b3d8046a1e9c7f3b5d2084e6c1a9f7b3d5e2c0841f6a9e7c3b5d1f2";
const MODEL_KEY = "sk-fake-model-key-from-a-file";

interface Started {
  url: string;
  stop: () => Promise<number | null>;
}

function spawnServer(env: Record<string, string>) {
  return spawn(process.execPath, [SERVER], {
    env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", HOST: "127.0.0.1", PORT: "0", TDS_BOOTSTRAP: "false", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
}

/** Starts the server and waits for its start-up summary (JSON lines: stdout is not a terminal). */
function start(env: Record<string, string>): Promise<Started & { summary: Record<string, any> }> {
  const child = spawnServer(env);
  const exited = new Promise<number | null>((resolve) => child.on("exit", resolve));
  return new Promise((resolve, reject) => {
    let stdout = "";
    let stderr = "";
    let started = false;
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`no start-up summary:\n${stdout}\n${stderr}`));
    }, 20_000);
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    const early = (code: number | null) => {
      clearTimeout(timer);
      reject(new Error(`exited with ${code}:\n${stdout}\n${stderr}`));
    };
    child.on("exit", early);
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
      if (started) return;
      stdout += chunk;
      for (const line of stdout.split("\n").slice(0, -1)) {
        const record = JSON.parse(line) as Record<string, any>;
        if (!record.startup) continue;
        started = true;
        clearTimeout(timer);
        child.off("exit", early);
        const stop = () => {
          child.kill("SIGTERM");
          return exited;
        };
        resolve({ url: record.startup.url as string, summary: record.startup as Record<string, any>, stop });
        return;
      }
    });
  });
}

describe("the server with its secrets in files", { timeout: 60_000 }, () => {
  let dir: string;
  let fake: FakeModelServer;
  const secret = (name: string, content: string) => {
    const path = join(dir, name);
    writeFileSync(path, content, { mode: 0o600 });
    return path;
  };
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "tds-secret-files-entry-"));
    fake = await startFakeModelServer({ apiKey: MODEL_KEY });
  });
  after(async () => {
    await fake.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("reads the tokens, the database URL and the model service key from their files", async () => {
    const database = join(dir, "tds.sqlite");
    const server = await start({
      TDS_ADMIN_TOKEN_FILE: secret("admin_token", `${ADMIN}\n`),
      TDS_METRICS_TOKEN_FILE: secret("metrics_token", `${METRICS}\n`),
      TDS_DATABASE_URL_FILE: secret("database_url", `sqlite:${database}\n`),
      TDS_MODEL_SERVICE_URL: fake.url,
      TDS_MODEL_SERVICE_KEY_FILE: secret("model_key", `${MODEL_KEY}\n`),
    });
    try {
      assert.equal(server.summary.database, `SQLite ${database}`);
      assert.equal(server.summary.admin_api, true);
      // The fake model server lists its models only for the right key.
      assert.match(server.summary.models.join("\n"), /fake-small \(default\)/);

      assert.equal((await fetch(`${server.url}/metrics`)).status, 401);
      const metrics = await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${METRICS}` } });
      assert.equal(metrics.status, 200);
      await metrics.arrayBuffer();
      const orgs = await fetch(`${server.url}/admin/v1/organizations`, { headers: { authorization: `Bearer ${ADMIN}` } });
      assert.equal(orgs.status, 200, await orgs.clone().text());
      await orgs.arrayBuffer();
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });

  test("a file that cannot be read stops the start (exit 2), naming the setting and the path", async () => {
    const missing = join(dir, "no-such-secret");
    const both = secret("admin_both", ADMIN);
    const child = spawnServer({
      TDS_DATABASE_URL: `sqlite:${join(dir, "never.sqlite")}`,
      TDS_MODEL_SERVICE_URL: fake.url,
      TDS_METRICS_TOKEN_FILE: missing,
      TDS_ADMIN_TOKEN: ADMIN,
      TDS_ADMIN_TOKEN_FILE: both,
    });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
    assert.equal(code, 2, stderr);
    assert.equal(stdout, "", "nothing started");
    assert.match(stderr, /^Invalid configuration:/);
    assert.ok(stderr.includes(`  - TDS_METRICS_TOKEN_FILE: the file "${missing}" cannot be read (no such file)\n`), stderr);
    assert.ok(stderr.includes("  - TDS_ADMIN_TOKEN and TDS_ADMIN_TOKEN_FILE are both set: set only one of them\n"), stderr);
    assert.doesNotMatch(stderr, /^\s+at /m, "no stack trace");
    assert.ok(!stderr.includes(ADMIN), "no secret in the message");
  });
});
