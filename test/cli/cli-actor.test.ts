/**
 * Who made a CLI change is in the audit log: `--actor NAME`, else the OS user, as the client of a change made on the
 * database (source cli) and as `cli:NAME` of one made through a real gateway's admin API (source http). The real
 * `tds` process records the OS user by default.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir, userInfo } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { runCli } from "../../src/cli/cli.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const PROJECT = fileURLToPath(new URL("../../", import.meta.url));
const ADMIN_TOKEN = "adm-actor-5Kq2Zx9Lw4Nv7Bc1Rt8Hs3Pd";

async function cli(args: string[], env: Record<string, string>) {
  let stdout = "";
  let stderr = "";
  const code = await runCli(args, {
    stdout: { write: (t: string) => (stdout += t) },
    stderr: { write: (t: string) => (stderr += t) },
    env,
  });
  return { code, stdout, stderr };
}

/** The real `tds` process (node --import tsx src/cli/main.ts), with only PATH and HOME from this environment. */
function tdsProcess(args: string[], env: Record<string, string>): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", "src/cli/main.ts", ...args], {
      cwd: PROJECT,
      env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", ...env },
      stdio: ["ignore", "ignore", "pipe"],
    });
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stderr }));
  });
}

describe("the operator of CLI changes in the audit log", () => {
  let gw: Gateway;
  let dir: string;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "tds-cli-actor-"));
    gw = await startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN } });
  });
  after(async () => {
    await gw.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const lastEntry = async () => (await gw.store.listAudit({ limit: 1 })).entries[0]!;

  it("on the database: --actor NAME, else the OS user, as the client of source cli", async () => {
    const db = { TDS_DATABASE_URL: gw.config.databaseUrl };
    const named = await cli(["org", "create", "Named Ltd", "--actor", "Jane Doe"], db);
    assert.equal(named.code, 0, named.stderr);
    assert.deepEqual((({ action, source, client, remoteAddress }) => ({ action, source, client, remoteAddress }))(await lastEntry()), {
      action: "organization.created",
      source: "cli",
      client: "Jane Doe",
      remoteAddress: null,
    });

    const byProcess = await tdsProcess(["org", "pause", "Named Ltd"], db);
    assert.equal(byProcess.code, 0, byProcess.stderr);
    const entry = await lastEntry();
    assert.equal(entry.action, "organization.paused");
    assert.equal(entry.client, userInfo().username, "the OS user when --actor is not given");
  });

  it("over the admin API: client cli:NAME, with the caller's address", async () => {
    const http = { TDS_URL: gw.url, TDS_ADMIN_TOKEN: ADMIN_TOKEN };
    const run = await cli(["--actor", "ops-bob", "key", "create", "--org", "Named Ltd"], http);
    assert.equal(run.code, 0, run.stderr);
    const entry = await lastEntry();
    assert.deepEqual([entry.action, entry.source, entry.client, entry.remoteAddress], ["key.created", "http", "cli:ops-bob", "127.0.0.1"]);
  });

  it("refuses an --actor that cannot be recorded (exit 2)", async () => {
    for (const actor of ["", " padded", "x".repeat(41), "Zoë", "tab\there"]) {
      const run = await cli(["org", "create", "Never", "--actor", actor], { TDS_DATABASE_URL: gw.config.databaseUrl });
      assert.equal(run.code, 2, JSON.stringify(actor));
      assert.match(run.stderr, /^tds: --actor must be 1 to 40 printable ASCII characters/);
    }
    assert.equal(await gw.store.findOrganization("Never"), null);
  });
});
