/**
 * Secrets from files: each secret setting X may instead be given as X_FILE, the path of a file holding it (Docker and
 * Compose secrets). The file's content without its trailing newline is the value; X and X_FILE together, or a file
 * that cannot be used, is a configuration error naming the setting and the path, never the content.
 */
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { ConfigError, loadConfig } from "../src/config.ts";
import { MAX_SECRET_FILE_BYTES, SECRET_FILE_SETTINGS, withSecretFiles } from "../src/config-secret-files.ts";

const ADMIN = "adm-7Yq2pVx9Lr4Tz8Kw1Nc6Hs3Bd5Fg0Jm";
const METRICS = "3f9c1a7e5b2d8046c1e9a7f3b5d2084c6e1a9f7b3d5c2e0841f6a9c7e3b5d1f0";
const BASE = { TDS_BOOTSTRAP: "false" };

function problemsOf(env: Record<string, string>): string[] {
  try {
    loadConfig({ ...BASE, ...env });
    return [];
  } catch (err) {
    if (err instanceof ConfigError) return err.problems;
    throw err;
  }
}

describe("secrets from files (X_FILE)", () => {
  let dir: string;
  const file = (name: string, content: string) => {
    const path = join(dir, name);
    writeFileSync(path, content, { mode: 0o600 });
    return path;
  };
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "tds-secret-files-"));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("covers every secret setting of the environment", () => {
    assert.deepEqual(
      SECRET_FILE_SETTINGS.map((s) => [s.setting, s.file]).sort(),
      ["TDS_ADMIN_TOKEN", "TDS_DATABASE_URL", "TDS_METRICS_TOKEN", "TDS_MODEL_SERVICE_KEY", "TDS_REDIS_URL"].map((s) => [s, `${s}_FILE`]),
    );
  });

  it("reads each value from its file, without the trailing newline", () => {
    const config = loadConfig({
      ...BASE,
      TDS_ADMIN_TOKEN_FILE: file("admin", `${ADMIN}\n`),
      TDS_METRICS_TOKEN_FILE: file("metrics", `${METRICS}\r\n`),
      TDS_DATABASE_URL_FILE: file("database", "postgres://tds:s3cret-pw@db.internal:5432/tds\n"),
      TDS_REDIS_URL_FILE: file("redis", "redis://:r3dis-pw@redis.internal:6379"),
      TDS_MODEL_SERVICE_URL: "http://127.0.0.1:11434",
      TDS_MODEL_SERVICE_KEY_FILE: file("model-key", "sk-model-key-123\n\n"),
    });
    assert.equal(config.adminToken, ADMIN);
    assert.equal(config.metricsToken, METRICS);
    assert.equal(config.databaseUrl, "postgres://tds:s3cret-pw@db.internal:5432/tds");
    assert.equal(config.redisUrl, "redis://:r3dis-pw@redis.internal:6379");
    assert.deepEqual(
      config.modelServices.map((s) => s.apiKey),
      ["sk-model-key-123"],
    );
  });

  it("keeps everything but trailing line breaks (a value is checked as if it were set directly)", () => {
    const problems = problemsOf({ TDS_ADMIN_TOKEN_FILE: file("spaced", ` ${ADMIN} two\n`) });
    assert.equal(problems.length, 1, problems.join("; "));
    assert.match(problems[0]!, /^TDS_ADMIN_TOKEN /);
  });

  it("refuses a setting given both directly and as a file, naming both", () => {
    const problems = problemsOf({ TDS_ADMIN_TOKEN: ADMIN, TDS_ADMIN_TOKEN_FILE: file("admin-both", ADMIN) });
    assert.deepEqual(problems, ["TDS_ADMIN_TOKEN and TDS_ADMIN_TOKEN_FILE are both set: set only one of them"]);
  });

  it("refuses a file that cannot be used, naming the setting and the path, never the content", () => {
    const missing = join(dir, "no-such-file");
    const folder = join(dir, "a-folder");
    mkdirSync(folder);
    const empty = file("empty", "\n");
    const huge = file("huge", "x".repeat(MAX_SECRET_FILE_BYTES + 1));
    const problems = problemsOf({
      TDS_METRICS_TOKEN_FILE: missing,
      TDS_DATABASE_URL_FILE: folder,
      TDS_REDIS_URL_FILE: empty,
      TDS_ADMIN_TOKEN_FILE: huge,
    });
    assert.deepEqual(problems.sort(), [
      `TDS_ADMIN_TOKEN_FILE: the file "${huge}" is larger than ${MAX_SECRET_FILE_BYTES} bytes`,
      `TDS_DATABASE_URL_FILE: the file "${folder}" is not a regular file`,
      `TDS_METRICS_TOKEN_FILE: the file "${missing}" cannot be read (no such file)`,
      `TDS_REDIS_URL_FILE: the file "${empty}" is empty`,
    ]);
  });

  it("refuses a file the process may not read, without showing its content", {
    skip: process.getuid?.() === 0 && "root reads any file",
  }, () => {
    const locked = file("locked", "postgres://tds:l0cked-pw@db.internal/tds");
    chmodSync(locked, 0o000);
    const problems = problemsOf({ TDS_DATABASE_URL_FILE: locked });
    assert.deepEqual(problems, [`TDS_DATABASE_URL_FILE: the file "${locked}" cannot be read (permission denied)`]);
  });

  it("treats an empty or blank variable as unset, as every other setting", () => {
    const env = { TDS_ADMIN_TOKEN: "", TDS_ADMIN_TOKEN_FILE: " ", TDS_METRICS_TOKEN: ADMIN, TDS_METRICS_TOKEN_FILE: "" };
    const problems: string[] = [];
    assert.deepEqual(withSecretFiles(env, problems), env);
    assert.deepEqual(problems, []);
  });

  it("returns a new environment and leaves the given one alone", () => {
    const env = { TDS_ADMIN_TOKEN_FILE: file("admin-copy", ADMIN), OTHER: "kept" };
    const problems: string[] = [];
    const out = withSecretFiles(env, problems);
    assert.deepEqual(problems, []);
    assert.equal(out.TDS_ADMIN_TOKEN, ADMIN);
    assert.equal(out.OTHER, "kept");
    assert.equal("TDS_ADMIN_TOKEN" in env, false);
  });
});
