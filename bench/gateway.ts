/**
 * What the gateway costs on top of the model service, measured on this machine, loopback only.
 *
 *   npx tsx bench/gateway.ts [--runs 3] [--seconds 5] [--connections 32] [--rate 300] [--paced-seconds 5] [--no-postgres]
 *       [--memory [--memory-seconds 180]] [--profile] [--perf] [--profile-seconds 10] [--store-costs] [--no-comparison]
 *       [--vacuum] [--lanes N] [--orgs N]
 *
 * Processes, each its own and all up for the whole comparison: bench/precomputed-model.ts, a System One server that
 * answers every request with the same precomputed bytes, so that the model server's cost does not mask the gateway's
 * ((a) is it called directly); (b) bench/passthrough-proxy.ts in front of it, the least a gateway can do; the
 * gateway (src/server.ts) in front of it in (c) preview and (d) paid mode on SQLite, (e) and (f) the same on
 * PostgreSQL (a scratch database of the local server, when reachable), and (c') as (c) logging at LOG_LEVEL=info to
 * a file (the others log at warn). Every request is bench/support.ts realisticRequest().
 *
 * The comparison is `--runs` runs. A run takes the setups in turns, SLICES times each: a slice is a fixed number of
 * requests (about `--seconds`/SLICES worth at the warm-up's rate) over `--connections` connections (autocannon);
 * then every setup but (a) and (c') gets `--paced-seconds` at `--rate` req/s evenly paced (open loop, undici).
 * Around every slice it reads the CPU time of the measured process from /proc (every thread's schedstat, in ns; see
 * proc-cpu.ts), of the model server, and for (e)/(f) of PostgreSQL's backends of the bench database and its shared
 * processes, PostgreSQL's WAL position, and the gateway's tds_store_batch_steps and tds_store_commit_seconds
 * histograms (GET /metrics, outside the CPU window). CPU time per request does not depend on how the two cores were
 * shared with the load generator and the other processes, unlike throughput: it is the primary figure.
 *
 * Prints, per run and as the median of the runs' ratios: gateway CPU µs per request ÷ the proxy's at saturation
 * (targets ≤ 2.5× preview and ≤ 3× paid on SQLite, ≤ 4× and ≤ 5× on PostgreSQL) with the throughput ratio beside
 * it; added p50/p99 at `--rate` req/s evenly paced (target p99 ≤ +2 ms); CPU per request at that rate; group-commit
 * figures (steps per transaction, transactions per request, commit time); the inputs of a PostgreSQL capacity model
 * (gateway and PostgreSQL CPU µs, WAL bytes and transactions per request). Targets are printed, never asserted.
 * The default comparison takes about 4–5 minutes.
 *
 * --memory        a fresh paid SQLite gateway at `--rate` req/s evenly paced for `--memory-seconds` (default 180):
 *                 RSS (/proc) and V8 heap (its GET /metrics) every 5 s, and whether memory stayed flat.
 * --profile       a fresh gateway of each of (c) to (f) under `node --cpu-prof`, 2 s warm-up + `--profile-seconds` at
 *                 `--connections`: CPU per request, top self-time functions and packages, inclusive src/ functions.
 * --perf          the same under Linux perf (on-CPU samples, kernel and native code included; V8's profile counts wall
 *                 time while not idle, so a thread preempted in a syscall shows there as that syscall). Kernel symbols
 *                 need root or kernel.perf_event_paranoid ≤ 1.
 * --store-costs   store.commitBatch timed directly, batches of 1, 8 and 32 requests (bench/store-costs.ts).
 * --no-comparison skips the comparison, to run only the parts above.
 * --vacuum        VACUUM (ANALYZE) the PostgreSQL database before each run and profile. Off by default: the local server
 *                 runs with autovacuum off, as some operators do, and the gateway's plans must not depend on statistics.
 * --lanes N       TDS_BOOKKEEPING_LANES for the gateways (their default when absent).
 * --orgs N        each gateway setup gets N organizations (each with a key) and the load takes their keys in turn
 *                 (default 1: one organization, so one bookkeeping lane).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { cpus, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import pg from "pg";
import { createTestDatabase, TEST_POSTGRES_URL } from "../test/support/postgres-db.ts";
import { freePort } from "../test/support/redis-server.ts";
import { summarizeProfile } from "./cpu-profile.ts";
import { type Endpoint, headersOf, median, paced as pacedLoad, percentile, type Samples, saturate as saturateLoad } from "./load.ts";
import { perfAvailable, perfNodeArgs, perfRecord, perfSummary, removePerfMap } from "./perf-profile.ts";
import { addCpu, type CpuReading, cpuSince, postgresCpuSince, readCpu, readPostgresCpu } from "./proc-cpu.ts";
import { storeCosts } from "./store-costs.ts";
import {
  OPEN_LIMITS,
  provisionOrg,
  ROOT,
  realisticRequest,
  type Started,
  startPassthroughProxy,
  startPrecomputedModel,
} from "./support.ts";

const { values } = parseArgs({
  options: {
    runs: { type: "string", default: "3" },
    seconds: { type: "string", default: "5" },
    connections: { type: "string", default: "32" },
    rate: { type: "string", default: "300" },
    "paced-seconds": { type: "string", default: "5" },
    memory: { type: "boolean", default: false },
    "memory-seconds": { type: "string", default: "180" },
    profile: { type: "boolean", default: false },
    "profile-seconds": { type: "string", default: "10" },
    perf: { type: "boolean", default: false },
    "store-costs": { type: "boolean", default: false },
    "no-postgres": { type: "boolean", default: false },
    "no-comparison": { type: "boolean", default: false },
    vacuum: { type: "boolean", default: false },
    lanes: { type: "string" },
    orgs: { type: "string", default: "1" },
  },
});
const RUNS = Number(values.runs);
const SECONDS = Number(values.seconds);
const CONNECTIONS = Number(values.connections);
const RATE = Number(values.rate);
const PACED_SECONDS = Number(values["paced-seconds"]);
const ORGS = Number(values.orgs);
const MEMORY_SECONDS = Number(values["memory-seconds"]);
const PROFILE_SECONDS = Number(values["profile-seconds"]);
/** Saturating slices per setup and run, taken in turns. */
const SLICES = 4;
const WARMUP_SECONDS = 2;
const BODY = JSON.stringify(realisticRequest());
/** Enough for every paid request of the run (a reservation is 32768 tokens × 0.5 USD per million = 16384 microUSD). */
const PAID_GRANT = 1_000_000_000_000;
/** Targets of gateway CPU per request ÷ the proxy's, by setup. */
const CPU_TARGETS: Record<string, number> = { c: 2.5, d: 3, e: 4, f: 5 };
const ADDED_P99_TARGET_MS = 2;

