/**
 * The admin and metrics tokens must be long and not trivially weak: refused by loadConfig with a message naming the
 * setting, and by the server process at start (exit 2) before anything is opened.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { ConfigError, loadConfig } from "../src/config.ts";
import { weakSecretProblem } from "../src/domain/secret-strength.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url));
const BASE = { TDS_DATABASE_URL: "sqlite::memory:", TDS_BOOTSTRAP: "false" };

function problemsOf(env: Record<string, string>): string[] {
  try {
    loadConfig({ ...BASE, ...env });
    return [];
  } catch (err) {
    if (err instanceof ConfigError) return err.problems;
    throw err;
  }
}

const WEAK: Array<[string, RegExp]> = [
  ["m", /at least 32 characters \(got 1\)/],
  ["a".repeat(32), /fewer than 10 different characters/],
  ["a".repeat(200), /fewer than 10 different characters/],
  ["ababababcdcdcdcd".repeat(3), /fewer than 10 different characters/],
  ["0123456789".repeat(4), /repeats a shorter part/],
  ["Password12!".repeat(3), /repeats a shorter part/],
  ["abcdefghijklmnopqrstuvwxyzABCDEF", /run of consecutive characters/],
  ["zyxwvutsrqponmlkjihgfedcba987654", /run of consecutive characters/],
  ["token with spaces in it 12345678", /whitespace/],
];

describe("admin and metrics tokens", () => {
  it("refuses short and trivially weak tokens, naming the setting", () => {
    for (const [token, reason] of WEAK) {
      for (const setting of ["TDS_ADMIN_TOKEN", "TDS_METRICS_TOKEN"]) {
        const problems = problemsOf({ [setting]: token });
        assert.equal(problems.length, 1, `${setting}=${token}: ${problems.join("; ")}`);
        assert.match(problems[0]!, new RegExp(`^${setting} `), problems[0]);
        assert.match(problems[0]!, reason, problems[0]);
        assert.match(problems[0]!, /generate one with: openssl rand/);
        assert.ok(!problems[0]!.includes(token) || token.length < 2, "the token itself is not repeated in the message");
      }
    }
  });

  it("the admin token may come from the config file's admin_token and is checked the same way, naming the file key", () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-config-secrets-"));
    try {
      const file = join(dir, "config.json");
      writeFileSync(file, JSON.stringify({ admin_token: "abcdefghijklmnopqrstuvwxyzABCDEF" }), { mode: 0o600 });
      const problems = problemsOf({ TDS_CONFIG: file });
      assert.equal(problems.length, 1, problems.join("; "));
      assert.match(problems[0]!, /^admin_token is too easy to guess: it is mostly a run of consecutive characters/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("accepts generated tokens (openssl rand -hex 32, -base64 32) and the kind the tests use", () => {
    for (let i = 0; i < 200; i++) {
      for (const token of [randomBytes(32).toString("hex"), randomBytes(32).toString("base64"), randomBytes(24).toString("base64url")]) {
        assert.equal(weakSecretProblem(token), null, token);
      }
    }
    const config = loadConfig({
      ...BASE,
      TDS_ADMIN_TOKEN: "adm-7Yq2pVx9Lr4Tz8Kw1Nc6Hs3Bd5Fg0Jm",
      TDS_METRICS_TOKEN: randomBytes(32).toString("hex"),
    });
    assert.equal(config.adminToken, "adm-7Yq2pVx9Lr4Tz8Kw1Nc6Hs3Bd5Fg0Jm");
    assert.equal(config.metricsToken?.length, 64);
  });

  it("the server refuses to start with a weak token (exit 2, one line per setting, no stack)", async () => {
    const child = spawn(process.execPath, ["--import", "tsx", "src/server.ts"], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH ?? "",
        HOME: process.env.HOME ?? "/tmp",
        HOST: "127.0.0.1",
        PORT: "0",
        ...BASE,
        TDS_ADMIN_TOKEN: "a".repeat(32),
        TDS_METRICS_TOKEN: "m",
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    let stdout = "";
    child.stderr.on("data", (d) => (stderr += d));
    child.stdout.on("data", (d) => (stdout += d));
    const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
    assert.equal(code, 2, stderr);
    assert.match(stderr, /^Invalid configuration:/);
    assert.match(stderr, /^ {2}- TDS_ADMIN_TOKEN is too easy to guess: it has fewer than 10 different characters/m);
    assert.match(stderr, /^ {2}- TDS_METRICS_TOKEN must be at least 32 characters \(got 1\)/m);
    assert.doesNotMatch(stderr, /^\s+at /m);
    assert.equal(stdout, "", "nothing started");
  });
});
