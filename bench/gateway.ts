/**
 * What the gateway costs on top of the model service, in one run on this machine, loopback only:
 *
 *   npx tsx bench/gateway.ts [--seconds 10] [--memory] [--profile] [--store-costs]
 *       [--connections 32] [--rate 300] [--rate-connections 10] [--paced-seconds 5] [--memory-seconds 60] [--no-postgres]
 *
 * With the realistic request (bench/support.ts: ~2 KB state, 3 questions of each type), autocannon
 * against (a) the fake model server directly, (b) a minimal pass-through proxy
 * (bench/passthrough-proxy.ts, its own process), (c) the gateway in preview mode and (d) in paid mode
 * on SQLite, (e)/(f) the same on PostgreSQL when reachable (createTestDatabase), and (c') the preview
 * SQLite setup logging at LOG_LEVEL=info (its lines go to a file, as to a log collector); every other
 * gateway logs at warn. Every gateway is src/server.ts in its own process. All processes stay up for
 * the whole run and the saturating runs are cut in five slices per target taken in turns, so noise on
 * this shared machine falls on all of them alike.
 *
 * Then a fixed moderate rate: autocannon overallRate 300 req/s for `--seconds` (10 connections; each
 * sends its share of a second back to back, so requests come in bursts) and the same rate evenly paced
 * (open loop, undici) for `--paced-seconds`: p50/p99 of proxy and gateway and the difference.
 * `--memory` adds a 60-second run at that rate on a fresh paid gateway with its RSS (VmRSS from
 * /proc/<pid>/status) and V8 heap (its GET /metrics) before, every 5 s during, and after. `--profile`
 * runs the preview and paid gateways once more under `node --cpu-prof` and summarises the profiles
 * (top self-time functions, self time by package, inclusive time of src/ functions); `--store-costs` times
 * the SQLite store calls of a decision one by one and counts the WAL pages each appends. Percentiles are
 * computed from every 2xx response time (not autocannon's whole-millisecond histogram). Targets,
 * printed and never asserted: preview ≥ 60 % of the proxy's throughput, paid ≥ 50 %, ≤ +2 ms p99 at
 * 300 req/s, flat memory. The default run takes about 3 minutes; --memory adds ~80 s, --profile ~30 s.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { cpus, totalmem, tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import autocannon from "autocannon";
import { Pool } from "undici";
import { openSqliteStore } from "../src/store/sqlite/sqlite-store.ts";
import type { UsageRecord } from "../src/store/store.ts";
import { freePort } from "../test/support/redis-server.ts";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import { OPEN_LIMITS, ROOT, provisionOrg, realisticRequest, startFakeModel, startProcess, type Started } from "./support.ts";

const { values } = parseArgs({
  options: {
    seconds: { type: "string", default: "10" },
    connections: { type: "string", default: "32" },
    rate: { type: "string", default: "300" },
    "rate-connections": { type: "string", default: "10" },
    memory: { type: "boolean", default: false },
    "memory-seconds": { type: "string", default: "60" },
    "paced-seconds": { type: "string", default: "5" },
    profile: { type: "boolean", default: false },
    "no-postgres": { type: "boolean", default: false },
    "store-costs": { type: "boolean", default: false },
  },
});
const SECONDS = Number(values.seconds);
const CONNECTIONS = Number(values.connections);
const RATE = Number(values.rate);
const RATE_CONNECTIONS = Number(values["rate-connections"]);
const MEMORY_SECONDS = Number(values["memory-seconds"]);
const WARMUP_SECONDS = 2;
/** The saturating runs are cut into this many slices per target, taken in turns. */
const ROUNDS = 5;
const PACED_SECONDS = Number(values["paced-seconds"]);
const BODY = JSON.stringify(realisticRequest());
/** Enough for every paid request of the run (a reservation is 32768 tokens × 0.5 USD per million = 16384 microUSD). */
const PAID_GRANT = 1_000_000_000_000;

// ── measuring ────────────────────────────────────────────────────────────────────────────────

interface Measured {
  rps: number;
  p50: number;
  p99: number;
  requests: number;
  /** Connection errors, time-outs and non-2xx responses. */
  failures: number;
}