const started = Date.now();
const log = (msg: string) => process.stderr.write(`[${((Date.now() - started) / 1000).toFixed(0).padStart(3)} s] ${msg}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const f0 = (v: number) => (Number.isFinite(v) ? v.toFixed(0) : "–");
const f1 = (v: number) => (Number.isFinite(v) ? v.toFixed(1) : "–");
const f2 = (v: number) => (Number.isFinite(v) ? v.toFixed(2) : "–");
const signed = (v: number) => (Number.isFinite(v) ? `${v >= 0 ? "+" : ""}${v.toFixed(2)}` : "–");

const saturate = (target: Endpoint, opts: { connections: number; amount?: number; seconds?: number }) => saturateLoad(target, BODY, opts);
const paced = (target: Endpoint, opts: { seconds: number; rate: number }) => pacedLoad(target, BODY, opts);

// ── processes ────────────────────────────────────────────────────────────────────────────────

interface GatewayProc extends Started {
  pid: number;
}

/** src/server.ts as its own process; its stdout (its logs) goes to `logFile`, or nowhere. */
async function spawnGateway(env: Record<string, string>, options: { logFile?: string; nodeArgs?: string[] } = {}): Promise<GatewayProc> {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const out = options.logFile ? openSync(options.logFile, "w") : "ignore";
  const child: ChildProcess = spawn(process.execPath, [...(options.nodeArgs ?? []), "--import", "tsx", "src/server.ts"], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? "",
      HOME: process.env.HOME ?? "/tmp",
      HOST: "127.0.0.1",
      PORT: String(port),
      LOG_LEVEL: "warn",
      TDS_BOOTSTRAP: "false",
      ...env,
    },
    stdio: ["ignore", out, "inherit"],
  });
  if (typeof out === "number") closeSync(out);
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`gateway exited with ${child.exitCode}`);
    try {
      if ((await fetch(`${url}/api/config`)).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error("gateway did not start within 30 s");
    await sleep(100);
  }
  const stop = () =>
    new Promise<void>((r) => {
      if (child.exitCode !== null) return r();
      child.once("exit", () => r());
      child.kill("SIGTERM");
      setTimeout(() => child.kill("SIGKILL"), 10_000).unref();
    });
  return { url, child, pid: child.pid!, stop };
}

/** One request must be answered 200: the precomputed answers are accepted, the key and the credits work. */
async function checkAccepted(name: string, target: Endpoint): Promise<void> {
  const res = await fetch(`${target.url}/v1/systemone`, { method: "POST", headers: headersOf(target), body: BODY });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`${name} answered ${res.status} instead of 200: ${text.slice(0, 500)}`);
}

/** A field of /proc/<pid>/status in MB (VmRSS, RssAnon: malloc and V8 heap, RssFile / RssShmem: mapped files). */
function statusMb(pid: number, field: string): number {
  const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : Number.NaN;
}

const rssMb = (pid: number) => statusMb(pid, "VmRSS");

/** One value (or the sum of a labelled family) of a Prometheus text exposition. */
function promValue(text: string, name: string): number {
  let sum = 0;
  for (const m of text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? ([-+0-9.eE]+|NaN)$`, "gm"))) sum += Number(m[1]);
  return sum;
}

async function scrape(url: string): Promise<string> {
  return (await fetch(`${url}/metrics`)).text();
}

/** The group committer's histograms: steps committed, transactions, and their total duration. */
interface CommitCounters {
  steps: number;
  transactions: number;
  commits: number;
  commitSeconds: number;
}

function commitCounters(metrics: string): CommitCounters {
  return {
    steps: promValue(metrics, "tds_store_batch_steps_sum"),
    transactions: promValue(metrics, "tds_store_batch_steps_count"),
    commits: promValue(metrics, "tds_store_commit_seconds_count"),
    commitSeconds: promValue(metrics, "tds_store_commit_seconds_sum"),
  };
}

// ── setups ───────────────────────────────────────────────────────────────────────────────────

interface Target extends Endpoint {
  id: string;
  name: string;
  pid: number;
  kind: "model" | "proxy" | "gateway";
  /** The PostgreSQL database of a gateway on PostgreSQL. */
  database?: string;
  /** Measured at the paced rate too. */
  paced: boolean;
}

/** How a gateway setup is started: its environment, its key and (PostgreSQL) its database. */
interface GatewaySetup {
  id: string;
  name: string;
  env: Record<string, string>;
  keys: string[];
  database?: string;
  logFile?: string;
}

