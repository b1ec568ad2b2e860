/**
 * The storage settings (TDS_SQLITE_WAL_LIMIT_MB, TDS_MIN_FREE_DISK_MB and their config-file keys) and the
 * configuration errors about the database and Redis URLs, which never show a password.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { ConfigError, loadConfig, withoutPassword } from "../src/config.ts";

function problemsOf(env: Record<string, string>): string {
  try {
    loadConfig(env);
  } catch (err) {
    assert.ok(err instanceof ConfigError, String(err));
    return err.message;
  }
  assert.fail("the configuration was accepted");
}

describe("storage settings", () => {
  test("defaults: a 64 MiB WAL bound and 64 MiB of free space at start", () => {
    const config = loadConfig({});
    assert.equal(config.sqliteWalLimitMb, 64);
    assert.equal(config.minFreeDiskMb, 64);
  });

  test("from the environment, which wins over the config file", () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-cfg-"));
    try {
      const file = join(dir, "tds.json");
      writeFileSync(file, JSON.stringify({ sqlite_wal_limit_mb: 16, min_free_disk_mb: 0 }));
      assert.deepEqual((({ sqliteWalLimitMb, minFreeDiskMb }) => ({ sqliteWalLimitMb, minFreeDiskMb }))(loadConfig({ TDS_CONFIG: file })), {
        sqliteWalLimitMb: 16,
        minFreeDiskMb: 0,
      });
      const env = loadConfig({ TDS_CONFIG: file, TDS_SQLITE_WAL_LIMIT_MB: "8", TDS_MIN_FREE_DISK_MB: "128" });
      assert.deepEqual([env.sqliteWalLimitMb, env.minFreeDiskMb], [8, 128]);
      writeFileSync(file, JSON.stringify({ sqlite_wal_limit_mb: 0 }));
      assert.match(problemsOf({ TDS_CONFIG: file }), /sqlite_wal_limit_mb/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("out of range or not a number: a clear message naming the setting", () => {
    assert.match(
      problemsOf({ TDS_SQLITE_WAL_LIMIT_MB: "0" }),
      /TDS_SQLITE_WAL_LIMIT_MB must be a whole number from 1 to 1048576 \(got "0"\)/,
    );
    assert.match(
      problemsOf({ TDS_MIN_FREE_DISK_MB: "lots" }),
      /TDS_MIN_FREE_DISK_MB must be a whole number from 0 to 1048576 \(got "lots"\)/,
    );
  });
});

describe("URLs in configuration errors", () => {
  test("TDS_DATABASE_URL's password is masked in its error", () => {
    const message = problemsOf({ TDS_DATABASE_URL: "postgres://tds:s3cr3t-pw@/tds" });
    assert.match(message, /TDS_DATABASE_URL "postgres:\/\/tds:\*\*\*@\/tds" is not a valid URL/);
    assert.doesNotMatch(message, /s3cr3t-pw/);
    const unparsable = problemsOf({ TDS_DATABASE_URL: "postgres://tds:p@ss w0rd@db host:5432/tds" });
    assert.doesNotMatch(unparsable, /p@ss|w0rd/);
    assert.match(unparsable, /"postgres:\/\/tds:\*\*\*@db host:5432\/tds" is not a valid URL/);
  });

  test("TDS_REDIS_URL's password is masked in its error", () => {
    const message = problemsOf({ TDS_REDIS_URL: "http://default:r3d1s-pw@cache.internal:6379/0" });
    assert.match(
      message,
      /TDS_REDIS_URL must be a redis:\/\/ or rediss:\/\/ URL \(got "http:\/\/default:\*\*\*@cache\.internal:6379\/0"\)/,
    );
    assert.doesNotMatch(message, /r3d1s-pw/);
  });

  test("withoutPassword: the user part's password and password= parameters; other URLs as they are", () => {
    assert.equal(withoutPassword("postgres://u:pw@h:5432/d?sslmode=require"), "postgres://u:***@h:5432/d?sslmode=require");
    assert.equal(
      withoutPassword("postgres://h/d?user=u&password=pw&sslmode=require"),
      "postgres://h/d?user=u&password=***&sslmode=require",
    );
    assert.equal(withoutPassword("redis://:pw@h:6379"), "redis://:***@h:6379");
    assert.equal(withoutPassword("redis://user@h:6379"), "redis://user@h:6379");
    assert.equal(withoutPassword("sqlite:./data/tds.sqlite"), "sqlite:./data/tds.sqlite");
    assert.equal(withoutPassword("postgres://u:a/b@c@h/d"), "postgres://u:***@h/d");
  });
});
