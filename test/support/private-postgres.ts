/**
 * A private, throwaway PostgreSQL cluster for one test, for faults that must not touch the shared server on
 * 127.0.0.1:5432 (a restart): `initdb` into a temporary directory, `pg_ctl start` on a free loopback port with
 * trust authentication, restarts in pg_ctl's fast and immediate (crash-like) modes, and a stop that also removes the
 * directory. Root cannot run PostgreSQL: as root the cluster belongs to, and runs as, the `postgres` OS user.
 */
import { execFile, spawnSync } from "node:child_process";
import { chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { freePort } from "./redis-server.ts";

/** Settings for a disposable cluster. fsync=off loses nothing on an immediate shutdown (the OS still has every write). */
const SERVER_SETTINGS = ["fsync=off", "full_page_writes=off", "shared_buffers=32MB", "max_connections=60", "log_min_messages=warning"];
const PG_CTL_WAIT_SECONDS = 60;
const START_ATTEMPTS = 3;

export type RestartMode = "fast" | "immediate";

export interface PrivatePostgres {
  port: number;
  /** The URL of a database of this cluster (user postgres, trust). */
  urlOf(database: string): string;
  /** Creates an empty database and returns its URL. */
  createDatabase(name: string): Promise<string>;
  /** `pg_ctl restart -m <mode>`; resolves once the server accepts connections again, with how long it took (ms). */
  restart(mode: RestartMode): Promise<number>;
  /** Stops the server (immediately) and removes its directory; safe to call twice. */
  stop(): Promise<void>;
  /** The server's log so far (for failure messages). */
  log(): string;
}

/** The directory of initdb, pg_ctl and postgres: `pg_config --bindir`, else the newest /usr/lib/postgresql/N/bin. */
export function findPostgresBinaries(): string | null {
  const candidates: string[] = [];
  const fromPgConfig = spawnSync("pg_config", ["--bindir"], { encoding: "utf8" });
  if (fromPgConfig.status === 0) candidates.push(fromPgConfig.stdout.trim());
  const debianRoot = "/usr/lib/postgresql";
  if (existsSync(debianRoot)) {
    const versions = readdirSync(debianRoot)
      .filter((v) => /^\d+(\.\d+)?$/.test(v))
      .sort((a, b) => Number(b) - Number(a));
    candidates.push(...versions.map((v) => join(debianRoot, v, "bin")));
  }
  return candidates.find((dir) => ["initdb", "pg_ctl", "postgres"].every((tool) => existsSync(join(dir, tool)))) ?? null;
}

/** The OS user the cluster runs as: null for the current user; as root, the `postgres` user's ids. */
function clusterOwner(): { uid: number; gid: number } | null | "missing" {
  if (process.getuid?.() !== 0) return null;
  const id = (flag: string) => spawnSync("id", [flag, "postgres"], { encoding: "utf8" });
  const [uid, gid] = [id("-u"), id("-g")];
  if (uid.status !== 0 || gid.status !== 0) return "missing";
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
}

/** Why no private cluster can be started here (a skip reason), or null when one can. */
export function privatePostgresUnavailable(): string | null {
  if (!findPostgresBinaries()) {
    return "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in `pg_config --bindir` or /usr/lib/postgresql/*/bin: install the postgresql package (scripts/ensure-services.sh does)";
  }
  if (clusterOwner() === "missing") return "running as root, and there is no `postgres` OS user to run a private PostgreSQL cluster as";
  return null;
}

/**
 * Starts a private cluster; `cleanup` (a test's `t.after`) is given its stop, so it goes away however the test ends.
 * Throws (with the server's log) when it cannot start; check privatePostgresUnavailable() first to skip instead.
 */
export async function startPrivatePostgres(cleanup: (fn: () => Promise<void>) => void): Promise<PrivatePostgres> {
  const bindir = findPostgresBinaries();
  const owner = clusterOwner();
  if (!bindir || owner === "missing") throw new Error(privatePostgresUnavailable() ?? "no private PostgreSQL");
  const dir = mkdtempSync(join(tmpdir(), "tds-pg-"));
  if (owner) chownSync(dir, owner.uid, owner.gid);
  const dataDir = join(dir, "data");
  const logFile = join(dir, "postgres.log");
  const runAs = { cwd: dir, ...(owner ?? {}) };
  const log = () => (existsSync(logFile) ? readFileSync(logFile, "utf8") : "");

  let stopped = false;
  const stopNow = () => {
    if (stopped) return;
    stopped = true;
    spawnSync(join(bindir, "pg_ctl"), ["stop", "-D", dataDir, "-m", "immediate", "-w"], { ...runAs, stdio: "ignore" });
    rmSync(dir, { recursive: true, force: true });
  };
  // A test runner that exits without running the test's cleanup (or is told to stop) still takes its cluster down.
  const onSignal = (signal: NodeJS.Signals) => {
    stopNow();
    process.kill(process.pid, signal);
  };
  process.once("exit", stopNow);
  process.once("SIGTERM", onSignal);
  process.once("SIGINT", onSignal);
  const stop = async () => {
    process.off("exit", stopNow);
    process.off("SIGTERM", onSignal);
    process.off("SIGINT", onSignal);
    if (stopped) return;
    await pgCtl(bindir, runAs, ["stop", "-D", dataDir, "-m", "immediate", "-w"]).catch(() => undefined);
    stopNow();
  };
  cleanup(stop);

  const initdb = spawnSync(
    join(bindir, "initdb"),
    ["-D", dataDir, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"],
    { ...runAs, encoding: "utf8" },
  );
  if (initdb.status !== 0) throw new Error(`initdb failed (${initdb.status}):\n${initdb.stdout}\n${initdb.stderr}`);

  let port = 0;
  const serverOptions = () =>
    [`-p ${port}`, `-k ${dir}`, "-c listen_addresses=127.0.0.1", ...SERVER_SETTINGS.map((s) => `-c ${s}`)].join(" ");
  const ctl = (args: string[]) =>
    pgCtl(bindir, runAs, [...args, "-D", dataDir, "-l", logFile, "-w", "-t", String(PG_CTL_WAIT_SECONDS), "-o", serverOptions()]);
  // The free port may be taken by someone else before the server binds it: try another.
  for (let attempt = 1; ; attempt++) {
    port = await freePort();
    try {
      await ctl(["start"]);
      break;
    } catch (err) {
      if (attempt >= START_ATTEMPTS) throw new Error(`${(err as Error).message}\nserver log:\n${log()}`);
    }
  }

  const urlOf = (database: string) => `postgres://postgres@127.0.0.1:${port}/${database}`;
  return {
    port,
    urlOf,
    async createDatabase(name) {
      const admin = new pg.Client({ connectionString: urlOf("postgres") });
      await admin.connect();
      try {
        await admin.query(`CREATE DATABASE ${admin.escapeIdentifier(name)}`);
      } finally {
        await admin.end();
      }
      return urlOf(name);
    },
    async restart(mode) {
      const startedAt = Date.now();
      try {
        await ctl(["restart", "-m", mode]);
      } catch (err) {
        throw new Error(`${(err as Error).message}\nserver log:\n${log()}`);
      }
      return Date.now() - startedAt;
    },
    stop,
    log,
  };
}

/** Runs pg_ctl without blocking the event loop (the load a test runs meanwhile goes on). */
function pgCtl(bindir: string, runAs: { cwd: string; uid?: number; gid?: number }, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(join(bindir, "pg_ctl"), args, { ...runAs, encoding: "utf8" }, (err, stdout, stderr) => {
      if (err) reject(new Error(`pg_ctl ${args[0]} failed: ${err.message}\n${stdout}\n${stderr}`));
      else resolve();
    });
  });
}