/** The server settings that matter for the figures. */
async function postgresSettings(url: string): Promise<string> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const rows = (
      await client.query<{ name: string; setting: string }>(
        "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', 'autovacuum', 'synchronous_commit', 'fsync', 'full_page_writes', 'shared_buffers') ORDER BY name",
      )
    ).rows;
    return rows.map((r) => `${r.name}=${r.setting}`).join(", ");
  } finally {
    await client.end();
  }
}

/** `--orgs` organizations in the database, each with a key (and credits); their keys. */
async function provisionOrgs(databaseUrl: string, creditsMicrousd = 0): Promise<string[]> {
  const keys: string[] = [];
  for (let i = 0; i < ORGS; i++) keys.push(await provisionOrg(databaseUrl, creditsMicrousd));
  return keys;
}

/** The gateway setups (c) to (f) and (c'), with their databases provisioned. */
async function gatewaySetups(
  modelUrl: string,
  dir: string,
  cleanups: Array<() => Promise<void>>,
  notes: string[],
): Promise<GatewaySetup[]> {
  const base = {
    TDS_MODEL_SERVICE_URL: modelUrl,
    ...OPEN_LIMITS,
    ...(values.lanes !== undefined ? { TDS_BOOKKEEPING_LANES: values.lanes } : {}),
  };
  const sqlite = async (id: string, name: string, mode: "preview" | "paid", extra: Record<string, string> = {}): Promise<GatewaySetup> => {
    const url = `sqlite:${join(dir, `${id.replace("'", "-info")}.sqlite`)}`;
    const keys = await provisionOrgs(url, mode === "paid" ? PAID_GRANT : 0);
    return { id, name, env: { ...base, TDS_DATABASE_URL: url, TDS_SERVICE_MODE: mode, ...extra }, keys };
  };
  const setups = [await sqlite("c", "(c) gateway, preview, SQLite", "preview"), await sqlite("d", "(d) gateway, paid, SQLite", "paid")];
  if (values["no-postgres"]) {
    notes.push("PostgreSQL setups skipped (--no-postgres).");
  } else {
    try {
      const db = await createTestDatabase("tds_bench_gw");
      cleanups.push(() => db.drop());
      notes.push(
        `PostgreSQL: ${await postgresSettings(db.url)}; ${
          values.vacuum
            ? "the bench runs VACUUM (ANALYZE) on its database before each run and each profile"
            : "never vacuumed nor analyzed (no --vacuum)"
        }${values.lanes !== undefined ? `; TDS_BOOKKEEPING_LANES=${values.lanes}` : ""}; ${ORGS} organization(s) per setup, their keys in turn.`,
      );
      const env = (mode: string) => ({ ...base, TDS_DATABASE_URL: db.url, TDS_SERVICE_MODE: mode });
      setups.push({
        id: "e",
        name: "(e) gateway, preview, PostgreSQL",
        env: env("preview"),
        keys: await provisionOrgs(db.url),
        database: db.name,
      });
      setups.push({
        id: "f",
        name: "(f) gateway, paid, PostgreSQL",
        env: env("paid"),
        keys: await provisionOrgs(db.url, PAID_GRANT),
        database: db.name,
      });
    } catch (err) {
      notes.push(`PostgreSQL setups skipped: ${(err as Error).message}`);
    }
  }
  const info = await sqlite("c'", "(c') gateway, preview, SQLite, LOG_LEVEL=info", "preview", { LOG_LEVEL: "info" });
  setups.push({ ...info, logFile: join(dir, "info.log") });
  return setups;
}

// ── measured slices ──────────────────────────────────────────────────────────────────────────

/** What one or more slices of one setup cost. CPU in ns; PostgreSQL fields only for (e)/(f), commit ones only for gateways. */
interface Cost extends Samples {
  cpu: CpuReading;
  modelNs: number;
  pgBackendsNs: number;
  pgSharedNs: number;
  walBytes: number;
  commits: CommitCounters;
}

function addCosts(a: Cost | undefined, b: Cost): Cost {
  if (!a) return b;
  return {
    times: a.times.concat(b.times),
    requests: a.requests + b.requests,
    failures: a.failures + b.failures,
    seconds: a.seconds + b.seconds,
    cpu: addCpu(a.cpu, b.cpu),
    modelNs: a.modelNs + b.modelNs,
    pgBackendsNs: a.pgBackendsNs + b.pgBackendsNs,
    pgSharedNs: a.pgSharedNs + b.pgSharedNs,
    walBytes: a.walBytes + b.walBytes,
    commits: {
      steps: a.commits.steps + b.commits.steps,
      transactions: a.commits.transactions + b.commits.transactions,
      commits: a.commits.commits + b.commits.commits,
      commitSeconds: a.commits.commitSeconds + b.commits.commitSeconds,
    },
  };
}

/** PostgreSQL's WAL position in bytes, read on the monitor connection (another database: not counted as a bench backend). */
async function walPosition(monitor: pg.Client | null): Promise<number> {
  if (!monitor) return 0;
  const lsn = (await monitor.query<{ lsn: string }>("SELECT pg_current_wal_lsn()::text AS lsn")).rows[0]!.lsn;
  const [hi, lo] = lsn.split("/");
  return Number.parseInt(hi!, 16) * 2 ** 32 + Number.parseInt(lo!, 16);
}

/**
 * VACUUM (ANALYZE) of a setup's PostgreSQL database, between measured slices, with --vacuum: what a server's
 * autovacuum would do. Without it the tables are never analyzed (the local server runs with autovacuum off), as on a
 * server whose operator turned autovacuum off; the gateway plans every statement for its parameters and its shapes
 * do not depend on statistics, which the default run shows.
 */
