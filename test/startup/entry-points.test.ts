/**
 * The compiled entry points (`node dist/server.js`, `node bin/tds.mjs`) as users start them: --version, the one-line
 * start-up errors that name the setting to change, and the start-up summary. `npm test` builds dist/ first.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { TEST_POSTGRES_URL } from "../support/postgres-db.ts";
import { freePort } from "../support/redis-server.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const SERVER = join(ROOT, "dist", "server.js");
const TDS = join(ROOT, "bin", "tds.mjs");
const VERSION = (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { version: string }).version;

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a script to its end, or until `until` appears on stdout (then stops it with SIGTERM). */
function run(script: string, args: string[], env: Record<string, string>, options: { cwd?: string; until?: RegExp } = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, ...args], {
      cwd: options.cwd ?? ROOT,
      env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", HOST: "127.0.0.1", PORT: "0", TDS_BOOTSTRAP: "false", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`${script} ${args.join(" ")} did not finish:\n${stdout}\n${stderr}`));
    }, 20_000);
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
      stdout += chunk;
      if (options.until?.test(stdout)) child.kill("SIGTERM");
    });
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** A failed start: exit code, one line on stderr naming the setting, no stack, nothing on stdout. */
function assertOneLineFailure(result: Run, code: number, setting: RegExp): void {
  assert.equal(result.code, code, `exit code; stderr: ${result.stderr}`);
  const lines = result.stderr.trimEnd().split("\n");
  assert.equal(lines.length, 1, `one line: ${result.stderr}`);
  assert.match(lines[0]!, setting);
  assert.doesNotMatch(result.stderr, /^\s+at /m, "no stack trace");
}