/** What one or more runs against a target saw: every 2xx response time, and the totals. */
interface Samples {
  times: number[];
  seconds: number;
  requests: number;
  failures: number;
}

function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

function summarize(s: Samples): Measured {
  const sorted = Float64Array.from(s.times).sort();
  return { rps: s.times.length / s.seconds, p50: percentile(sorted, 50), p99: percentile(sorted, 99), requests: s.requests, failures: s.failures };
}

function merge(a: Samples | undefined, b: Samples): Samples {
  if (!a) return b;
  return { times: a.times.concat(b.times), seconds: a.seconds + b.seconds, requests: a.requests + b.requests, failures: a.failures + b.failures };
}

async function load(target: { url: string; key?: string }, opts: { seconds: number; connections: number; rate?: number }): Promise<Samples> {
  const times: number[] = [];
  let instance!: autocannon.Instance;
  const done = new Promise<autocannon.Result>((resolve, reject) => {
    instance = autocannon(
      {
        url: `${target.url}/v1/systemone`,
        method: "POST",
        headers: { "content-type": "application/json", ...(target.key ? { authorization: `Bearer ${target.key}` } : {}) },
        body: BODY,
        connections: opts.connections,
        duration: opts.seconds,
        ...(opts.rate ? { overallRate: opts.rate } : {}),
      },
      (err, result) => (err ? reject(err) : resolve(result)),
    );
  });
  instance.on("response", (_client: unknown, status: number, _bytes: number, ms: number) => {
    if (status >= 200 && status < 300) times.push(ms);
  });
  const result = await done;
  return { times, seconds: opts.seconds, requests: result.requests.total, failures: result.errors + result.timeouts + result.non2xx };
}

const measure = async (target: { url: string; key?: string }, opts: { seconds: number; connections: number; rate?: number }) => summarize(await load(target, opts));

/**
 * An open-loop load at an even pace (one request every 1000/rate ms, whatever the answers do), with
 * undici: unlike autocannon's overallRate, which lets each connection send its share of a second
 * back to back and then pause, so requests arrive in bursts.
 */
async function measurePaced(target: { url: string; key?: string }, opts: { seconds: number; rate: number }): Promise<Measured> {
  const pool = new Pool(target.url, { connections: 64, pipelining: 1 });
  const headers = { "content-type": "application/json", ...(target.key ? { authorization: `Bearer ${target.key}` } : {}) };
  const times: number[] = [];
  let failures = 0;
  let sent = 0;
  const total = Math.round(opts.rate * opts.seconds);
  const inFlight = new Set<Promise<void>>();
  const one = async () => {
    const t0 = performance.now();
    try {
      const res = await pool.request({ method: "POST", path: "/v1/systemone", headers, body: BODY });
      await res.body.arrayBuffer();
      if (res.statusCode >= 200 && res.statusCode < 300) times.push(performance.now() - t0);
      else failures++;
    } catch {
      failures++;
    }
  };
  const start = performance.now();
  await new Promise<void>((resolve) => {
    const tick = setInterval(() => {
      const due = Math.min(total, Math.floor(((performance.now() - start) * opts.rate) / 1000) + 1);
      while (sent < due) {
        sent++;
        const p = one().finally(() => inFlight.delete(p));
        inFlight.add(p);
      }
      if (sent >= total) {
        clearInterval(tick);
        resolve();
      }
    }, 1);
  });
  await Promise.all(inFlight);
  await pool.close();
  return summarize({ times, seconds: opts.seconds, requests: sent, failures });
}

// ── processes ────────────────────────────────────────────────────────────────────────────────

interface GatewayProc extends Started {
  pid: number;
  logFile: string | null;
}

