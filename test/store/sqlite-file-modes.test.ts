/**
 * File modes of the SQLite database: a folder the store creates is 0700, the database file and its
 * -wal and -shm files are 0600 whatever the umask; an existing file or folder keeps its mode, and a
 * database file others can read is warned about.
 */
import assert from "node:assert/strict";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";

const mode = (path: string) => statSync(path).mode & 0o777;

describe("SQLite file modes", () => {
  let root: string;
  let umask: number;
  before(() => {
    root = mkdtempSync(join(tmpdir(), "tds-modes-"));
    // The most permissive umask: every mode below is set by the store, not left to the umask.
    umask = process.umask(0);
  });
  after(() => {
    process.umask(umask);
    rmSync(root, { recursive: true, force: true });
  });

  test("a fresh database: folders 0700, the file, -wal and -shm 0600", async () => {
    const path = join(root, "a", "b", "tds.sqlite");
    const warnings: string[] = [];
    const store = openSqliteStore(path, { onWarning: (m) => warnings.push(m) });
    try {
      await store.createOrganization({ id: "org_modes", name: "modes", nowMs: Date.now() });
      for (const suffix of ["-wal", "-shm"]) assert.ok(existsSync(path + suffix), `${suffix} exists while the database is open`);
      assert.equal(mode(join(root, "a")), 0o700);
      assert.equal(mode(join(root, "a", "b")), 0o700);
      assert.equal(mode(path), 0o600);
      assert.equal(mode(`${path}-wal`), 0o600);
      assert.equal(mode(`${path}-shm`), 0o600);
      assert.deepEqual(warnings, []);
    } finally {
      await store.close();
    }
  });

  test("a fresh database in an existing folder: the folder keeps its mode, the files are 0600", async () => {
    const folder = join(root, "shared");
    mkdirSync(folder);
    chmodSync(folder, 0o755);
    const path = join(folder, "tds.sqlite");
    const store = openSqliteStore(path);
    try {
      await store.createOrganization({ id: "org_shared", name: "shared", nowMs: Date.now() });
      assert.equal(mode(folder), 0o755);
      assert.equal(mode(path), 0o600);
      assert.equal(mode(`${path}-wal`), 0o600);
    } finally {
      await store.close();
    }
  });

  test("an existing database others can read: left as it is, with one warning naming the chmod", async () => {
    const path = join(root, "old.sqlite");
    await openSqliteStore(path).close();
    chmodSync(path, 0o644);
    const warnings: string[] = [];
    const store = openSqliteStore(path, { onWarning: (m) => warnings.push(m) });
    await store.close();
    assert.equal(mode(path), 0o644);
    assert.equal(warnings.length, 1);
    assert.match(warnings[0]!, /can be read by other users \(mode 0644\)/);
    assert.ok(warnings[0]!.includes(`chmod 600 ${path} ${path}-wal ${path}-shm`), warnings[0]);

    chmodSync(path, 0o600);
    const quiet: string[] = [];
    await openSqliteStore(path, { onWarning: (m) => quiet.push(m) }).close();
    assert.deepEqual(quiet, []);
  });

  test("an empty file that exists is opened as a new database and keeps its mode", async () => {
    const path = join(root, "empty.sqlite");
    writeFileSync(path, "");
    chmodSync(path, 0o600);
    const store = openSqliteStore(path);
    assert.equal(await store.countOrganizations(), 0);
    await store.close();
    assert.equal(mode(path), 0o600);
  });
});
