/**
 * The start-up warning of paid mode about models whose token bound only the request's bytes limit: the function that
 * words it, and the line a real gateway process (src/server.ts) logs before its summary.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { loadConfig } from "../../src/config.ts";
import { reservationWarning } from "../../src/startup/summary.ts";
import { startFakeModelServer } from "../fixtures/fake-model-server.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const BASE = { TDS_DATABASE_URL: "sqlite::memory:", TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9" };

describe("reservationWarning", () => {
  const paid = loadConfig({ ...BASE, TDS_SERVICE_MODE: "paid", TDS_RESERVE_TOKENS: "10000" });

  test("paid mode: names the models without a context, reserve_tokens and the 413", () => {
    const warning = reservationWarning(paid, [
      { name: "small", context: { max_state: 4096 } },
      { name: "large" },
      { name: "lenient", context: { strict: false } },
    ]);
    assert.ok(warning);
    assert.match(warning, /^paid mode: large, lenient publish no context/);
    assert.doesNotMatch(warning, /small/);
    assert.match(warning, /reserve_tokens \(10000\)/);
    assert.match(warning, /more than about 9680 bytes, is refused with 413/);
  });

  test("nothing to say: preview mode, every model with a context, or the models not listed", () => {
    const preview = loadConfig({ ...BASE, TDS_SERVICE_MODE: "preview" });
    assert.equal(reservationWarning(preview, [{ name: "large" }]), null);
    assert.equal(reservationWarning(paid, [{ name: "small", context: { max_branch: 4096 } }]), null);
    assert.equal(reservationWarning(paid, null), null);
  });

  test("an in-process engine counts the tokens itself: not named", () => {
    const engine = loadConfig({
      TDS_DATABASE_URL: "sqlite::memory:",
      TDS_SERVICE_MODE: "paid",
      TDS_MODEL_PATH: "/models/x.gguf",
      TDS_MODEL_NAME: "local",
    });
    assert.equal(reservationWarning(engine, [{ name: "local" }]), null);
  });
});

describe("the gateway process", { timeout: 60_000 }, () => {
  test("in paid mode, warns once at start about the model that publishes no context", async () => {
    const fake = await startFakeModelServer();
    const dir = mkdtempSync(join(tmpdir(), "tds-reserve-warning-"));
    try {
      const output = await runUntilReady({
        TDS_DATABASE_URL: `sqlite:${join(dir, "tds.sqlite")}`,
        TDS_MODEL_SERVICE_URL: fake.url,
        TDS_SERVICE_MODE: "paid",
      });
      const lines = output
        .trim()
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      const warnings = lines.filter((l) => l.component === "reservations");
      assert.equal(warnings.length, 1, output);
      const [warning] = warnings as [{ level: number; msg: string }];
      assert.equal(warning.level, 40, "a warning");
      assert.match(warning.msg, /^paid mode: fake-large publishes no context/, "fake-small publishes one");
      assert.match(warning.msg, /reserve_tokens \(32768\).*refused with 413/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
      await fake.close();
    }
  });
});

/** Runs src/server.ts until its start-up summary, then stops it; its stdout and stderr. */
function runUntilReady(env: Record<string, string>): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", "src/server.ts"], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH ?? "",
        HOME: process.env.HOME ?? "/tmp",
        HOST: "127.0.0.1",
        PORT: "0",
        LOG_LEVEL: "info",
        TDS_LOG_FORMAT: "json",
        TDS_BOOTSTRAP: "false",
        ...env,
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`the gateway did not start:\n${output}`));
    }, 45_000);
    const read = (chunk: string) => {
      output += chunk;
      if (/ready at/.test(output)) child.kill("SIGTERM");
    };
    child.stdout.setEncoding("utf8").on("data", read);
    child.stderr.setEncoding("utf8").on("data", read);
    child.on("close", () => {
      clearTimeout(timer);
      resolve(output);
    });
  });
}