async function vacuumAnalyze(setups: GatewaySetup[]): Promise<void> {
  if (!values.vacuum) return;
  for (const url of new Set(setups.filter((s) => s.database).map((s) => s.env.TDS_DATABASE_URL!))) {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      await client.query("VACUUM (ANALYZE)");
    } finally {
      await client.end();
    }
  }
}

const NO_COMMITS: CommitCounters = { steps: 0, transactions: 0, commits: 0, commitSeconds: 0 };

/** Runs `load` against the target and reads what it cost the target, the model server and PostgreSQL. */
async function measured(target: Target, modelPid: number, monitor: pg.Client | null, load: () => Promise<Samples>): Promise<Cost> {
  const gateway = target.kind === "gateway";
  const pgMonitor = target.database ? monitor : null;
  const metrics0 = gateway ? commitCounters(await scrape(target.url)) : NO_COMMITS;
  const wal0 = await walPosition(pgMonitor);
  const pg0 = target.database ? readPostgresCpu(target.database) : null;
  const [model0, cpu0] = [readCpu(modelPid), readCpu(target.pid)];
  const samples = await load();
  await sleep(20); // work after the last response (logging, metrics) belongs to the slice
  const [cpu1, model1] = [readCpu(target.pid), readCpu(modelPid)];
  const pgCpu = pg0 ? postgresCpuSince(pg0, readPostgresCpu(target.database!)) : { backendsNs: 0, backgroundNs: 0 };
  const wal1 = await walPosition(pgMonitor);
  const metrics1 = gateway ? commitCounters(await scrape(target.url)) : NO_COMMITS;
  return {
    ...samples,
    cpu: cpuSince(cpu0, cpu1),
    modelNs: target.kind === "model" ? 0 : model1.ns - model0.ns,
    pgBackendsNs: pgCpu.backendsNs,
    pgSharedNs: pgCpu.backgroundNs,
    walBytes: wal1 - wal0,
    commits: {
      steps: metrics1.steps - metrics0.steps,
      transactions: metrics1.transactions - metrics0.transactions,
      commits: metrics1.commits - metrics0.commits,
      commitSeconds: metrics1.commitSeconds - metrics0.commitSeconds,
    },
  };
}

const usPerRequest = (ns: number, c: Cost) => ns / 1000 / c.requests;
const rpsOf = (c: Cost) => c.requests / c.seconds;

/** Per run: the saturating and the paced cost of every setup, by id. */
interface Run {
  saturated: Map<string, Cost>;
  paced: Map<string, Cost>;
}

async function comparisonRun(
  run: number,
  targets: Target[],
  amounts: Map<string, number>,
  modelPid: number,
  monitor: pg.Client | null,
  setups: GatewaySetup[],
): Promise<Run> {
  const result: Run = { saturated: new Map(), paced: new Map() };
  await vacuumAnalyze(setups);
  for (let slice = 1; slice <= SLICES; slice++) {
    log(`run ${run} of ${RUNS}: saturating slice ${slice} of ${SLICES} of every setup`);
    for (const t of targets) {
      const cost = await measured(t, modelPid, monitor, () => saturate(t, { connections: CONNECTIONS, amount: amounts.get(t.id)! }));
      result.saturated.set(t.id, addCosts(result.saturated.get(t.id), cost));
    }
  }
  for (const t of targets.filter((x) => x.paced)) {
    log(`run ${run} of ${RUNS}: ${t.name}, ${PACED_SECONDS} s at ${RATE} req/s evenly paced`);
    await sleep(300);
    result.paced.set(t.id, await measured(t, modelPid, monitor, () => paced(t, { seconds: PACED_SECONDS, rate: RATE })));
  }
  return result;
}

// ── report of the comparison ─────────────────────────────────────────────────────────────────

const verdict = (ok: boolean) => (ok ? "met" : "**missed**");
const perRun = (xs: number[], fmt: (v: number) => string) => xs.map(fmt).join(" / ");

/** CPU µs per request of every setup, per run and median; for gateways their ratio to the proxy's (saturating: with targets and the throughput ratio). */
function cpuTable(targets: Target[], runs: Run[], which: "saturated" | "paced"): string[] {
  const saturated = which === "saturated";
  const cost = (r: Run, id: string) => r[which].get(id)!;
  const us = (r: Run, id: string) => usPerRequest(cost(r, id).cpu.ns, cost(r, id));
  const lines = [
    `| setup | CPU µs per request (runs) | median | ÷ proxy (runs) | **median ÷ proxy** |${saturated ? " target | throughput ÷ proxy (runs) | median |" : ""}`,
    `| --- | ---: | ---: | ---: | ---: |${saturated ? " --- | ---: | ---: |" : ""}`,
  ];
  for (const t of targets.filter((x) => saturated || x.paced)) {
    const own = runs.map((r) => us(r, t.id));
    const cells = [t.name, perRun(own, f1), f1(median(own))];
    if (t.kind !== "gateway") {
      lines.push(`| ${[...cells, "–", "–", ...(saturated ? ["–", "–", "–"] : [])].join(" | ")} |`);
      continue;
    }
    const ratios = runs.map((r) => us(r, t.id) / us(r, "b"));
    cells.push(perRun(ratios, f2), `**${f2(median(ratios))}**`);
    if (saturated) {
      const goal = CPU_TARGETS[t.id];
      const tput = runs.map((r) => rpsOf(cost(r, t.id)) / rpsOf(cost(r, "b")));
      cells.push(goal ? `≤ ${goal}×: ${verdict(median(ratios) <= goal)}` : "–", perRun(tput, f2), f2(median(tput)));
    }
    lines.push(`| ${cells.join(" | ")} |`);
  }
  return lines;
}

