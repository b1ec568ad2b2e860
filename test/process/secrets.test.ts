/**
 * Secrets kept at start, through real gateway processes with stdout and stderr piped (not a terminal):
 * the first API key goes to a 0600 file and never to an output stream; a config file holding a secret
 * that others can read is warned about; GET /metrics is never left open on a public address.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { bootstrapAndDeliver } from "../../src/bootstrap.ts";
import { isLoopbackHost, servingProblems } from "../../src/config.ts";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const KEY_SHAPE = /tds_[a-z0-9]{12}_[A-Za-z0-9_-]{43}/;

interface Run {
  child: ChildProcess;
  /** stdout and stderr so far, interleaved by arrival. */
  output(): string;
  /** Resolves with the gateway's URL once it listens; rejects if it exits first. */
  listening: Promise<string>;
  exited: Promise<number | null>;
  stop(): Promise<void>;
}

/** Starts src/server.ts with both streams piped; `umask` runs it under that umask (through sh). */
function runGateway(env: Record<string, string>, options: { umask?: string } = {}): Run {
  const node = [process.execPath, "--import", "tsx", "src/server.ts"];
  const [command, ...args] = options.umask === undefined ? node : ["/bin/sh", "-c", `umask ${options.umask} && exec "$@"`, "sh", ...node];
  const child = spawn(command!, args, {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? "",
      HOME: process.env.HOME ?? "/tmp",
      HOST: "127.0.0.1",
      PORT: "0",
      LOG_LEVEL: "info",
      TDS_BOOTSTRAP: "false",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  child.stderr!.on("data", (d) => (output += d));
  const listening = new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      output += `${line}\n`;
      const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(line);
      if (match) resolve(match[1]!);
    });
    void exited.then((code) => reject(new Error(`gateway exited with ${code}:\n${output}`)));
  });
  listening.catch(() => {});
  return {
    child,
    output: () => output,
    listening,
    exited,
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGTERM");
      await exited;
    },
  };
}

const mode = (path: string) => statSync(path).mode & 0o777;