describe("entry points", { timeout: 120_000 }, () => {
  let dir: string;
  let fake: FakeModelServer;
  const base = () => ({ TDS_DATABASE_URL: `sqlite:${join(dir, "tds.sqlite")}`, TDS_MODEL_SERVICE_URL: fake.url });
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "tds-entry-"));
    fake = await startFakeModelServer();
  });
  after(async () => {
    await fake.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("--version on the server and the CLI", async () => {
    const server = await run(SERVER, ["--version"], {});
    assert.equal(server.code, 0);
    assert.equal(server.stdout, `typed-decision-service ${VERSION}\n`);
    const cli = await run(TDS, ["--version"], {});
    assert.equal(cli.code, 0);
    assert.equal(cli.stdout, `tds (typed-decision-service) ${VERSION}\n`);
    const unknown = await run(SERVER, ["--port", "1"], {});
    assert.equal(unknown.code, 2);
    assert.match(unknown.stderr, /Unknown argument "--port"/);
  });

  test("a database that refuses the connection names TDS_DATABASE_URL, without its password", async () => {
    const port = await freePort();
    const result = await run(SERVER, [], { ...base(), TDS_DATABASE_URL: `postgres://postgres:s3cret@127.0.0.1:${port}/test` });
    assertOneLineFailure(
      result,
      1,
      new RegExp(
        `PostgreSQL database at postgres://postgres@127\\.0\\.0\\.1:${port}/test \\(TDS_DATABASE_URL\\): the connection was refused`,
      ),
    );
    assert.doesNotMatch(result.stderr, /s3cret/);
  });

  test("a PostgreSQL database that does not exist, and a SQLite folder that cannot be made", async () => {
    const missing = await run(SERVER, [], {
      ...base(),
      TDS_DATABASE_URL: `${TEST_POSTGRES_URL.replace(/\/[^/]*$/, "")}/tds_no_such_database`,
    });
    assertOneLineFailure(missing, 1, /\(TDS_DATABASE_URL\): the database does not exist/);
    writeFileSync(join(dir, "a-file"), "not a folder");
    const blocked = await run(SERVER, [], { ...base(), TDS_DATABASE_URL: `sqlite:${join(dir, "a-file", "tds.sqlite")}` });
    assertOneLineFailure(blocked, 1, /Cannot open the SQLite database at .*a-file\/tds\.sqlite \(TDS_DATABASE_URL\)/);
  });

  test("an address in use names PORT and HOST", async () => {
    const holder = createServer();
    await new Promise<void>((resolve) => holder.listen(0, "127.0.0.1", resolve));
    const port = (holder.address() as { port: number }).port;
    try {
      const result = await run(SERVER, [], { ...base(), PORT: String(port) });
      assertOneLineFailure(result, 1, new RegExp(`Cannot listen on 127\\.0\\.0\\.1:${port}: the address is already in use .*set PORT`));
    } finally {
      holder.close();
    }
  });

  test("every bad setting is named, all at once, exit 2", async () => {
    const result = await run(SERVER, [], {
      ...base(),
      LOG_LEVEL: "verbose",
      TDS_LOG_FORMAT: "xml",
      PORT: "eighty",
      TDS_SERVICE_MODE: "free",
      TDS_REQUESTS_PER_MINUTE: "0",
      TDS_REDIS_URL: "http://127.0.0.1:6379",
      TDS_DATABASE_URL: "mysql://127.0.0.1/tds",
      TDS_ADMIN_TOKEN: "short",
    });
    assert.equal(result.code, 2);
    assert.doesNotMatch(result.stderr, /^\s+at /m);
    for (const setting of [
      "LOG_LEVEL",
      "TDS_LOG_FORMAT",
      "PORT",
      "TDS_SERVICE_MODE",
      "TDS_REQUESTS_PER_MINUTE",
      "TDS_REDIS_URL",
      "TDS_DATABASE_URL",
      "TDS_ADMIN_TOKEN",
    ]) {
      assert.match(result.stderr, new RegExp(`^  - ${setting} `, "m"), `${setting} is named: ${result.stderr}`);
    }
  });

  test("one start-up summary: JSON when not a terminal, readable with TDS_LOG_FORMAT=pretty", async () => {
    const json = await run(SERVER, [], { ...base(), TDS_ADMIN_TOKEN: "adm-entry-points-5Rt8Kq2Zx7Lw4Nv9Bc3" }, { until: /ready at/ });
    const records = json.stdout
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Record<string, any>);
    const summaries = records.filter((r) => r.startup);
    assert.equal(summaries.length, 1, json.stdout);
    const { startup, msg } = summaries[0]!;
    assert.match(msg, new RegExp(`^Typed Decision Service ${VERSION.replace(/\./g, "\\.")} ready at http://127\\.0\\.0\\.1:\\d+\\n`));
    assert.equal(startup.console_url, `${startup.url}/console/`);
    assert.equal(startup.mode, "preview");
    assert.equal(startup.default_model, "fake-small");
    assert.match(
      startup.models.join("\n"),
      new RegExp(`fake-small \\(default\\), fake-large listed by model service .*${fake.url.replace(/[.]/g, "\\.")}`),
    );
    assert.equal(startup.database, `SQLite ${join(dir, "tds.sqlite")}`);
    assert.equal(startup.requests_per_minute, 60);
    assert.equal(startup.admin_api, true);
    assert.doesNotMatch(json.stdout, /aaaaaaaaaaaaaaaa/, "the admin token is never logged");

    const pretty = await run(SERVER, [], { ...base(), TDS_LOG_FORMAT: "pretty", TDS_SERVICE_MODE: "paid" }, { until: /ready at/ });
    assert.doesNotMatch(pretty.stdout, /^\{/m, "no JSON lines");
    assert.match(pretty.stdout, /^\d\d:\d\d:\d\d\.\d{3} INFO {2}Typed Decision Service .* ready at http:\/\/127\.0\.0\.1:\d+$/m);
    for (const label of ["console", "mode", "models", "database", "limits", "admin API"])
      assert.match(pretty.stdout, new RegExp(`^  ${label} +\\S`, "m"));
    assert.match(pretty.stdout, /mode +paid: \$0\.5 per million input tokens/);
    assert.match(pretty.stdout, /admin API +off \(set TDS_ADMIN_TOKEN/);
  });

  test("the CLI names an implicit database, and never creates one: only tds init does", async () => {
    const folder = mkdtempSync(join(dir, "elsewhere-"));
    const env = { TDS_MODEL_SERVICE_URL: fake.url };
    const refused = await run(TDS, ["org", "list"], env, { cwd: folder });
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, new RegExp(`^tds: No database at ${folder}/data/tds\\.sqlite .*never creates one.*tds init`));
    assert.deepEqual(readdirSync(folder), [], "nothing was created");

    const init = await run(TDS, ["init"], env, { cwd: folder });
    assert.equal(init.code, 0, init.stderr);
    assert.match(init.stdout, new RegExp(`^Created the SQLite database ${folder}/data/tds\\.sqlite \\(schema version \\d+\\)`));
    const again = await run(TDS, ["init"], env, { cwd: folder });
    assert.match(again.stdout, /already exists .*nothing to do/);

    const listed = await run(TDS, ["org", "list"], env, { cwd: folder });
    assert.equal(listed.code, 0, listed.stderr);
    assert.match(listed.stderr, new RegExp(`^Using the SQLite database ${folder}/data/tds\\.sqlite \\(the default;`));
    const explicit = await run(TDS, ["org", "list"], { ...env, TDS_DATABASE_URL: `sqlite:${folder}/data/tds.sqlite` }, { cwd: dir });
    assert.equal(explicit.stderr, "", "a database chosen by TDS_DATABASE_URL is not announced");
  });
});