function postgresTable(targets: Target[], runs: Run[], which: "saturated" | "paced"): string[] {
  const pgTargets = targets.filter((t) => t.database && (which === "saturated" || t.paced));
  if (pgTargets.length === 0) return [];
  const lines = [
    "| setup | gateway µs | PostgreSQL µs: bench backends + shared processes | (gateway + PostgreSQL) ÷ proxy | gateway cores per PostgreSQL core | WAL bytes | steps per transaction | transactions per request | commit ms (mean) |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const t of pgTargets) {
    const m = (f: (c: Cost, r: Run) => number) => median(runs.map((r) => f(r[which].get(t.id)!, r)));
    const proxyUs = (r: Run) => usPerRequest(r[which].get("b")!.cpu.ns, r[which].get("b")!);
    lines.push(
      `| ${t.name} | ${f1(m((c) => usPerRequest(c.cpu.ns, c)))} | ${f1(m((c) => usPerRequest(c.pgBackendsNs + c.pgSharedNs, c)))} ` +
        `(${f1(m((c) => usPerRequest(c.pgBackendsNs, c)))} + ${f1(m((c) => usPerRequest(c.pgSharedNs, c)))}) | ` +
        `${f2(m((c, r) => usPerRequest(c.cpu.ns + c.pgBackendsNs + c.pgSharedNs, c) / proxyUs(r)))} | ${f2(m((c) => c.cpu.ns / (c.pgBackendsNs + c.pgSharedNs)))} | ` +
        `${f0(m((c) => c.walBytes / c.requests))} | ` +
        `${f1(m((c) => c.commits.steps / c.commits.transactions))} | ${f2(m((c) => c.commits.transactions / c.requests))} | ` +
        `${f2(m((c) => (1000 * c.commits.commitSeconds) / c.commits.commits))} |`,
    );
  }
  return lines;
}

function commitTable(targets: Target[], runs: Run[]): string[] {
  const lines = [
    "| setup | load | steps per transaction | transactions per request | commit ms (mean) |",
    "| --- | --- | ---: | ---: | ---: |",
  ];
  for (const t of targets.filter((x) => x.kind === "gateway")) {
    for (const which of ["saturated", "paced"] as const) {
      if (!runs[0]![which].has(t.id)) continue;
      const m = (f: (c: Cost) => number) => median(runs.map((r) => f(r[which].get(t.id)!)));
      lines.push(
        `| ${t.name} | ${which === "saturated" ? `${CONNECTIONS} connections` : `${RATE} req/s paced`} | ${f1(m((c) => c.commits.steps / c.commits.transactions))} | ` +
          `${f2(m((c) => c.commits.transactions / c.requests))} | ${f2(m((c) => (1000 * c.commits.commitSeconds) / c.commits.commits))} |`,
      );
    }
  }
  return lines;
}

function latencyTable(targets: Target[], runs: Run[]): string[] {
  const lines = [
    "| setup | p50 ms (runs) | p99 ms (runs) | added p50 ms (runs) | added p99 ms (runs) | **median added p99** | target ≤ +2 ms |",
    "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
  ];
  const p = (r: Run, id: string, q: number) => percentile(r.paced.get(id)!.times, q);
  for (const t of targets.filter((x) => x.paced)) {
    const gw = t.kind === "gateway";
    const added50 = runs.map((r) => p(r, t.id, 50) - p(r, "b", 50));
    const added99 = runs.map((r) => p(r, t.id, 99) - p(r, "b", 99));
    lines.push(
      `| ${t.name} | ${perRun(
        runs.map((r) => p(r, t.id, 50)),
        f2,
      )} | ${perRun(
        runs.map((r) => p(r, t.id, 99)),
        f2,
      )} | ` +
        `${gw ? perRun(added50, signed) : "–"} | ${gw ? perRun(added99, signed) : "–"} | ${gw ? `**${signed(median(added99))}**` : "–"} | ` +
        `${gw ? verdict(median(added99) <= ADDED_P99_TARGET_MS) : "–"} |`,
    );
  }
  return lines;
}

function throughputTable(targets: Target[], runs: Run[]): string[] {
  const lines = [
    "| setup | req/s | p50 ms | p99 ms | requests | errors + non-2xx | kernel share of its CPU (stime) | model server µs per request |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const t of targets) {
    const all = runs.map((r) => r.saturated.get(t.id)!).reduce<Cost | undefined>((a, b) => addCosts(a, b), undefined)!;
    lines.push(
      `| ${t.name} | ${f0(rpsOf(all))} | ${f2(percentile(all.times, 50))} | ${f2(percentile(all.times, 99))} | ${all.requests} | ${all.failures} | ` +
        `${f0((100 * all.cpu.systemTicksNs) / (all.cpu.userTicksNs + all.cpu.systemTicksNs))} % | ` +
        `${t.kind === "model" ? "(itself)" : f1(usPerRequest(all.modelNs, all))} |`,
    );
  }
  return lines;
}

/** schedstat (ns) against utime + stime (ticks) over every slice: they should agree within a few %. */
function crossCheck(targets: Target[], runs: Run[]): string {
  const parts = targets.map((t) => {
    const all = runs.flatMap((r) => [r.saturated.get(t.id), r.paced.get(t.id)]).filter((c): c is Cost => c !== undefined);
    const ns = all.reduce((a, c) => a + c.cpu.ns, 0);
    const ticks = all.reduce((a, c) => a + c.cpu.userTicksNs + c.cpu.systemTicksNs, 0);
    return `(${t.id}) ${f2(ticks / ns)}`;
  });
  return `Cross-check, /proc/<pid>/stat utime+stime ÷ schedstat over all slices: ${parts.join(", ")}`;
}

