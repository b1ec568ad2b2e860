/**
 * The latency tail at a steady, moderate rate after a burst of saturating load, with V8's allocation-site pretenuring
 * off (as the gateway runs: src/startup/gc-flags.ts) and on (`node --allocation-site-pretenuring`, which the gateway
 * leaves as given).
 *
 *   npx tsx bench/paced-tail.ts [--rounds 4] [--warm-seconds 10] [--paced-seconds 20] [--rate 300] [--mode preview|paid] [--sqlite]
 *
 * For each round and each variant in turn: a new PostgreSQL database (a SQLite file with --sqlite), an organization
 * with a key (and credits), the gateway in front of the precomputed model server; `--warm-seconds` saturating at 32
 * connections, 8 s more saturating while the gateway's CPU time is read (/proc, every thread), then `--paced-seconds`
 * at `--rate` req/s evenly paced (open loop, undici), each request timed. Around the paced load it reads the gateway's
 * CPU time again and its major (mark-compact) collections from its GET /metrics (tds_nodejs_gc_duration_seconds
 * {kind="major"}: their pauses, not the incremental marking between). V8 does not pretenure in every run, so a
 * variant's rounds are counted by whether a major collection ran while paced. Prints every slice and the medians;
 * nothing is asserted.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import { median, paced, percentile, saturate } from "./load.ts";
import { processCpuNs } from "./proc-cpu.ts";
import { OPEN_LIMITS, provisionOrg, realisticRequest, type Started, startGateway, startPrecomputedModel } from "./support.ts";

const { values: args } = parseArgs({
  options: {
    rounds: { type: "string", default: "4" },
    "warm-seconds": { type: "string", default: "10" },
    "paced-seconds": { type: "string", default: "20" },
    rate: { type: "string", default: "300" },
    mode: { type: "string", default: "preview" },
    sqlite: { type: "boolean", default: false },
  },
});
const ROUNDS = Number(args.rounds);
const WARM_SECONDS = Number(args["warm-seconds"]);
const PACED_SECONDS = Number(args["paced-seconds"]);
const RATE = Number(args.rate);
const MODE = args.mode === "paid" ? "paid" : "preview";
const CPU_SECONDS = 8;
const PAID_GRANT = 1_000_000_000_000_000;

const VARIANTS = [
  { name: "pretenuring off (the gateway's default)", nodeArgs: [] as string[] },
  { name: "pretenuring on (before)", nodeArgs: ["--allocation-site-pretenuring"] },
];

interface Slice {
  cpuUsPerRequest: number;
  pacedCpuUsPerRequest: number;
  p50: number;
  p90: number;
  p99: number;
  p999: number;
  max: number;
  majorGcs: number;
  majorGcMs: number;
  failures: number;
}

/** The gateway's major collections so far: their number and their total pause in ms. */
async function majorGcs(gateway: Started): Promise<{ count: number; ms: number }> {
  const res = await fetch(`${gateway.url}/metrics`);
  if (!res.ok) throw new Error(`GET /metrics answered ${res.status}`);
  const text = await res.text();
  // Absent until the first major collection; the minor ones' series shows that the metric is there at all.
  if (!/^tds_nodejs_gc_duration_seconds_count\{kind="minor"\} /m.test(text))
    throw new Error("GET /metrics has no tds_nodejs_gc_duration_seconds");
  const read = (suffix: string) =>
    Number(new RegExp(`^tds_nodejs_gc_duration_seconds_${suffix}\\{kind="major"\\} ([0-9.e+-]+)`, "m").exec(text)?.[1] ?? 0);
  return { count: read("count"), ms: read("sum") * 1000 };
}

async function database(): Promise<{ url: string; drop(): Promise<void> }> {
  if (!args.sqlite) return createTestDatabase("tds_bench_tail");
  const dir = mkdtempSync(join(tmpdir(), "tds-paced-tail-"));
  return { url: `sqlite:${join(dir, "tail.sqlite")}`, drop: async () => rmSync(dir, { recursive: true, force: true }) };
}

