/**
 * A database that stops taking writes, through a real listening gateway: /readyz answers 503 naming what fails in
 * fixed words (never the driver's, which go to the log), decisions get 503, and once the storage takes writes again
 * the same process serves decisions and /readyz says ok — no restart.
 *
 * - SQLite opened while its file was read-only (chmod 444): SQLite keeps such a connection read-only for good. The
 *   gateway runs as a separate process; as root (for whom file modes do not stop writes) without the capabilities
 *   that let root ignore them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), through util-linux's setpriv.
 * - PostgreSQL made read-only (ALTER DATABASE … SET default_transaction_read_only) and writable again: the pool's
 *   read-only sessions are discarded, with no restart and no help from outside.
 * - A full disk (a small tmpfs mounted for the test; root only): /readyz says "database disk full" after a write met it.
 */
import assert from "node:assert/strict";
import { type ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process";
import { chmodSync, closeSync, mkdtempSync, openSync, rmdirSync, rmSync, statfsSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import pg from "pg";
import pino from "pino";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import { ERROR_CATALOGUE } from "../../src/domain/errors.ts";
import { openSqliteStore, type SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { createTestDatabase, TEST_POSTGRES_URL } from "../support/postgres-db.ts";
import { eventually } from "../support/timer-race.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const AS_ROOT = process.getuid?.() === 0;
/** As root: the command that runs a program for which file modes apply (null when there is no setpriv). */
const MODES_APPLY: string[] | null = AS_ROOT
  ? spawnSync("setpriv", ["--version"]).status === 0
    ? ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    : null
  : [];

interface Readiness {
  status: number;
  text: string;
  checks: { database: string; models: string };
}

async function readiness(url: string): Promise<Readiness> {
  const res = await fetch(`${url}/readyz`);
  const text = await res.text();
  return { status: res.status, text, checks: (JSON.parse(text) as { checks: Readiness["checks"] }).checks };
}

async function decide(url: string, key: string, i: number): Promise<{ status: number; body: string }> {
  const res = await fetch(`${url}/v1/systemone`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(sampleRequest({ state: { i } })),
  });
  return { status: res.status, body: await res.text() };
}

const STORAGE_503 = JSON.stringify({ detail: ERROR_CATALOGUE.storage_unavailable.detail });

/** `src/server.ts` as a separate process for which file modes apply (see MODES_APPLY); resolves once it listens. */
async function startServerProcess(env: Record<string, string>): Promise<{ url: string; child: ChildProcess; lines: string[] }> {
  const [command, ...args] = [...MODES_APPLY!, process.execPath, "--import", "tsx", "src/server.ts"];
  const child = spawn(command!, args, {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? "",
      HOME: "/tmp",
      HOST: "127.0.0.1",
      PORT: "0",
      LOG_LEVEL: "info",
      TDS_LOG_FORMAT: "json",
      TDS_BOOTSTRAP: "false",
      TDS_REQUESTS_PER_MINUTE: "100000",
      TDS_READ_REQUESTS_PER_MINUTE: "100000",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines: string[] = [];
  let stderr = "";
  child.stderr!.on("data", (d) => (stderr += d));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the gateway did not start:\n${stderr}\n${lines.join("\n")}`)), 30_000);
    child.on("exit", (code) => reject(new Error(`the gateway exited with ${code}:\n${stderr}\n${lines.join("\n")}`)));
    createInterface({ input: child.stdout! }).on("line", (line) => {
      lines.push(line);
      const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(line);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]!);
      }
    });
  });
  return { url, child, lines };
}

function stop(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once("exit", () => resolve());
    child.kill("SIGTERM");
    setTimeout(() => child.kill("SIGKILL"), 5000).unref();
  });
}

const logged = (lines: string[]) => lines.flatMap((l) => (l.startsWith("{") ? [JSON.parse(l) as Record<string, unknown>] : []));

describe("a SQLite file read-only when the gateway started, made writable again", { timeout: 120_000 }, () => {
  let fake: FakeModelServer;
  before(async () => {
    fake = await startFakeModelServer();
  });
  after(() => fake.close());

  test("/readyz 503 'database read-only' and decisions 503; after chmod u+w the same process serves again", {
    skip: MODES_APPLY === null && "runs as root without setpriv (util-linux): file modes would not apply",
  }, async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-readonly-"));
    const file = join(dir, "tds.sqlite");
    const setup = openSqliteStore(file);
    const org = await setup.createOrganization({ id: newOrganizationId(), name: "read-only", nowMs: Date.now() });
    const key = generateApiKey();
    await setup.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: Date.now() });
    await setup.close();
    // What an operator's mistake looks like: the database file alone made read-only. The gateway creates its -wal and
    // -shm files with the file's mode (read-only too).
    chmodSync(file, 0o444);
    const gw = await startServerProcess({ TDS_DATABASE_URL: `sqlite:${file}`, TDS_MODEL_SERVICE_URL: fake.url });
    const pid = gw.child.pid;
    try {
      const down = await readiness(gw.url);
      assert.equal(down.status, 503, down.text);
      assert.deepEqual(down.checks, { database: "database read-only", models: "ok" });
      assert.doesNotMatch(down.text, /SQLITE|readonly database|tds\.sqlite/, "the driver's words and the path stay in the log");
      for (let i = 0; i < 3; i++) {
        const refused = await decide(gw.url, key.raw, i);
        assert.deepEqual([refused.status, refused.body], [503, STORAGE_503]);
      }

      // The operator puts the mode back on the database file only: the gateway opens it again (and gives the -wal and
      // -shm files it made the file's mode back), with no restart.
      chmodSync(file, 0o600);
      const served = await eventually(
        "a decision served after the file became writable",
        async () => {
          const answer = await decide(gw.url, key.raw, 100);
          return answer.status === 200 ? answer : undefined;
        },
        60_000,
        200,
      );
      assert.equal(served.status, 200, served.body);
      const up = await eventually(
        "/readyz ok again",
        async () => {
          const r = await readiness(gw.url);
          return r.status === 200 ? r : undefined;
        },
        10_000,
        100,
      );
      assert.deepEqual(up.checks, { database: "ok", models: "ok" });
      assert.equal(gw.child.pid, pid);
      assert.equal(gw.child.exitCode, null, "the same process, never restarted");

      // The process's log lines reach this one through a pipe: wait for the last one expected.
      await eventually(
        "the readiness log line saying the database takes writes again",
        () => (logged(gw.lines).some((l) => l.component === "readiness" && /takes writes again/.test(String(l.msg))) ? true : undefined),
        10_000,
      );
      const lines = logged(gw.lines);
      const warned = lines.filter((l) => l.component === "readiness" && l.level === 40);
      assert.equal(warned.length, 1, "the reason is logged once, not at every probe");
      assert.match(String(warned[0]!.msg), /read-only/);
      assert.match(String(warned[0]!.reason), /SQLITE_READONLY/);
      assert.ok(
        lines.some((l) => l.component === "store" && /takes writes again: opened it again/.test(String(l.msg))),
        "the store says it opened the database again",
      );
    } finally {
      await stop(gw.child);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

function capture(): { lines: Array<Record<string, unknown>>; logger: pino.Logger } {
  const lines: Array<Record<string, unknown>> = [];
  return { lines, logger: pino({ level: "info" }, { write: (text: string) => void lines.push(JSON.parse(text)) }) };
}

describe("a PostgreSQL database made read-only, then writable again", { timeout: 120_000 }, () => {
  let gw: Gateway;
  let db: Awaited<ReturnType<typeof createTestDatabase>>;
  let admin: pg.Client;
  const log = capture();

  before(async () => {
    db = await createTestDatabase("tds_readonly");
    // One connection: no new session the pool might open for concurrent work can hide a read-only one kept.
    gw = await startGateway({ env: { TDS_DATABASE_URL: `${db.url}?pool_size=1` }, loggerInstance: log.logger });
    admin = new pg.Client({ connectionString: TEST_POSTGRES_URL });
    await admin.connect();
  });
  after(async () => {
    await admin.query(`ALTER DATABASE ${db.name} RESET default_transaction_read_only`).catch(() => {});
    await admin.end();
    await gw.close();
    await db.drop();
  });

  test("/readyz 503 'database read-only' and decisions 503; after RESET the pool's read-only sessions are replaced", async () => {
    assert.equal((await decide(gw.url, gw.key, 0)).status, 200);
    assert.deepEqual((await readiness(gw.url)).checks, { database: "ok", models: "ok" });

    await admin.query(`ALTER DATABASE ${db.name} SET default_transaction_read_only = on`);
    // The setting reaches new sessions only: end the gateway's, as a failover to a standby would.
    await admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", [db.name]);
    const down = await eventually(
      "/readyz says read-only",
      async () => {
        const r = await readiness(gw.url);
        return r.checks.database === "database read-only" ? r : undefined;
      },
      20_000,
      100,
    );
    assert.equal(down.status, 503);
    assert.doesNotMatch(down.text, new RegExp(`${db.name}|transaction_read_only|read-only transaction`));
    const refused = await eventually(
      "a decision refused",
      async () => {
        const answer = await decide(gw.url, gw.key, 1);
        return answer.status === 503 ? answer : undefined;
      },
      20_000,
      100,
    );
    assert.equal(refused.body, STORAGE_503);

    // Undone, with nothing done to the gateway's sessions: each read-only one is discarded when it refuses a write
    // or the write check finds it read-only, and the pool opens a new one.
    await admin.query(`ALTER DATABASE ${db.name} RESET default_transaction_read_only`);
    await eventually(
      "decisions served again",
      async () => ((await decide(gw.url, gw.key, 2)).status === 200 ? true : undefined),
      20_000,
      100,
    );
    const up = await eventually(
      "/readyz ok again",
      async () => {
        const r = await readiness(gw.url);
        return r.status === 200 ? r : undefined;
      },
      20_000,
      100,
    );
    assert.deepEqual(up.checks, { database: "ok", models: "ok" });
    const warned = log.lines.filter((l) => l.component === "readiness" && l.level === 40);
    assert.ok(
      warned.some((w) => /read-only/.test(String(w.msg))),
      JSON.stringify(warned),
    );
  });
});

// ── disk full ─────────────────────────────────────────────────────────────────────────────────

/** A tmpfs of `bytes` on a fresh temp dir; null when mounting is not permitted (not root). */
function mountSmallDisk(bytes: number): { dir: string; fill(): void; free(): void; unmount(): void } | null {
  if (!AS_ROOT) return null;
  const dir = mkdtempSync(join(tmpdir(), "tds-full-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${bytes}`, "tmpfs", dir], { stdio: "ignore" });
  } catch {
    rmdirSync(dir);
    return null;
  }
  const filler = join(dir, "filler");
  return {
    dir,
    fill() {
      const fd = openSync(filler, "a");
      try {
        for (const size of [256 * 1024, 4096, 512, 1]) {
          const chunk = Buffer.alloc(size, 1);
          try {
            for (;;) writeSync(fd, chunk);
          } catch (err) {
            if ((err as NodeJS.ErrnoException).code !== "ENOSPC") throw err;
          }
        }
      } finally {
        closeSync(fd);
      }
      assert.equal(statfsSync(dir).bavail, 0, "the file system is full");
    },
    free() {
      rmSync(filler, { force: true });
    },
    unmount() {
      execFileSync("umount", ["-l", dir], { stdio: "ignore" });
      rmdirSync(dir);
    },
  };
}

describe("a full disk under SQLite", { timeout: 60_000 }, () => {
  const disk = mountSmallDisk(8 * 1024 * 1024);
  after(() => disk?.unmount());

  test("/readyz 503 'database disk full' once a write met it; ok again once writes succeed", {
    skip: disk === null && "needs root to mount a tmpfs",
  }, async () => {
    const gw = await startGateway({ env: { TDS_DATABASE_URL: `sqlite:${join(disk!.dir, "tds.sqlite")}` } });
    try {
      assert.equal((await decide(gw.url, gw.key, 0)).status, 200);
      (gw.store as SqliteStore).db.pragma("wal_checkpoint(TRUNCATE)");
      disk!.fill();
      try {
        assert.deepEqual(await decide(gw.url, gw.key, 1), { status: 503, body: STORAGE_503 });
        const down = await eventually(
          "/readyz says disk full",
          async () => {
            const r = await readiness(gw.url);
            return r.checks.database === "database disk full" ? r : undefined;
          },
          10_000,
          100,
        );
        assert.equal(down.status, 503);
      } finally {
        disk!.free();
      }
      assert.equal((await decide(gw.url, gw.key, 2)).status, 200);
      await eventually("/readyz ok again", async () => ((await readiness(gw.url)).status === 200 ? true : undefined), 10_000, 100);
    } finally {
      await gw.close();
    }
  });
});