function infoVsWarn(runs: Run[], logFile: string | undefined): string | null {
  if (!logFile || !runs[0]!.saturated.has("c'")) return null;
  const us = (id: string) => median(runs.map((r) => usPerRequest(r.saturated.get(id)!.cpu.ns, r.saturated.get(id)!)));
  const rps = (id: string) => median(runs.map((r) => rpsOf(r.saturated.get(id)!)));
  let logged = "";
  try {
    const lines = readFileSync(logFile, "utf8").split("\n").filter(Boolean);
    const completed = lines.filter((l) => l.includes('"request completed"')).length;
    logged = `; ${f2(lines.length / Math.max(1, completed))} log lines and ${f0(statSync(logFile).size / Math.max(1, completed))} bytes per request`;
  } catch {
    // no log written
  }
  return (
    `LOG_LEVEL=info vs warn (preview, SQLite, saturating, medians): CPU ${f1(us("c'"))} vs ${f1(us("c"))} µs per request ` +
    `(${signed((100 * (us("c'") - us("c"))) / us("c"))} %), ${f0(rps("c'"))} vs ${f0(rps("c"))} req/s${logged}`
  );
}

function printComparison(targets: Target[], runs: Run[], rss: Array<[string, number, number]>, logFile: string | undefined): void {
  const out = (lines: string[] | string) => console.log(Array.isArray(lines) ? lines.join("\n") : lines);
  out(
    `\nGateway CPU per request ÷ the proxy's, saturating (${CONNECTIONS} connections), ${RUNS} runs; the ratio of each run, then their median\n`,
  );
  out(cpuTable(targets, runs, "saturated"));
  const pgSat = postgresTable(targets, runs, "saturated");
  if (pgSat.length) {
    out(
      `\nPostgreSQL setups, saturating: per request, medians of the runs (PostgreSQL CPU: its backends of the bench database + its shared processes, /proc)\n`,
    );
    out(pgSat);
  }
  out(
    `\nLatency at ${RATE} req/s evenly paced (${PACED_SECONDS} s per setup and run, one request every ${f2(1000 / RATE)} ms, open loop); added = gateway − proxy of the same run\n`,
  );
  out(latencyTable(targets, runs));
  out(`\nCPU per request at ${RATE} req/s evenly paced\n`);
  out(cpuTable(targets, runs, "paced"));
  const pgPaced = postgresTable(targets, runs, "paced");
  if (pgPaced.length) {
    out(`\nPostgreSQL setups at ${RATE} req/s evenly paced: per request, medians of the runs\n`);
    out(pgPaced);
  }
  out("\nGroup commit (the gateway's tds_store_batch_steps and tds_store_commit_seconds), medians of the runs\n");
  out(commitTable(targets, runs));
  out(`\nSaturating throughput and latency, all runs together\n`);
  out(throughputTable(targets, runs));
  out("\nRSS of each process before and after the comparison (MB)\n");
  out(["| process | before | after |", "| --- | ---: | ---: |", ...rss.map(([n, b, a]) => `| ${n} | ${f1(b)} | ${f1(a)} |`)]);
  out(`\n${crossCheck(targets, runs)}`);
  const info = infoVsWarn(runs, logFile);
  if (info) out(`\n${info}`);
}

// ── the comparison ───────────────────────────────────────────────────────────────────────────

async function comparison(model: Started, setups: GatewaySetup[], cleanups: Array<() => Promise<void>>): Promise<void> {
  const proxy = await startPassthroughProxy(model.url);
  cleanups.push(() => proxy.stop());
  const targets: Target[] = [
    { id: "a", name: "(a) precomputed model server, direct", url: model.url, pid: model.child.pid!, kind: "model", paced: false },
    { id: "b", name: "(b) pass-through proxy", url: proxy.url, pid: proxy.child.pid!, kind: "proxy", paced: true },
  ];
  for (const s of setups) {
    log(`starting ${s.name}`);
    const gw = await spawnGateway(s.env, s.logFile ? { logFile: s.logFile } : {});
    cleanups.push(() => gw.stop());
    targets.push({
      id: s.id,
      name: s.name,
      url: gw.url,
      keys: s.keys,
      pid: gw.pid,
      kind: "gateway",
      database: s.database,
      paced: s.id !== "c'",
    });
  }
  for (const t of targets) await checkAccepted(t.name, t);

  const monitor = setups.some((s) => s.database) ? new pg.Client({ connectionString: TEST_POSTGRES_URL }) : null;
  if (monitor) {
    await monitor.connect();
    cleanups.push(() => monitor.end());
  }
  const amounts = new Map<string, number>();
  const rssBefore = new Map<string, number>();
  for (const t of targets) {
    log(`${t.name}: warm-up ${WARMUP_SECONDS} + 1 s`);
    await saturate(t, { connections: CONNECTIONS, seconds: WARMUP_SECONDS });
    // The slices' size, from the rate of a second, warm, run.
    const warm = await saturate(t, { connections: CONNECTIONS, seconds: 1 });
    if (warm.failures > 0) throw new Error(`${t.name}: ${warm.failures} failures during the warm-up`);
    amounts.set(t.id, Math.max(200, Math.round((warm.requests / warm.seconds) * (SECONDS / SLICES))));
    rssBefore.set(t.name, rssMb(t.pid));
  }
  const runs: Run[] = [];
  for (let run = 1; run <= RUNS; run++) runs.push(await comparisonRun(run, targets, amounts, model.child.pid!, monitor, setups));
  const rss = targets.map((t): [string, number, number] => [t.name, rssBefore.get(t.name)!, rssMb(t.pid)]);
  printComparison(targets, runs, rss, setups.find((s) => s.logFile)?.logFile);
}

// ── memory ───────────────────────────────────────────────────────────────────────────────────