describe("secrets at start, in real gateway processes", { timeout: 120_000 }, () => {
  let dir: string;
  const runs: Run[] = [];
  const start = (env: Record<string, string>, options?: { umask?: string }) => {
    const run = runGateway({ TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9", ...env }, options);
    runs.push(run);
    return run;
  };
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "tds-secrets-"));
  });
  after(async () => {
    await Promise.all(runs.map((r) => r.stop()));
    rmSync(dir, { recursive: true, force: true });
  });

  test("the first API key: written to bootstrap-key.txt next to the database (0600), never to stdout or stderr, and it works", async () => {
    const dataDir = join(dir, "data-default");
    const db = join(dataDir, "tds.sqlite");
    const run = start({ TDS_DATABASE_URL: `sqlite:${db}`, TDS_BOOTSTRAP: "true" });
    const url = await run.listening;
    const keyFile = join(dataDir, "bootstrap-key.txt");
    assert.ok(existsSync(keyFile), run.output());
    assert.equal(mode(keyFile), 0o600);
    assert.equal(mode(dataDir), 0o700);
    const content = readFileSync(keyFile, "utf8");
    assert.match(content, new RegExp(`^${KEY_SHAPE.source}\\n$`));
    const key = content.trim();

    const org = await fetch(`${url}/v1/organization`, { headers: { authorization: `Bearer ${key}` } });
    assert.equal(org.status, 200);
    assert.equal(((await org.json()) as { name: string }).name, "default");

    await run.stop();
    const output = run.output();
    assert.doesNotMatch(output, KEY_SHAPE, "no key-shaped text in stdout or stderr");
    assert.ok(!output.includes(key.slice(-43)), "not even the secret part");
    const line = output.split("\n").find((l) => l.includes("bootstrap-key.txt"));
    assert.ok(line, `one log line says where the key is:\n${output}`);
    const entry = JSON.parse(line) as { level: number; file: string; key_id: string; msg: string };
    assert.equal(entry.level, 30);
    assert.equal(entry.file, keyFile);
    assert.equal(entry.key_id, key.slice(4, 16));

    // A second start finds the organization: no new key, the file is left as it was.
    const again = start({ TDS_DATABASE_URL: `sqlite:${db}`, TDS_BOOTSTRAP: "true" });
    await again.listening;
    await again.stop();
    assert.equal(readFileSync(keyFile, "utf8"), content);
    assert.doesNotMatch(again.output(), /bootstrap-key\.txt|Created organization/);
  });

  test("TDS_BOOTSTRAP_KEY_FILE under umask 000: missing folders 0700, a stale file replaced by a 0600 one", async () => {
    const secretDir = join(dir, "secret");
    mkdirSync(secretDir, { mode: 0o755 });
    chmodSync(secretDir, 0o755);
    const keyFile = join(secretDir, "nested", "deeper", "key.txt");
    mkdirSync(join(secretDir, "nested"));
    chmodSync(join(secretDir, "nested"), 0o755);
    const run = start(
      { TDS_DATABASE_URL: `sqlite:${join(dir, "data-setting", "tds.sqlite")}`, TDS_BOOTSTRAP: "true", TDS_BOOTSTRAP_KEY_FILE: keyFile },
      { umask: "000" },
    );
    const url = await run.listening;
    assert.equal(mode(keyFile), 0o600);
    assert.equal(mode(join(secretDir, "nested", "deeper")), 0o700, "the folder it created");
    assert.equal(mode(join(secretDir, "nested")), 0o755, "an existing folder keeps its mode");
    assert.equal(mode(join(dir, "data-setting")), 0o700);
    assert.equal(mode(join(dir, "data-setting", "tds.sqlite")), 0o600);
    const key = readFileSync(keyFile, "utf8").trim();
    assert.equal((await fetch(`${url}/v1/organization`, { headers: { authorization: `Bearer ${key}` } })).status, 200);
    await run.stop();
    assert.doesNotMatch(run.output(), KEY_SHAPE);
    assert.ok(!existsSync(join(dir, "data-setting", "bootstrap-key.txt")), "only where the setting says");

    // An old file at that path (another database's key) is replaced, and the new one is private too.
    const staleFile = join(dir, "stale-key.txt");
    writeFileSync(staleFile, "tds_old\n", { mode: 0o644 });
    chmodSync(staleFile, 0o644);
    const second = start({
      TDS_DATABASE_URL: `sqlite:${join(dir, "data-stale", "tds.sqlite")}`,
      TDS_BOOTSTRAP: "true",
      TDS_BOOTSTRAP_KEY_FILE: staleFile,
    });
    await second.listening;
    await second.stop();
    assert.equal(mode(staleFile), 0o600);
    assert.match(readFileSync(staleFile, "utf8"), new RegExp(`^${KEY_SHAPE.source}\\n$`));
  });

  test("a key file that cannot be written stops the start before anything is created", async () => {
    const blocker = join(dir, "blocker");
    writeFileSync(blocker, "a file where a folder should be");
    const db = join(dir, "data-blocked", "tds.sqlite");
    const run = start({ TDS_DATABASE_URL: `sqlite:${db}`, TDS_BOOTSTRAP: "true", TDS_BOOTSTRAP_KEY_FILE: join(blocker, "key.txt") });
    assert.equal(await run.exited, 1);
    assert.match(run.output(), /Cannot write the first API key to .*blocker\/key\.txt .*nothing was created/);
    assert.doesNotMatch(run.output(), KEY_SHAPE);
    // Nothing was created: the next start (with a usable path) bootstraps.
    const keyFile = join(dir, "data-blocked", "key.txt");
    const retry = start({ TDS_DATABASE_URL: `sqlite:${db}`, TDS_BOOTSTRAP: "true", TDS_BOOTSTRAP_KEY_FILE: keyFile });
    const url = await retry.listening;
    const key = readFileSync(keyFile, "utf8").trim();
    assert.equal((await fetch(`${url}/v1/organization`, { headers: { authorization: `Bearer ${key}` } })).status, 200);
  });

  test("a config file holding a secret that others can read: one warning naming the file and the chmod, never the secret", async () => {
    const secret = `sk-test-${Math.random().toString(36).slice(2)}`;
    const dbPassword = `pw${Math.random().toString(36).slice(2)}`;
    const file = join(dir, "tds.json");
    writeFileSync(
      file,
      JSON.stringify({
        model_service: { url: "http://127.0.0.1:9", api_key: secret },
        database_url: `postgres://tds:${dbPassword}@127.0.0.1:1/tds`,
      }),
    );
    chmodSync(file, 0o644);
    // The environment's database wins over the file's (which is never dialled here).
    const run = start({ TDS_CONFIG: file, TDS_DATABASE_URL: `sqlite:${join(dir, "data-config", "tds.sqlite")}` });
    await run.listening;
    await run.stop();
    const warnings = run
      .output()
      .split("\n")
      .filter((l) => l.includes("config file"));
    assert.equal(warnings.length, 1, run.output());
    const entry = JSON.parse(warnings[0]!) as { level: number; msg: string };
    assert.equal(entry.level, 40);
    assert.ok(entry.msg.includes(file), entry.msg);
    assert.ok(entry.msg.includes(`chmod 600 ${file}`), entry.msg);
    assert.match(entry.msg, /\(model_service\.api_key, database_url\)/);
    assert.match(entry.msg, /mode 0644/);
    assert.ok(!run.output().includes(secret) && !run.output().includes(dbPassword), "the secrets are never printed");

    chmodSync(file, 0o600);
    const quiet = start({ TDS_CONFIG: file, TDS_DATABASE_URL: `sqlite:${join(dir, "data-config", "tds.sqlite")}` });
    await quiet.listening;
    await quiet.stop();
    assert.doesNotMatch(quiet.output(), /config file/);

    // Readable by others but without a secret: nothing to warn about.
    const plain = join(dir, "plain.json");
    writeFileSync(plain, JSON.stringify({ model_service: { url: "http://127.0.0.1:9" } }));
    chmodSync(plain, 0o644);
    const open = start({ TDS_CONFIG: plain, TDS_DATABASE_URL: `sqlite:${join(dir, "data-config", "tds.sqlite")}` });
    await open.listening;
    await open.stop();
    assert.doesNotMatch(open.output(), /config file/);
  });

  test("HOST 0.0.0.0 without TDS_METRICS_TOKEN is refused (exit 2); with it, /metrics needs the token", async () => {
    const db = `sqlite:${join(dir, "data-metrics", "tds.sqlite")}`;
    for (const host of ["0.0.0.0", "::"]) {
      const refused = start({ HOST: host, TDS_DATABASE_URL: db });
      assert.equal(await refused.exited, 2, refused.output());
      assert.match(refused.output(), /Invalid configuration:/);
      assert.match(refused.output(), /TDS_METRICS_TOKEN/);
      assert.doesNotMatch(refused.output(), /Server listening/);
    }

    const token = "metrics-token-for-the-test-4Kq9Zx2Lw7";
    const run = start({ HOST: "0.0.0.0", TDS_METRICS_TOKEN: token, TDS_DATABASE_URL: db });
    const url = await run.listening;
    assert.equal((await fetch(`${url}/metrics`)).status, 401);
    const ok = await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${token}` } });
    assert.equal(ok.status, 200);
    assert.match(await ok.text(), /tds_http_requests_total/);
    await run.stop();
    assert.ok(!run.output().includes(token), "the token is never logged");

    // Loopback needs no token.
    const local = start({ HOST: "localhost", TDS_DATABASE_URL: db });
    await local.listening;
    await local.stop();
  });

  test("on a terminal the key is printed once and no file is written", async () => {
    const store = openSqliteStore(":memory:");
    const printed: string[] = [];
    const logged: string[] = [];
    const keyFile = join(dir, "terminal", "key.txt");
    const delivery = {
      terminal: { write: (t: string) => printed.push(t) },
      keyFile,
      log: { info: (_: object, m: string) => logged.push(m) },
      nowMs: Date.now,
    };
    const created = await bootstrapAndDeliver(store, delivery);
    assert.ok(created);
    assert.equal(printed.length, 1);
    assert.ok(printed[0]!.includes(`\n    ${created.rawKey}\n`));
    assert.deepEqual(logged, []);
    assert.ok(!existsSync(join(dir, "terminal")), "no file, no folder");
    assert.equal(await bootstrapAndDeliver(store, delivery), null, "once");
    assert.equal(printed.length, 1);
    await store.close();
  });

  test("which addresses count as loopback", () => {
    for (const host of ["127.0.0.1", "127.1.2.3", "localhost", "LOCALHOST", "::1", "[::1]", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"]) {
      assert.equal(isLoopbackHost(host), true, host);
      assert.deepEqual(servingProblems({ host, metricsToken: null }), [], host);
    }
    for (const host of [
      "0.0.0.0",
      "::",
      "[::]",
      "192.168.1.10",
      "10.0.0.1",
      "example.com",
      "api.localhost",
      "128.0.0.1",
      "127.0.0.1.example.com",
      "::ffff:10.0.0.1",
    ]) {
      assert.equal(isLoopbackHost(host), false, host);
      assert.match(servingProblems({ host, metricsToken: null })[0] ?? "", /TDS_METRICS_TOKEN/, host);
      assert.deepEqual(servingProblems({ host, metricsToken: "t" }), [], host);
    }
  });
});
