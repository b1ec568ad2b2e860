/**
 * What routing over several deployments costs the gateway: CPU time per request with one deployment of the model,
 * with three, and with three of which one is down (connection refused; it cools down, and is probed again now and
 * then), loopback only.
 *
 *   npx tsx bench/routing.ts [--runs 3] [--slices 4] [--requests 4000] [--connections 32]
 *
 * Processes, all up for the whole comparison: three bench/precomputed-model.ts servers (they answer every request
 * with the same precomputed bytes, so their cost does not mask the gateway's) and three gateway processes
 * (src/server.ts, preview mode, SQLite in a temp folder, open limits, LOG_LEVEL=warn): (1) TDS_MODEL_SERVICE_URL with
 * one URL, (3) with the three URLs (replicas, weight 1 each), (3−1) with two of them and a closed port. Every request
 * is bench/support.ts realisticRequest().
 *
 * A run takes the setups in turns, `--slices` times each: a slice is `--requests` requests over `--connections`
 * connections (autocannon). Around each slice it reads the gateway process's CPU time from /proc (every thread;
 * proc-cpu.ts). Prints per run and as the median over runs: CPU µs per request, throughput, and the ratio to (1).
 */

import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import autocannon from "autocannon";
import { cpuSince, readCpu } from "./proc-cpu.ts";
import { OPEN_LIMITS, provisionOrg, realisticRequest, type Started, startGateway, startPrecomputedModel } from "./support.ts";

const { values } = parseArgs({
  options: {
    runs: { type: "string", default: "3" },
    slices: { type: "string", default: "4" },
    requests: { type: "string", default: "4000" },
    connections: { type: "string", default: "32" },
  },
});
const RUNS = Number(values.runs);
const SLICES = Number(values.slices);
const REQUESTS = Number(values.requests);
const CONNECTIONS = Number(values.connections);

interface Setup {
  id: string;
  label: string;
  gateway: Started;
  key: string;
}

interface Slice {
  requests: number;
  cpuNs: number;
  seconds: number;
  failed: number;
}

/** A port nothing listens on (bound, then released). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as { port: number };
  await new Promise<void>((r) => server.close(() => r()));
  return port;
}

async function slice(setup: Setup, body: string, amount: number): Promise<Slice> {
  const pid = setup.gateway.child.pid!;
  const cpu0 = readCpu(pid);
  const started = performance.now();
  const result = await autocannon({
    url: `${setup.gateway.url}/v1/systemone`,
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${setup.key}` },
    body,
    connections: CONNECTIONS,
    amount,
  });
  const seconds = (performance.now() - started) / 1000;
  await new Promise((r) => setTimeout(r, 20));
  const cpu = cpuSince(cpu0, readCpu(pid));
  return { requests: result.requests.total, cpuNs: cpu.ns, seconds, failed: result.errors + result.non2xx };
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

async function main(): Promise<void> {
  const models = await Promise.all([0, 1, 2].map(() => startPrecomputedModel()));
  const down = `http://127.0.0.1:${await closedPort()}`;
  const dirs: string[] = [];
  const setups: Setup[] = [];
  const start = async (id: string, label: string, urls: string[]) => {
    const dir = mkdtempSync(join(tmpdir(), `tds-bench-routing-${id}-`));
    dirs.push(dir);
    const databaseUrl = `sqlite:${join(dir, "tds.sqlite")}`;
    const key = await provisionOrg(databaseUrl);
    const gateway = await startGateway({ ...OPEN_LIMITS, TDS_DATABASE_URL: databaseUrl, TDS_MODEL_SERVICE_URL: urls.join(",") });
    setups.push({ id, label, gateway, key });
  };
  try {
    await start("1", "one deployment", [models[0]!.url]);
    await start(
      "3",
      "three deployments",
      models.map((m) => m.url),
    );
    await start("3-1", "three, one refusing connections", [models[0]!.url, models[1]!.url, down]);
    const body = JSON.stringify(realisticRequest());
    console.log(
      `routing overhead: ${RUNS} runs × ${SLICES} slices × ${REQUESTS} requests per setup, ${CONNECTIONS} connections, gateway CPU from /proc\n`,
    );
    for (const s of setups) await slice(s, body, Math.min(REQUESTS, 2000)); // warm-up (JIT, caches, cooldown of the down one)

    const perRun: Record<string, number[]> = Object.fromEntries(setups.map((s) => [s.id, []]));
    const rpsRun: Record<string, number[]> = Object.fromEntries(setups.map((s) => [s.id, []]));
    for (let run = 1; run <= RUNS; run++) {
      const totals = new Map(setups.map((s) => [s.id, { requests: 0, cpuNs: 0, seconds: 0, failed: 0 }]));
      for (let i = 0; i < SLICES; i++) {
        for (const s of setups) {
          const r = await slice(s, body, REQUESTS);
          const t = totals.get(s.id)!;
          t.requests += r.requests;
          t.cpuNs += r.cpuNs;
          t.seconds += r.seconds;
          t.failed += r.failed;
        }
      }
      console.log(`run ${run}`);
      console.log(
        "| setup | requests | failed | gateway CPU µs/request | ÷ one deployment | req/s |\n| --- | ---: | ---: | ---: | ---: | ---: |",
      );
      const base = totals.get("1")!;
      const baseUs = base.cpuNs / 1000 / base.requests;
      for (const s of setups) {
        const t = totals.get(s.id)!;
        const us = t.cpuNs / 1000 / t.requests;
        perRun[s.id]!.push(us / baseUs);
        rpsRun[s.id]!.push(t.requests / t.seconds);
        console.log(
          `| ${s.label} | ${t.requests} | ${t.failed} | ${us.toFixed(0)} | ${(us / baseUs).toFixed(3)} | ${(t.requests / t.seconds).toFixed(0)} |`,
        );
      }
      console.log();
    }
    console.log("median over runs");
    console.log("| setup | CPU ÷ one deployment | req/s |\n| --- | ---: | ---: |");
    for (const s of setups) console.log(`| ${s.label} | ${median(perRun[s.id]!).toFixed(3)} | ${median(rpsRun[s.id]!).toFixed(0)} |`);
  } finally {
    await Promise.all([...setups.map((s) => s.gateway.stop()), ...models.map((m) => m.stop())]);
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  }
}

await main();