/** V8 heap used by a gateway process, from its own GET /metrics (prom-client's default process metrics). */
async function heapUsedMb(url: string): Promise<number> {
  try {
    return promValue(await scrape(url), "tds_nodejs_heap_size_used_bytes") / 2 ** 20;
  } catch {
    return Number.NaN;
  }
}

/** Least-squares slope of y over t (per minute). */
function slopePerMinute(points: Array<{ t: number; y: number }>): number {
  const n = points.length;
  if (n < 2) return Number.NaN;
  const mt = points.reduce((a, p) => a + p.t, 0) / n;
  const my = points.reduce((a, p) => a + p.y, 0) / n;
  const num = points.reduce((a, p) => a + (p.t - mt) * (p.y - my), 0);
  const den = points.reduce((a, p) => a + (p.t - mt) ** 2, 0);
  return (num / den) * 60;
}

async function memoryRun(setup: GatewaySetup, cleanups: Array<() => Promise<void>>): Promise<void> {
  const gw = await spawnGateway(setup.env);
  cleanups.push(() => gw.stop());
  await checkAccepted(setup.name, { url: gw.url, keys: setup.keys });
  await sleep(1000);
  const series: MemorySample[] = [];
  const wal = `${setup.env.TDS_DATABASE_URL!.replace(/^sqlite:/, "")}-wal`;
  const sample = async (when: string, t: number) =>
    series.push({
      when,
      t,
      rss: rssMb(gw.pid),
      anon: statusMb(gw.pid, "RssAnon"),
      files: statusMb(gw.pid, "RssFile") + statusMb(gw.pid, "RssShmem"),
      heap: await heapUsedMb(gw.url),
      walMb: existsSync(wal) ? statSync(wal).size / 2 ** 20 : 0,
    });
  await sample("idle, after start", 0);
  log(`memory: ${MEMORY_SECONDS} s at ${RATE} req/s evenly paced on a fresh paid SQLite gateway`);
  const cpu0 = readCpu(gw.pid);
  const load = paced({ url: gw.url, keys: setup.keys }, { seconds: MEMORY_SECONDS, rate: RATE });
  for (let t = 5; t <= MEMORY_SECONDS; t += 5) {
    await sleep(5000);
    await sample(`${t} s`, t);
  }
  const samples = await load;
  const cpuUs = cpuSince(cpu0, readCpu(gw.pid)).ns / 1000;
  await sleep(10_000);
  await sample("after the run, +10 s idle", MEMORY_SECONDS + 10);
  printMemory(series, samples, cpuUs);
}

interface MemorySample {
  when: string;
  t: number;
  rss: number;
  anon: number;
  files: number;
  heap: number;
  walMb: number;
}

function printMemory(series: MemorySample[], samples: Samples, cpuUs: number): void {
  console.log(
    `\nGateway memory over a ${MEMORY_SECONDS}-second run at ${RATE} req/s evenly paced (a fresh paid SQLite gateway; VmRSS, RssAnon and ` +
      "RssFile + RssShmem from /proc/<pid>/status, V8 heap used from its GET /metrics, the size of the database's -wal file)\n",
  );
  console.log(
    "| when | RSS MB | anonymous MB | mapped files MB | V8 heap used MB | WAL file MB |\n| --- | ---: | ---: | ---: | ---: | ---: |",
  );
  for (const m of series.filter((m) => m.t % 15 === 0 || m.t > MEMORY_SECONDS)) {
    console.log(`| ${m.when} | ${f1(m.rss)} | ${f1(m.anon)} | ${f1(m.files)} | ${f1(m.heap)} | ${f1(m.walMb)} |`);
  }
  // Live heap: the lowest V8 heap reading (right after a major GC) of the last quarter of the run and after it, against
  // the lowest of the second quarter (the first is start-up: caches, compiled code, the rate limiter's log fill up).
  // RSS: the trend over the second half; V8 and the allocator keep freed pages, so RSS lags the heap. A leak shows as
  // a steady climb of both.
  const during = series.filter((m) => m.t > 0 && m.t <= MEMORY_SECONDS);
  const minHeap = (from: number, to: number) => Math.min(...series.filter((m) => m.t >= from && m.t <= to).map((m) => m.heap));
  const liveHeapGrowth = minHeap(MEMORY_SECONDS * 0.75, Infinity) - minHeap(MEMORY_SECONDS * 0.25, MEMORY_SECONDS * 0.5);
  const secondHalf = during.filter((m) => m.t >= MEMORY_SECONDS / 2);
  const rssSlope = slopePerMinute(secondHalf.map((m) => ({ t: m.t, y: m.rss })));
  const anonSlope = slopePerMinute(secondHalf.map((m) => ({ t: m.t, y: m.anon })));
  const filesSlope = slopePerMinute(secondHalf.map((m) => ({ t: m.t, y: m.files })));
  const last = series.at(-1)!;
  console.log(
    `\n${samples.requests} requests, ${samples.failures} failures, p50 ${f2(percentile(samples.times, 50))} ms, p99 ${f2(percentile(samples.times, 99))} ms, ` +
      `gateway CPU ${f1(cpuUs / samples.requests)} µs per request\n` +
      `live V8 heap (lowest reading of the last quarter vs the second quarter): ${signed(liveHeapGrowth)} MB; ` +
      `RSS ${f1(series[0]!.rss)} MB at start → ${f1(last.rss)} MB after 10 s idle, trend over the second half ${signed(rssSlope)} MB/min ` +
      `(anonymous ${signed(anonSlope)}, mapped files ${signed(filesSlope)})\n` +
      `→ flat memory (live heap ≤ +10 MB and RSS trend over the second half ≤ +10 MB/min): ${verdict(liveHeapGrowth <= 10 && rssSlope <= 10)}` +
      (MEMORY_SECONDS < 120 ? ` (a ${MEMORY_SECONDS}-second run ends inside V8's start-up growth; use --memory-seconds 180)` : ""),
  );
}

