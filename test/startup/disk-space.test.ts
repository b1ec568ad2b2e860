/**
 * The start-up check of free space on the SQLite database's volume (TDS_MIN_FREE_DISK_MB): the check itself with an
 * injected statfs, and a real start refused in one line naming the setting.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { freeSpaceFailure, type StatFs } from "../../src/startup/disk-space.ts";
import { StartupFailure } from "../../src/startup/failures.ts";

const MIB = 1024 * 1024;
const ROOT = fileURLToPath(new URL("../../", import.meta.url));

/** A statfs that knows only `folders` (others are ENOENT), each with `freeBytes` available in 4 KiB blocks. */
function fakeStatfs(freeBytes: number, folders: string[]): StatFs & { asked: string[] } {
  const asked: string[] = [];
  const statfs = (path: string) => {
    asked.push(path);
    if (!folders.includes(path)) throw Object.assign(new Error(`ENOENT: ${path}`), { code: "ENOENT" });
    return { bavail: BigInt(Math.floor(freeBytes / 4096)), bsize: 4096n };
  };
  return Object.assign(statfs, { asked });
}

describe("free space on the SQLite database's volume at start", () => {
  test("below the minimum: a StartupFailure naming the free space, the file, both settings and the way out", () => {
    const statfs = fakeStatfs(12 * MIB, ["/srv/tds"]);
    const failure = freeSpaceFailure("sqlite:/srv/tds/tds.sqlite", 64, statfs);
    assert.ok(failure instanceof StartupFailure);
    assert.equal(
      failure.message,
      "Only 12 MiB free on the volume of the SQLite database /srv/tds/tds.sqlite (TDS_DATABASE_URL); at least 64 MiB are needed " +
        "(TDS_MIN_FREE_DISK_MB): free space on that volume, move the database, or lower TDS_MIN_FREE_DISK_MB (0 turns the check off).",
    );
    assert.match(freeSpaceFailure("sqlite:/srv/tds/tds.sqlite", 1, fakeStatfs(300 * 1024, ["/srv/tds"]))!.message, /^Only 300 KiB free/);
  });

  test("enough space, or exactly the minimum: no failure", () => {
    assert.equal(freeSpaceFailure("sqlite:/srv/tds/tds.sqlite", 64, fakeStatfs(64 * MIB, ["/srv/tds"])), null);
    assert.equal(freeSpaceFailure("sqlite:/srv/tds/tds.sqlite", 64, fakeStatfs(10_000 * MIB, ["/srv/tds"])), null);
  });

  test("a folder that does not exist yet: the volume of the nearest one above it", () => {
    const statfs = fakeStatfs(1 * MIB, ["/srv"]);
    assert.match(
      freeSpaceFailure("sqlite:/srv/new/deeper/tds.sqlite", 64, statfs)!.message,
      /Only 1 MiB free .*\/srv\/new\/deeper\/tds\.sqlite/,
    );
    assert.deepEqual(statfs.asked.slice(0, 3), ["/srv/new/deeper", "/srv/new", "/srv"]);
  });

  test("not checked: 0, PostgreSQL, :memory:, or a volume that cannot be examined", () => {
    const nothing = fakeStatfs(0, ["/srv/tds"]);
    assert.equal(freeSpaceFailure("sqlite:/srv/tds/tds.sqlite", 0, nothing), null);
    assert.equal(freeSpaceFailure("postgres://tds:secret@db.internal/tds", 64, nothing), null);
    assert.equal(freeSpaceFailure("sqlite::memory:", 64, nothing), null);
    assert.equal(freeSpaceFailure("sqlite:/srv/tds/tds.sqlite", 64, fakeStatfs(0, [])), null);
    assert.deepEqual(nothing.asked, []);
  });

  test("the real volume: a minimum no volume has stops a real start with one line and exit code 1, creating nothing", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-space-"));
    const file = join(dir, "data", "tds.sqlite");
    try {
      const child = spawn(process.execPath, ["--import", "tsx", "src/server.ts"], {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? "",
          HOME: process.env.HOME ?? "/tmp",
          HOST: "127.0.0.1",
          PORT: "0",
          TDS_BOOTSTRAP: "false",
          TDS_DATABASE_URL: `sqlite:${file}`,
          TDS_MIN_FREE_DISK_MB: "1048576",
        },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stdout = "";
      let stderr = "";
      child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
      child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
      const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
      assert.equal(code, 1, stderr);
      const lines = stderr.trimEnd().split("\n");
      assert.equal(lines.length, 1, stderr);
      assert.match(
        lines[0]!,
        /^Only \d+ [KM]iB free on the volume of the SQLite database .*tds\.sqlite \(TDS_DATABASE_URL\); at least 1048576 MiB are needed \(TDS_MIN_FREE_DISK_MB\)/,
      );
      assert.equal(stdout, "");
      assert.equal(existsSync(join(dir, "data")), false, "nothing created");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
