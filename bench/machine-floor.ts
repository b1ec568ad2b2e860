/**
 * What this machine allows: the latency and CPU time per request of processes that do almost nothing, at the paced
 * rates of bench/gateway.ts and at saturation, beside the gateway. Whether a latency target in milliseconds (added p99
 * ≤ 2 ms at 300 req/s) or a CPU ratio taken at a low rate can be judged on a machine depends on these figures.
 *
 *   npx tsx bench/machine-floor.ts [--runs 2] [--seconds 6] [--rates 50,300] [--no-gateway]
 *
 * Processes, each its own: (a) bench/precomputed-model.ts, which sends precomputed bytes without parsing the request;
 * (b) bench/passthrough-proxy.ts in front of it; (c) the gateway (src/server.ts), preview, SQLite, in front of it.
 * Each run takes them in turns: `--seconds` at each rate, evenly paced (open loop, undici), then 20,000 requests at 32
 * connections (autocannon); before them, `--seconds` with no load, to know what the process spends idle (timers, the
 * gateway's checkpoint thread). CPU time is every thread's schedstat from /proc, read around each slice. Prints, per
 * process and rate, the median over the runs of: CPU µs per request, the same less the idle rate over the slice's
 * time, and its ratio to the process's at saturation; p50 and p99 ms as this bench's own client (undici, on the same
 * cores) sees them: client, loopback and server together. Nothing is asserted. About 1.7 minutes per run.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { cpus, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { type Endpoint, median, paced, percentile, type Samples, saturate } from "./load.ts";
import { cpuSince, readCpu } from "./proc-cpu.ts";
import {
  OPEN_LIMITS,
  provisionOrg,
  realisticRequest,
  type Started,
  startGateway,
  startPassthroughProxy,
  startPrecomputedModel,
} from "./support.ts";

const { values } = parseArgs({
  options: {
    runs: { type: "string", default: "2" },
    seconds: { type: "string", default: "6" },
    rates: { type: "string", default: "50,300" },
    "no-gateway": { type: "boolean", default: false },
  },
});
const runs = Number(values.runs);
const seconds = Number(values.seconds);
const rates = values.rates!.split(",").map(Number);
const SATURATING_REQUESTS = 20_000;
const CONNECTIONS = 32;

interface Target extends Endpoint {
  name: string;
  pid: number;
}

/** One slice's figures: CPU µs per request of the target's process (and less its idle rate), and its latencies. */
interface Slice {
  cpuUs: number;
  busyUs: number;
  p50: number;
  p99: number;
}

/** Each target's CPU ns per second with no load, from the last idle slice. */
const idleNsPerSecond = new Map<string, number>();

async function measureIdle(t: Target): Promise<void> {
  const before = readCpu(t.pid);
  const started = performance.now();
  await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  idleNsPerSecond.set(t.name, cpuSince(before, readCpu(t.pid)).ns / ((performance.now() - started) / 1000));
}

const slices = new Map<string, Slice[]>();
const sliceKey = (target: string, rate: number | "saturating") => `${target}\t${rate}`;

async function measure(t: Target, rate: number | "saturating", body: string): Promise<void> {
  const before = readCpu(t.pid);
  const s: Samples =
    rate === "saturating"
      ? await saturate(t, body, { connections: CONNECTIONS, amount: SATURATING_REQUESTS })
      : await paced(t, body, { seconds, rate });
  const cpu = cpuSince(before, readCpu(t.pid));
  const key = sliceKey(t.name, rate);
  const idleNs = (idleNsPerSecond.get(t.name) ?? 0) * s.seconds;
  slices.set(key, [
    ...(slices.get(key) ?? []),
    {
      cpuUs: cpu.ns / 1000 / s.requests,
      busyUs: Math.max(0, cpu.ns - idleNs) / 1000 / s.requests,
      p50: percentile(s.times, 50),
      p99: percentile(s.times, 99),
    },
  ]);
  if (s.failures > 0) console.error(`${t.name} at ${rate}: ${s.failures} failures`);
}

const started: Started[] = [];
const dir = mkdtempSync(join(tmpdir(), "tds-floor-"));
try {
  const model = await startPrecomputedModel();
  started.push(model);
  const proxy = await startPassthroughProxy(model.url);
  started.push(proxy);
  const targets: Target[] = [
    { name: "(a) precomputed model server", url: model.url, pid: model.child.pid! },
    { name: "(b) pass-through proxy", url: proxy.url, pid: proxy.child.pid! },
  ];
  if (!values["no-gateway"]) {
    const url = `sqlite:${join(dir, "floor.sqlite")}`;
    const key = await provisionOrg(url);
    const gateway = await startGateway({
      TDS_MODEL_SERVICE_URL: model.url,
      TDS_DATABASE_URL: url,
      TDS_SERVICE_MODE: "preview",
      ...OPEN_LIMITS,
    });
    started.push(gateway);
    targets.push({ name: "(c) gateway, preview, SQLite", url: gateway.url, keys: [key], pid: gateway.child.pid! });
  }
  const body = JSON.stringify(realisticRequest());
  console.log(
    `${cpus().length} cores (${cpus()[0]?.model.trim()}), ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}; ` +
      `${runs} runs; paced slices of ${seconds} s at ${rates.join(", ")} req/s, then ${SATURATING_REQUESTS} requests at ${CONNECTIONS} connections`,
  );
  for (const t of targets) await paced(t, body, { seconds: 2, rate: 300 });
  for (let run = 0; run < runs; run++) {
    for (const t of targets) {
      await measureIdle(t);
      for (const rate of rates) await measure(t, rate, body);
      await measure(t, "saturating", body);
    }
    console.log(`run ${run + 1} of ${runs} done`);
  }

  const figure = (xs: Slice[], f: (s: Slice) => number) => median(xs.map(f));
  console.log(
    "\n| process | load | CPU µs per request | less idle | ÷ saturating (less idle) | p50 ms | p99 ms |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |",
  );
  for (const t of targets) {
    const saturated = figure(slices.get(sliceKey(t.name, "saturating"))!, (s) => s.busyUs);
    for (const rate of [...rates, "saturating" as const]) {
      const xs = slices.get(sliceKey(t.name, rate))!;
      const busy = figure(xs, (s) => s.busyUs);
      const load = rate === "saturating" ? `saturating, ${CONNECTIONS} connections` : `${rate} req/s paced`;
      console.log(
        `| ${t.name} | ${load} | ${figure(xs, (s) => s.cpuUs).toFixed(0)} | ${busy.toFixed(0)} | ${(busy / saturated).toFixed(2)} | ${figure(xs, (s) => s.p50).toFixed(2)} | ${figure(xs, (s) => s.p99).toFixed(2)} |`,
      );
    }
    console.log(`| ${t.name} | idle | ${((idleNsPerSecond.get(t.name) ?? 0) / 1e6).toFixed(1)} ms CPU per second | | | | |`);
  }
  const modelAt300 = slices.get(sliceKey(targets[0]!.name, 300));
  if (modelAt300) {
    const p99 = figure(modelAt300, (s) => s.p99);
    console.log(
      `\nThe model server alone, which does no work per request, is answered with p99 ${p99.toFixed(2)} ms at 300 req/s here ` +
        `(client, loopback and server together): a target of an added p99 of 2 ms can only be judged where this is well below 2 ms.`,
    );
  }
} finally {
  for (const s of started.reverse()) await s.stop();
  rmSync(dir, { recursive: true, force: true });
}