// ── profiles ─────────────────────────────────────────────────────────────────────────────────

async function profileRun(setup: GatewaySetup, dir: string): Promise<string> {
  const profDir = join(dir, `prof-${setup.id}`);
  const spawned = performance.now();
  const gw = await spawnGateway(setup.env, { nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${profDir}`] });
  let line: string;
  let skipSeconds: number;
  let requests: number;
  try {
    const target = { url: gw.url, keys: setup.keys };
    await checkAccepted(setup.name, target);
    log(`${setup.name} under --cpu-prof: ${WARMUP_SECONDS} s warm-up + ${PROFILE_SECONDS} s at ${CONNECTIONS} connections`);
    await saturate(target, { connections: CONNECTIONS, seconds: WARMUP_SECONDS });
    // The profile starts with the process: its start-up and the warm-up are left out of the summary.
    skipSeconds = (performance.now() - spawned) / 1000;
    const cpu0 = readCpu(gw.pid);
    const s = await saturate(target, { connections: CONNECTIONS, seconds: PROFILE_SECONDS });
    const us = cpuSince(cpu0, readCpu(gw.pid)).ns / 1000 / s.requests;
    requests = s.requests;
    line = `${f0(s.requests / s.seconds)} req/s, ${s.failures} failures, ${f1(us)} µs CPU per request (/proc, all threads, under the profiler)`;
  } finally {
    await gw.stop();
  }
  const file = readdirSync(profDir).find((f) => f.endsWith(".cpuprofile"));
  if (!file) throw new Error(`no .cpuprofile written in ${profDir}`);
  return `CPU profile: ${setup.name}: ${line}\n\n${summarizeProfile(join(profDir, file), { skipSeconds, requests })}`;
}

/** The same as profileRun with Linux perf: on-CPU samples of the whole gateway process, kernel and native code included. */
async function perfRun(setup: GatewaySetup, dir: string): Promise<string> {
  const file = join(dir, `perf-${setup.id}.data`);
  const gw = await spawnGateway(setup.env, { nodeArgs: perfNodeArgs(join(dir, `v8-${setup.id}.log`)) });
  try {
    const target = { url: gw.url, keys: setup.keys };
    await checkAccepted(setup.name, target);
    log(`${setup.name} under perf: ${WARMUP_SECONDS} s warm-up + ${PROFILE_SECONDS} s at ${CONNECTIONS} connections`);
    await saturate(target, { connections: CONNECTIONS, seconds: WARMUP_SECONDS });
    const cpu0 = readCpu(gw.pid);
    const [s] = await Promise.all([
      saturate(target, { connections: CONNECTIONS, seconds: PROFILE_SECONDS }),
      perfRecord(gw.pid, PROFILE_SECONDS, file),
    ]);
    const cpu = cpuSince(cpu0, readCpu(gw.pid));
    const line =
      `${f0(s.requests / s.seconds)} req/s, ${s.failures} failures, ${f1(cpu.ns / 1000 / s.requests)} µs CPU per request, ` +
      `${f0((100 * cpu.systemTicksNs) / (cpu.userTicksNs + cpu.systemTicksNs))} % of it in the kernel (stime)`;
    return `perf profile (on-CPU, cpu-clock at 999 Hz): ${setup.name}: ${line}\n\n${perfSummary(file)}`;
  } finally {
    await gw.stop();
    removePerfMap(gw.pid);
  }
}

// ── main ─────────────────────────────────────────────────────────────────────────────────────

const dir = mkdtempSync(join(tmpdir(), "tds-bench-gw-"));
const cleanups: Array<() => Promise<void>> = [];
const notes: string[] = [];
const sections: string[] = [];
console.log(
  `${cpus().length} cores (${cpus()[0]?.model ?? "?"}), ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}; ` +
    `realistic request (${BODY.length} bytes); load generator, model server, proxy, gateways and PostgreSQL share the machine`,
);
try {
  const model = await startPrecomputedModel();
  cleanups.push(() => model.stop());
  const setups = await gatewaySetups(model.url, dir, cleanups, notes);
  if (!values["no-comparison"]) {
    const comparisonCleanups: Array<() => Promise<void>> = [];
    try {
      await comparison(model, setups, comparisonCleanups);
    } finally {
      for (const stop of comparisonCleanups.reverse()) await stop().catch((err) => log(`cleanup: ${(err as Error).message}`));
    }
  }
  if (values.memory) await memoryRun(setups.find((s) => s.id === "d")!, cleanups);
  const profiled = setups.filter((x) => ["c", "d", "e", "f"].includes(x.id));
  if (values.profile) {
    for (const s of profiled) {
      await vacuumAnalyze([s]);
      sections.push(await profileRun(s, dir));
    }
  }
  if (values.perf) {
    if (!perfAvailable()) notes.push("--perf skipped: perf is not installed.");
    else {
      for (const s of profiled) {
        await vacuumAnalyze([s]);
        sections.push(await perfRun(s, dir));
      }
    }
  }
  if (values["store-costs"]) sections.push(await storeCosts({ postgres: !values["no-postgres"], log }));
} finally {
  for (const stop of cleanups.reverse()) await stop().catch((err) => log(`cleanup: ${(err as Error).message}`));
  rmSync(dir, { recursive: true, force: true });
}
for (const n of notes) console.log(`\n${n}`);
for (const s of sections) console.log(`\n${s}`);
console.log(`\ntotal run time ${((Date.now() - started) / 1000).toFixed(0)} s`);
process.exit(0);
