/**
 * A SQLite path that is a symbolic link (dangling or not), or whose -wal, -shm or -journal file is one, is refused:
 * SQLite would create or open the file where the link points, with modes the store does not set. Nothing is created
 * at the target. The server says so in one start-up line naming TDS_DATABASE_URL.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { openSqliteStore, SymbolicLinkError } from "../../src/store/sqlite/sqlite-store.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

describe("a SQLite path that is a symbolic link", () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "tds-symlink-"));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("is refused when dangling, and nothing is created where it points", () => {
    const elsewhere = join(dir, "elsewhere");
    mkdirSync(elsewhere);
    const link = join(dir, "dangling.sqlite");
    symlinkSync(join(elsewhere, "target.sqlite"), link);
    assert.throws(
      () => openSqliteStore(link),
      (err: unknown) => {
        assert.ok(err instanceof SymbolicLinkError);
        assert.equal(err.path, link);
        assert.match(err.message, /is a symbolic link \(to .*target\.sqlite\), and links are not followed/);
        return true;
      },
    );
    assert.deepEqual(readdirSync(elsewhere), [], "no file at the target");
    assert.deepEqual(readdirSync(dir).sort(), ["dangling.sqlite", "elsewhere"], "no -wal or -shm beside the link");
  });

  it("is refused when it points at an existing database", async () => {
    const real = join(dir, "real.sqlite");
    await openSqliteStore(real).close();
    const link = join(dir, "to-real.sqlite");
    symlinkSync(real, link);
    assert.throws(() => openSqliteStore(link), SymbolicLinkError);
  });

  it("is refused when the -wal, -shm or -journal file is a link", async () => {
    for (const suffix of ["-wal", "-shm", "-journal"]) {
      const path = join(dir, `db${suffix}.sqlite`);
      await openSqliteStore(path).close();
      const target = join(dir, `target${suffix}`);
      writeFileSync(target, "");
      rmSync(`${path}${suffix}`, { force: true });
      symlinkSync(target, `${path}${suffix}`);
      assert.throws(
        () => openSqliteStore(path),
        (err: unknown) => err instanceof SymbolicLinkError && err.path === `${path}${suffix}`,
      );
    }
  });

  it("stops the server at start with one line naming TDS_DATABASE_URL", async () => {
    const target = join(dir, "server-target", "tds.sqlite");
    mkdirSync(join(dir, "server-target"));
    const link = join(dir, "server.sqlite");
    symlinkSync(target, link);
    const child = spawn(process.execPath, ["--import", "tsx", "src/server.ts"], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH ?? "",
        HOME: process.env.HOME ?? "/tmp",
        HOST: "127.0.0.1",
        PORT: "0",
        TDS_BOOTSTRAP: "false",
        TDS_DATABASE_URL: `sqlite:${link}`,
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    child.stdout.resume();
    const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
    assert.equal(code, 1, stderr);
    const lines = stderr.trimEnd().split("\n");
    assert.equal(lines.length, 1, stderr);
    assert.match(
      lines[0]!,
      /^Cannot open the SQLite database at .* \(TDS_DATABASE_URL\): .*server\.sqlite is a symbolic link \(to .*tds\.sqlite\)/,
    );
    assert.equal(existsSync(target), false, "nothing created at the target");
  });
});