/** src/server.ts as its own process; stdout (its logs) goes to a file when `logFile` is given, else nowhere. */
async function spawnGateway(env: Record<string, string>, options: { logFile?: string; nodeArgs?: string[] } = {}): Promise<GatewayProc> {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const out = options.logFile ? openSync(options.logFile, "w") : "ignore";
  const child: ChildProcess = spawn(process.execPath, [...(options.nodeArgs ?? []), "--import", "tsx", "src/server.ts"], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", HOST: "127.0.0.1", PORT: String(port), LOG_LEVEL: "warn", TDS_BOOTSTRAP: "false", ...env },
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
  return {
    url,
    child,
    pid: child.pid!,
    logFile: options.logFile ?? null,
    stop: () =>
      new Promise((r) => {
        if (child.exitCode !== null) return r();
        child.once("exit", () => r());
        child.kill("SIGTERM");
        setTimeout(() => child.kill("SIGKILL"), 10_000).unref();
      }),
  };
}

function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : Number.NaN;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ── CPU profile summary ──────────────────────────────────────────────────────────────────────

interface CpuProfile {
  nodes: Array<{ id: number; callFrame: { functionName: string; url: string; lineNumber: number }; children?: number[] }>;
  samples: number[];
  timeDeltas: number[];
}

function shortUrl(url: string): string {
  if (url === "") return "";
  const nm = url.lastIndexOf("/node_modules/");
  if (nm >= 0) return url.slice(nm + "/node_modules/".length);
  return url.replace(`file://${ROOT}`, "").replace(/^file:\/\//, "");
}

/** What a file belongs to: the project's own source, a package, Node's internals, or V8's pseudo-nodes. */
function category(url: string, name: string): string {
  if (url === "") return name.startsWith("(") ? name : "(native)";
  if (url.startsWith("node:")) return `node:${url.slice(5).split("/")[0] === "internal" ? url.slice(5).split("/").slice(0, 2).join("/") : url.slice(5)}`;
  const nm = url.lastIndexOf("/node_modules/");
  if (nm >= 0) {
    const rest = url.slice(nm + "/node_modules/".length).split("/");
    return rest[0]!.startsWith("@") ? `${rest[0]}/${rest[1]}` : rest[0]!;
  }
  return shortUrl(url).split("/").slice(0, 3).join("/");
}

/** Top self-time functions, self time by package/file group, and inclusive time of the project's own functions. */
function summarizeProfile(file: string, top = 20): string {
  const profile = JSON.parse(readFileSync(file, "utf8")) as CpuProfile;
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  const groups = new Map<string, number>();
  let total = 0;
  let idle = 0;
  const keyOf = (id: number) => {
    const f = byId.get(id)!.callFrame;
    // tsx emits each TypeScript module on one line, so a line number means something only for .js files.
    return `${f.functionName || "(anonymous)"}  ${shortUrl(f.url)}${f.url && f.lineNumber > 0 ? `:${f.lineNumber + 1}` : ""}`;
  };
  for (let i = 0; i < profile.samples.length; i++) {
    const id = profile.samples[i]!;
    const dt = profile.timeDeltas[i] ?? 0;
    const node = byId.get(id)!;
    total += dt;
    if (node.callFrame.functionName === "(idle)") {
      idle += dt;
      continue;
    }
    const key = keyOf(id);
    self.set(key, (self.get(key) ?? 0) + dt);
    const g = category(node.callFrame.url, node.callFrame.functionName);
    groups.set(g, (groups.get(g) ?? 0) + dt);
    const seen = new Set<string>();
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const n = byId.get(at)!;
      if (!n.callFrame.url.includes("/src/") || n.callFrame.url.includes("/node_modules/")) continue;
      const k = keyOf(at);
      if (seen.has(k)) continue;
      seen.add(k);
      inclusive.set(k, (inclusive.get(k) ?? 0) + dt);
    }
  }
  const busy = total - idle;
  const pct = (v: number) => `${((100 * v) / busy).toFixed(1)} %`;
  const lines: string[] = [];
  lines.push(`profile ${(total / 1e6).toFixed(1)} s, busy (not idle) ${(busy / 1e6).toFixed(1)} s = ${((100 * busy) / total).toFixed(0)} % of one core; shares below are of busy time`);
  lines.push("", "| self time | function  file:line |", "| ---: | --- |");
  for (const [k, v] of [...self].sort((a, b) => b[1] - a[1]).slice(0, top)) lines.push(`| ${pct(v)} | \`${k}\` |`);
  lines.push("", "| self time | package / group |", "| ---: | --- |");
  for (const [k, v] of [...groups].sort((a, b) => b[1] - a[1]).slice(0, 15)) lines.push(`| ${pct(v)} | ${k} |`);
  lines.push("", "| inclusive | project function (src/) |", "| ---: | --- |");
  for (const [k, v] of [...inclusive].sort((a, b) => b[1] - a[1]).slice(0, 15)) lines.push(`| ${pct(v)} | \`${k}\` |`);
  return lines.join("\n");
}

// ── SQLite store costs ───────────────────────────────────────────────────────────────────────

/**
 * µs per call of the store methods a decision runs, on a SQLite file in this machine's temp dir (WAL,
 * synchronous=NORMAL as the gateway opens it, then synchronous=OFF for comparison), and WAL pages each
 * call appends (with automatic checkpoints off while counting).
 */
async function storeCosts(): Promise<string> {
  const N = 5000;
  const lines = ["| store call (SQLite file) | µs, synchronous=NORMAL | µs, synchronous=OFF | WAL pages (4 KiB) per call |", "| --- | ---: | ---: | ---: |"];
  const results = new Map<string, number[]>();
  const pages = new Map<string, number>();
  const base = mkdtempSync(join(tmpdir(), "tds-store-cost-"));
  try {
    for (const sync of ["NORMAL", "OFF"]) {
      const store = openSqliteStore(join(base, `${sync}.sqlite`));
      store.db.pragma(`synchronous = ${sync}`);
      const org = await store.createOrganization({ id: "org_bench", name: "bench", nowMs: Date.now() });
      await store.createApiKey({ id: "keybench0001", orgId: org.id, name: null, hash: "a".repeat(64), nowMs: Date.now() });
      await store.grantCredits({ orgId: org.id, amountMicrousd: 1e12, nowMs: Date.now() });
      const record = (id: string): UsageRecord => ({
        requestId: id, orgId: org.id, keyId: "keybench0001", createdAtMs: Date.now(), source: "api", model: "fake-small", mode: "paid",
        outcome: "succeeded", httpStatus: 200, inputTokens: 900, outputTokens: 9, costMicrousd: 450, latencyMs: 1.2, gatewayLatencyMs: 0.8, errorDetail: null, overReservation: false,
      });
      const calls: Array<[string, (i: number) => Promise<unknown>]> = [
        ["findApiKey (auth)", () => store.findApiKey("keybench0001")],
        ["consumePreviewQuota (preview admission)", () => store.consumePreviewQuota({ orgId: org.id, day: "2026-11-26", orgLimit: 1e9, globalLimit: 1e9 })],
        ["insertUsage (preview record)", (i) => store.insertUsage(record(`u${sync}${i}`))],
        ["reserveCredits (paid admission)", (i) => store.reserveCredits({ reservationId: `r${sync}${i}`, orgId: org.id, requestId: `r${sync}${i}`, amountMicrousd: 16384, nowMs: Date.now(), expiresAtMs: Date.now() + 120_000 })],
        ["settleReservation + usage (paid record)", (i) => store.settleReservation({ reservationId: `r${sync}${i}`, costMicrousd: 450, nowMs: Date.now(), usage: record(`r${sync}${i}`) })],
      ];
      for (const [name, call] of calls) {
        const t0 = performance.now();
        for (let i = 0; i < N; i++) await call(i);
        results.set(name, [...(results.get(name) ?? []), ((performance.now() - t0) / N) * 1000]);
      }
      if (sync === "NORMAL") {
        store.db.pragma("wal_autocheckpoint = 0");
        for (const [name, call] of calls) {
          store.db.pragma("wal_checkpoint(TRUNCATE)");
          for (let i = 0; i < 200; i++) await call(N + i);
          const [r] = store.db.pragma("wal_checkpoint(PASSIVE)") as Array<{ log: number }>;
          pages.set(name, r!.log / 200);
        }
      }
      await store.close();
    }
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
  for (const [name, [normal, off]] of results) lines.push(`| ${name} | ${f1(normal!)} | ${f1(off!)} | ${f1(pages.get(name) ?? Number.NaN)} |`);
  return lines.join("\n");
}

// ── the run ──────────────────────────────────────────────────────────────────────────────────

const f1 = (v: number) => (Number.isFinite(v) ? v.toFixed(1) : "–");
const f2 = (v: number) => (Number.isFinite(v) ? v.toFixed(2) : "–");
const rowOf = (name: string, m: Measured) => `| ${name} | ${m.rps.toFixed(0)} | ${f2(m.p50)} | ${f2(m.p99)} | ${m.requests} | ${m.failures} |`;
const HEAD = "| setup | req/s (2xx) | p50 ms | p99 ms | requests | errors + non-2xx |\n| --- | ---: | ---: | ---: | ---: | ---: |";

const started = Date.now();
const log = (msg: string) => process.stderr.write(`[${((Date.now() - started) / 1000).toFixed(0).padStart(3)} s] ${msg}\n`);

const dir = mkdtempSync(join(tmpdir(), "tds-bench-gw-"));
const stops: Array<() => Promise<void>> = [];
const throughput: Array<[string, Measured]> = [];
const fixedRate: Array<[string, Measured]> = [];
const paced: Array<[string, Measured]> = [];
const rss: Array<[string, number, number]> = [];
const notes: string[] = [];
const memorySeries: Array<{ when: string; t: number; rss: number; heap: number }> = [];
const profiles: Array<[string, string]> = [];

interface Target {
  name: string;
  url: string;
  key?: string;
  pid: number;
  /** Also measured at the fixed moderate rate (autocannon overallRate and evenly paced). */
  rate: boolean;
}

/** V8 heap used by a gateway process, from its own GET /metrics (prom-client's default process metrics). */
async function heapUsedMb(url: string): Promise<number> {
  try {
    const text = await (await fetch(`${url}/metrics`)).text();
    const m = /^(?:tds_)?nodejs_heap_size_used_bytes (\d+(?:\.\d+)?(?:e\+?\d+)?)/m.exec(text);
    return m ? Number(m[1]) / 2 ** 20 : Number.NaN;
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

async function profileRun(name: string, env: Record<string, string>, key: string): Promise<void> {
  const profDir = join(dir, `prof-${profiles.length}`);
  const gw = await spawnGateway(env, { nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${profDir}`] });
  try {
    log(`${name} under --cpu-prof: ${WARMUP_SECONDS} s warm-up + ${SECONDS} s at ${CONNECTIONS} connections`);
    await measure({ url: gw.url, key }, { seconds: WARMUP_SECONDS, connections: CONNECTIONS });
    const m = await measure({ url: gw.url, key }, { seconds: SECONDS, connections: CONNECTIONS });
    notes.push(`${name} under --cpu-prof: ${m.rps.toFixed(0)} req/s`);
  } finally {
    await gw.stop();
  }
  const file = readdirSync(profDir).find((f) => f.endsWith(".cpuprofile"));
  if (!file) throw new Error(`no .cpuprofile written in ${profDir}`);
  profiles.push([`${name} (${(statSync(join(profDir, file)).size / 1e6).toFixed(1)} MB profile)`, summarizeProfile(join(profDir, file))]);
}

let infoLog: string | null = null;
try {
  const fake = await startFakeModel();
  stops.push(() => fake.stop());
  const proxy = await startProcess(["bench/passthrough-proxy.ts", "--upstream", fake.url, "--port", "0"], {}, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
  stops.push(() => proxy.stop());
  const base = { TDS_MODEL_SERVICE_URL: fake.url, ...OPEN_LIMITS };
  const targets: Target[] = [
    { name: "(a) fake model server, direct", url: fake.url, pid: fake.child.pid!, rate: false },
    { name: "(b) pass-through proxy", url: proxy.url, pid: proxy.child.pid!, rate: true },
  ];
  const gateway = async (name: string, env: Record<string, string>, key: string, rate: boolean, options: { logFile?: string } = {}) => {
    const gw = await spawnGateway(env, options);
    stops.push(() => gw.stop());
    targets.push({ name, url: gw.url, key, pid: gw.pid, rate });
  };

  const previewUrl = `sqlite:${join(dir, "preview.sqlite")}`;
  const previewKey = await provisionOrg(previewUrl);
  const previewEnv = { ...base, TDS_DATABASE_URL: previewUrl, TDS_SERVICE_MODE: "preview" };
  await gateway("(c) gateway, preview, SQLite", previewEnv, previewKey, true);
  const paidUrl = `sqlite:${join(dir, "paid.sqlite")}`;
  const paidKey = await provisionOrg(paidUrl, PAID_GRANT);
  const paidEnv = { ...base, TDS_DATABASE_URL: paidUrl, TDS_SERVICE_MODE: "paid" };
  await gateway("(d) gateway, paid, SQLite", paidEnv, paidKey, true);

  if (values["no-postgres"]) {
    notes.push("PostgreSQL setups skipped (--no-postgres).");
  } else {
    let db: Awaited<ReturnType<typeof createTestDatabase>> | null = null;
    try {
      db = await createTestDatabase("tds_bench_gw");
    } catch (err) {
      notes.push(`PostgreSQL setups skipped: ${(err as Error).message}`);
    }
    if (db) {
      const pgDb = db;
      stops.push(() => pgDb.drop());
      await gateway("(e) gateway, preview, PostgreSQL", { ...base, TDS_DATABASE_URL: db.url, TDS_SERVICE_MODE: "preview" }, await provisionOrg(db.url), false);
      await gateway("(f) gateway, paid, PostgreSQL", { ...base, TDS_DATABASE_URL: db.url, TDS_SERVICE_MODE: "paid" }, await provisionOrg(db.url, PAID_GRANT), false);
    }
  }
  // The same preview/SQLite setup logging at info (its own database file, so both start alike).
  infoLog = join(dir, "info.log");
  const infoUrl = `sqlite:${join(dir, "preview-info.sqlite")}`;
  await gateway("(c') gateway, preview, SQLite, LOG_LEVEL=info", { ...previewEnv, TDS_DATABASE_URL: infoUrl, LOG_LEVEL: "info" }, await provisionOrg(infoUrl), true, { logFile: infoLog });

  // Saturating runs: every process is up for the whole run and the targets take turns (ROUNDS slices each),
  // so that background noise on this shared machine falls on all of them alike.
  const before = new Map<string, number>();
  for (const t of targets) {
    log(`${t.name}: warm-up ${WARMUP_SECONDS} s`);
    await measure(t, { seconds: WARMUP_SECONDS, connections: CONNECTIONS });
    before.set(t.name, rssMb(t.pid));
  }
  const samples = new Map<string, Samples>();
  for (let round = 1; round <= ROUNDS; round++) {
    for (const t of targets) {
      log(`${t.name}: ${SECONDS / ROUNDS} s at ${CONNECTIONS} connections (round ${round} of ${ROUNDS})`);
      samples.set(t.name, merge(samples.get(t.name), await load(t, { seconds: SECONDS / ROUNDS, connections: CONNECTIONS })));
    }
  }
  for (const t of targets) throughput.push([t.name, summarize(samples.get(t.name)!)]);

  for (const t of targets.filter((x) => x.rate)) {
    await sleep(500);
    log(`${t.name}: ${SECONDS} s at ${RATE} req/s (autocannon overallRate)`);
    fixedRate.push([t.name, await measure(t, { seconds: SECONDS, connections: RATE_CONNECTIONS, rate: RATE })]);
  }
  for (const t of targets.filter((x) => x.rate && !x.name.includes("info"))) {
    await sleep(500);
    log(`${t.name}: ${PACED_SECONDS} s at ${RATE} req/s, evenly paced`);
    paced.push([t.name, await measurePaced(t, { seconds: PACED_SECONDS, rate: RATE })]);
  }
  for (const t of targets) rss.push([t.name, before.get(t.name)!, rssMb(t.pid)]);

  if (values["store-costs"]) {
    log("SQLite store costs");
    notes.push(`SQLite store calls, ${5000} calls each, one after the other (no concurrency):\n\n${await storeCosts()}`);
  }

  if (values.memory) {
    const gw = await spawnGateway(paidEnv);
    stops.push(() => gw.stop());
    await sleep(1000);
    const sample = async (when: string, t: number) => memorySeries.push({ when, t, rss: rssMb(gw.pid), heap: await heapUsedMb(gw.url) });
    await sample("idle, after start", 0);
    log(`memory: ${MEMORY_SECONDS} s at ${RATE} req/s on a fresh paid SQLite gateway`);
    const run = measure({ url: gw.url, key: paidKey }, { seconds: MEMORY_SECONDS, connections: RATE_CONNECTIONS, rate: RATE });
    for (let t = 5; t <= MEMORY_SECONDS; t += 5) {
      await sleep(5000);
      await sample(`during, ${t} s`, t);
    }
    fixedRate.push([`(d) gateway, paid, SQLite, ${MEMORY_SECONDS} s memory run`, await run]);
    await sleep(2000);
    await sample("after, +2 s idle", MEMORY_SECONDS + 2);
    await sleep(8000);
    await sample("after, +10 s idle", MEMORY_SECONDS + 10);
  }

  if (values.profile) {
    await profileRun("(c) gateway, preview, SQLite", previewEnv, previewKey);
    await profileRun("(d) gateway, paid, SQLite", paidEnv, paidKey);
  }
} finally {
  for (const stop of stops.reverse()) await stop().catch((err) => log(`cleanup: ${(err as Error).message}`));
  if (infoLog) {
    try {
      const lines = readFileSync(infoLog, "utf8").split("\n").filter(Boolean);
      const bytes = statSync(infoLog).size;
      const completed = lines.filter((l) => l.includes('"request completed"')).length;
      notes.push(
        `LOG_LEVEL=info: ${lines.length} log lines, ${(bytes / 1e6).toFixed(1)} MB for ${completed} requests (warm-up included) = ` +
          `${(lines.length / Math.max(1, completed)).toFixed(2)} lines and ${(bytes / Math.max(1, completed)).toFixed(0)} bytes per request, written to a file.`,
      );
    } catch {
      // no log written
    }
  }
  rmSync(dir, { recursive: true, force: true });
}

// ── report ───────────────────────────────────────────────────────────────────────────────────

const get = (list: Array<[string, Measured]>, prefix: string) => list.find(([n]) => n.startsWith(prefix))?.[1];
const proxyT = get(throughput, "(b)")!;
const ratio = (prefix: string) => {
  const m = get(throughput, prefix);
  return m ? m.rps / proxyT.rps : Number.NaN;
};
const verdict = (ok: boolean) => (ok ? "met" : "**missed**");

console.log(
  `\n${cpus().length} cores (${cpus()[0]?.model ?? "?"}), ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}; ` +
    `saturating runs: ${SECONDS} s per setup in ${ROUNDS} interleaved slices after a ${WARMUP_SECONDS} s warm-up, ${CONNECTIONS} connections; ` +
    `realistic request (${BODY.length} bytes); autocannon, fake model, proxy and gateways share the machine\n`,
);
console.log("Throughput (saturating)\n");
console.log(HEAD);
for (const [n, m] of throughput) console.log(rowOf(n, m));

console.log("\nGateway ÷ pass-through proxy (throughput)\n");
console.log("| setup | ratio | target |\n| --- | ---: | --- |");
for (const [n] of throughput.filter(([n]) => /^\((c|d|e|f|c')\)/.test(n))) {
  const r = ratio(n);
  const target = n.startsWith("(c)") ? `≥ 0.60: ${verdict(r >= 0.6)}` : n.startsWith("(d)") ? `≥ 0.50: ${verdict(r >= 0.5)}` : "–";
  console.log(`| ${n} | ${f2(r)} | ${target} |`);
}

function latencyTables(title: string, list: Array<[string, Measured]>): void {
  const proxy = get(list, "(b)");
  if (!proxy) return;
  console.log(`\n${title}\n`);
  console.log(HEAD);
  for (const [n, m] of list) console.log(rowOf(n, m));
  console.log("\n| setup | p50 − proxy p50 (ms) | p99 − proxy p99 (ms) | target ≤ +2 ms p99 |\n| --- | ---: | ---: | --- |");
  for (const [n, m] of list.filter(([n]) => !n.startsWith("(b)") && !n.includes("memory run"))) {
    const d99 = m.p99 - proxy.p99;
    console.log(`| ${n} | ${f2(m.p50 - proxy.p50)} | ${f2(d99)} | ${n.includes("info") ? "(info logs; for comparison)" : verdict(d99 <= 2)} |`);
  }
}
latencyTables(`Latency at ${RATE} req/s, autocannon overallRate (${SECONDS} s, ${RATE_CONNECTIONS} connections: each sends its share of a second back to back, so requests come in bursts)`, fixedRate);
latencyTables(`Latency at ${RATE} req/s, evenly paced (${PACED_SECONDS} s, one request every ${(1000 / RATE).toFixed(2)} ms, open loop)`, paced);

console.log("\nRSS of each process before and after its measured runs (MB)\n");
console.log("| process | before | after |\n| --- | ---: | ---: |");
for (const [n, b, a] of rss) console.log(`| ${n} | ${f1(b)} | ${f1(a)} |`);

if (memorySeries.length > 0) {
  console.log(`\nGateway memory around a ${MEMORY_SECONDS}-second run at ${RATE} req/s (a fresh paid SQLite gateway; V8 heap from its GET /metrics)\n`);
  console.log("| when | RSS MB | V8 heap used MB |\n| --- | ---: | ---: |");
  for (const m of memorySeries) console.log(`| ${m.when} | ${f1(m.rss)} | ${f1(m.heap)} |`);
  // Live heap: the lowest V8 heap reading (the heap right after a major GC) of the last quarter of the run and after
  // it, against the lowest of the second quarter (the first quarter is start-up: caches, compiled code, the rate
  // limiter's log fill up). RSS: the trend over the second half of the run; V8 and the allocator keep freed pages,
  // so RSS lags the heap, and it keeps rising until V8's first major collections (about a minute here). A leak
  // shows as a steady climb of both.
  const during = memorySeries.filter((m) => m.when.startsWith("during"));
  const start = memorySeries[0]!;
  const minHeap = (from: number, to: number) => Math.min(...memorySeries.filter((m) => m.t >= from && m.t <= to).map((m) => m.heap));
  const liveHeapGrowth = minHeap(MEMORY_SECONDS * 0.75, Infinity) - minHeap(MEMORY_SECONDS * 0.25, MEMORY_SECONDS * 0.5);
  const secondHalf = during.filter((m) => m.t >= MEMORY_SECONDS / 2);
  const rssSlope = slopePerMinute(secondHalf.map((m) => ({ t: m.t, y: m.rss })));
  const idle = memorySeries.at(-1)!;
  console.log(
    `\nlive V8 heap (lowest reading of the last quarter vs the second quarter): ${liveHeapGrowth >= 0 ? "+" : ""}${f1(liveHeapGrowth)} MB; ` +
      `RSS ${f1(start.rss)} MB at start → ${f1(idle.rss)} MB after 10 s idle, trend over the second half ${rssSlope >= 0 ? "+" : ""}${f1(rssSlope)} MB/min\n` +
      `→ flat memory (live heap ≤ +10 MB and RSS trend over the second half ≤ +10 MB/min, i.e. under ~550 bytes per request): ` +
      verdict(liveHeapGrowth <= 10 && rssSlope <= 10) +
      (MEMORY_SECONDS < 120 ? ` (a ${MEMORY_SECONDS}-second run ends inside V8's start-up growth; --memory-seconds 180 shows the plateau)` : ""),
  );
} else {
  console.log("\n(memory run skipped: add --memory for RSS around a 60-second run at the moderate rate)");
}

const infoT = get(throughput, "(c')");
const infoR = get(fixedRate, "(c')");
const infoP = get(paced, "(c')");
const warnP = get(paced, "(c)");
const warnT = get(throughput, "(c)");
const warnR = get(fixedRate, "(c)");
if (infoT && warnT) {
  console.log(
    `\nLOG_LEVEL=info vs warn (preview, SQLite): throughput ${infoT.rps.toFixed(0)} vs ${warnT.rps.toFixed(0)} req/s (${f1((100 * (infoT.rps - warnT.rps)) / warnT.rps)} %)` +
      (infoR && warnR ? `; at ${RATE} req/s (autocannon) p50 ${f2(infoR.p50)} vs ${f2(warnR.p50)} ms, p99 ${f2(infoR.p99)} vs ${f2(warnR.p99)} ms` : "") +
      (infoP && warnP ? `; evenly paced p50 ${f2(infoP.p50)} vs ${f2(warnP.p50)} ms, p99 ${f2(infoP.p99)} vs ${f2(warnP.p99)} ms` : ""),
  );
}
for (const n of notes) console.log(`\n${n}`);
for (const [name, summary] of profiles) console.log(`\nCPU profile: ${name}\n\n${summary}`);
console.log(`\ntotal run time ${((Date.now() - started) / 1000).toFixed(0)} s`);
process.exit(0);