async function slice(modelUrl: string, nodeArgs: string[]): Promise<Slice> {
  const db = await database();
  try {
    const key = await provisionOrg(db.url, MODE === "paid" ? PAID_GRANT : 0);
    const gateway = await startGateway(
      { TDS_MODEL_SERVICE_URL: modelUrl, TDS_DATABASE_URL: db.url, TDS_SERVICE_MODE: MODE, ...OPEN_LIMITS },
      nodeArgs,
    );
    try {
      const target = { url: gateway.url, keys: [key] };
      const body = JSON.stringify(realisticRequest());
      await saturate(target, body, { connections: 32, seconds: WARM_SECONDS });
      const cpu0 = processCpuNs(gateway.child.pid!);
      const busy = await saturate(target, body, { connections: 32, seconds: CPU_SECONDS });
      const cpuUsPerRequest = (processCpuNs(gateway.child.pid!) - cpu0) / 1000 / busy.requests;
      const gc0 = await majorGcs(gateway);
      const pacedCpu0 = processCpuNs(gateway.child.pid!);
      const load = await paced(target, body, { seconds: PACED_SECONDS, rate: RATE });
      const pacedCpuUsPerRequest = (processCpuNs(gateway.child.pid!) - pacedCpu0) / 1000 / load.requests;
      const gc1 = await majorGcs(gateway);
      const times = load.times;
      return {
        cpuUsPerRequest,
        pacedCpuUsPerRequest,
        p50: percentile(times, 50),
        p90: percentile(times, 90),
        p99: percentile(times, 99),
        p999: percentile(times, 99.9),
        max: percentile(times, 100),
        majorGcs: gc1.count - gc0.count,
        majorGcMs: gc1.ms - gc0.ms,
        failures: load.failures,
      };
    } finally {
      await gateway.stop();
    }
  } finally {
    await db.drop();
  }
}

const f1 = (n: number) => n.toFixed(1);
const f2 = (n: number) => n.toFixed(2);

const model = await startPrecomputedModel();
const slices = new Map<string, Slice[]>(VARIANTS.map((v) => [v.name, []]));
try {
  for (let round = 1; round <= ROUNDS; round++) {
    // The order alternates, so that neither variant always runs first.
    const order = round % 2 === 1 ? VARIANTS : [...VARIANTS].reverse();
    for (const variant of order) {
      console.error(`round ${round} of ${ROUNDS}: ${variant.name}`);
      const s = await slice(model.url, variant.nodeArgs);
      slices.get(variant.name)!.push(s);
      console.error(
        `  saturating ${f1(s.cpuUsPerRequest)} µs/request; at ${RATE} req/s ${f1(s.pacedCpuUsPerRequest)} µs/request, p50 ${f2(s.p50)} p90 ${f2(s.p90)} p99 ${f2(s.p99)} ` +
          `p99.9 ${f2(s.p999)} max ${f2(s.max)} ms; ${s.majorGcs} major GCs (${f1(s.majorGcMs)} ms); ${s.failures} failures`,
      );
    }
  }
} finally {
  await model.stop();
}

const store = args.sqlite ? "SQLite" : "PostgreSQL";
console.log(
  `\n${MODE} gateway on ${store}: ${WARM_SECONDS + CPU_SECONDS} s saturating (32 connections), then ${PACED_SECONDS} s at ${RATE} req/s evenly paced; ` +
    `${ROUNDS} rounds, medians (the rounds)\n`,
);
console.log(
  "| variant | gateway CPU µs/request: saturating | paced | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | major GCs while paced (pauses, ms) | rounds with one | failures |",
);
console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const [name, ss] of slices) {
  const cell = (pick: (s: Slice) => number, fmt: (n: number) => string) =>
    `${fmt(median(ss.map(pick)))} (${ss.map((s) => fmt(pick(s))).join(" / ")})`;
  console.log(
    `| ${name} | ${cell((s) => s.cpuUsPerRequest, f1)} | ${cell((s) => s.pacedCpuUsPerRequest, f1)} | ${cell((s) => s.p50, f2)} | ${cell((s) => s.p90, f2)} | ${cell((s) => s.p99, f2)} | ` +
      `${cell((s) => s.p999, f2)} | ${cell((s) => s.max, f2)} | ${cell((s) => s.majorGcs, String)} (${cell((s) => s.majorGcMs, f1)}) | ${ss.filter((s) => s.majorGcs > 0).length} of ${ss.length} | ${ss.reduce((n, s) => n + s.failures, 0)} |`,
  );
}
