/**
 * Batch decisions against the fake model server (loopback only, about a minute):
 *
 *   npx tsx bench/batches.ts [--requests 20000] [--postgres] [--seconds 10] [--rate 50] [--paced-seconds 10] [--concurrency N]
 *
 * 1. interactive saturating throughput (autocannon, 32 connections) and the gateway's CPU per request;
 * 2. interactive latency at an even `--rate` req/s with no batch (the baseline);
 * 3. a batch of `--requests` realistic requests submitted and run to its end alone: its requests per second (its
 *    requests ÷ the time from its first start to its end) and their ratio to the interactive saturating throughput
 *    (aim ≥ 70 %), the gateway's CPU per batch request, its RSS every second over the run (flat: the upload is
 *    streamed and the results stay in the database);
 * 4. the same batch again with the paced interactive load beside it: the p99 interactive latency added by the running
 *    batch (aim ≤ 5 ms).
 *
 * On a shared two-core machine the load generator, the model server and the gateway compete for the cores:
 * compare the figures of one run with each other.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import { paced, percentile, type Samples, saturate } from "./load.ts";
import { cpuSince, readCpu } from "./proc-cpu.ts";
import { OPEN_LIMITS, provisionOrg, realisticRequest, startFakeModel, startGateway } from "./support.ts";

const { values } = parseArgs({
  options: {
    requests: { type: "string", default: "20000" },
    postgres: { type: "boolean", default: false },
    seconds: { type: "string", default: "10" },
    rate: { type: "string", default: "50" },
    "paced-seconds": { type: "string", default: "10" },
    connections: { type: "string", default: "32" },
    /** TDS_BATCH_GLOBAL_CONCURRENCY of the gateway (default: the setting's default). */
    concurrency: { type: "string" },
  },
});
const REQUESTS = Number(values.requests);
const SECONDS = Number(values.seconds);
const RATE = Number(values.rate);
const PACED_SECONDS = Number(values["paced-seconds"]);
const CONNECTIONS = Number(values.connections);
const REQUEST = realisticRequest();
const BODY = JSON.stringify(REQUEST);
const THROUGHPUT_TARGET = 0.7;
const ADDED_P99_TARGET_MS = 5;

const t0 = Date.now();
const log = (msg: string) => process.stderr.write(`[${((Date.now() - t0) / 1000).toFixed(0).padStart(3)} s] ${msg}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const f1 = (v: number) => (Number.isFinite(v) ? v.toFixed(1) : "–");
const f2 = (v: number) => (Number.isFinite(v) ? v.toFixed(2) : "–");

function rssMb(pid: number): number {
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return match ? Number(match[1]) / 1024 : Number.NaN;
}

interface BatchView {
  status: string;
  started_at: string | null;
  ended_at: string | null;
  request_counts: { total: number; succeeded: number; failed: number };
}

async function main(): Promise<void> {
  const cleanups: Array<() => Promise<void> | void> = [];
  try {
    const model = await startFakeModel();
    cleanups.push(() => model.stop());
    let databaseUrl: string;
    if (values.postgres) {
      const db = await createTestDatabase();
      databaseUrl = db.url;
      cleanups.push(() => db.drop());
    } else {
      const dir = mkdtempSync(join(tmpdir(), "tds-bench-batches-"));
      cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
      databaseUrl = `sqlite:${join(dir, "tds.sqlite")}`;
    }
    const gateway = await startGateway({
      ...OPEN_LIMITS,
      TDS_DATABASE_URL: databaseUrl,
      TDS_MODEL_SERVICE_URL: model.url,
      ...(values.concurrency ? { TDS_BATCH_GLOBAL_CONCURRENCY: values.concurrency, TDS_BATCH_CONCURRENCY: values.concurrency } : {}),
    });
    cleanups.push(() => gateway.stop());
    const pid = gateway.child.pid!;
    const interactiveKey = await provisionOrg(databaseUrl);
    const batchKey = await provisionOrg(databaseUrl);
    const interactive = { url: gateway.url, keys: [interactiveKey] };

    log("warm-up");
    await saturate(interactive, BODY, { connections: CONNECTIONS, seconds: 2 });

    log(`interactive saturating, ${SECONDS} s`);
    let cpu = readCpu(pid);
    const saturating = await saturate(interactive, BODY, { connections: CONNECTIONS, seconds: SECONDS });
    const saturatingCpu = cpuSince(cpu, readCpu(pid));
    const interactiveRps = saturating.requests / saturating.seconds;

    log(`interactive at ${RATE} req/s, no batch, ${PACED_SECONDS} s`);
    const baseline = await paced(interactive, BODY, { seconds: PACED_SECONDS, rate: RATE });

    const lines = Array.from({ length: REQUESTS }, (_, i) => JSON.stringify({ custom_id: `r${i}`, ...REQUEST })).join("\n");
    const submit = async (): Promise<{ id: string; uploadSeconds: number }> => {
      const uploadStart = performance.now();
      const res = await fetch(`${gateway.url}/v1/batches`, {
        method: "POST",
        headers: { authorization: `Bearer ${batchKey}`, "content-type": "application/x-ndjson" },
        body: lines,
      });
      if (res.status !== 202) throw new Error(`submission answered ${res.status}: ${await res.text()}`);
      return { id: ((await res.json()) as { id: string }).id, uploadSeconds: (performance.now() - uploadStart) / 1000 };
    };
    const poll = async (id: string): Promise<BatchView> =>
      (await (await fetch(`${gateway.url}/v1/batches/${id}`, { headers: { authorization: `Bearer ${batchKey}` } })).json()) as BatchView;
    const ended = (b: BatchView) => ["completed", "cancelled", "expired"].includes(b.status);
    const untilEnded = async (id: string): Promise<BatchView> => {
      let batch = await poll(id);
      while (!ended(batch)) {
        await sleep(250);
        batch = await poll(id);
      }
      return batch;
    };
    const runSecondsOf = (b: BatchView) => (Date.parse(b.ended_at!) - Date.parse(b.started_at!)) / 1000;

    log(`batch alone: ${REQUESTS} requests (${(lines.length / 1024 / 1024).toFixed(1)} MiB)`);
    const rss: Array<{ t: number; mb: number }> = [{ t: 0, mb: rssMb(pid) }];
    const runStart = performance.now();
    const sampler = setInterval(() => rss.push({ t: (performance.now() - runStart) / 1000, mb: rssMb(pid) }), 1000);
    cpu = readCpu(pid);
    const alone = await submit();
    const aloneBatch = await untilEnded(alone.id);
    const aloneCpu = cpuSince(cpu, readCpu(pid));
    clearInterval(sampler);
    rss.push({ t: (performance.now() - runStart) / 1000, mb: rssMb(pid) });
    const results = await (
      await fetch(`${gateway.url}/v1/batches/${alone.id}/results`, { headers: { authorization: `Bearer ${batchKey}` } })
    ).text();
    const resultLines = results.split("\n").filter((l) => l.length > 0);
    const ok = resultLines.filter((l) => l.includes('"status":200,')).length;
    const batchRps = aloneBatch.request_counts.total / runSecondsOf(aloneBatch);

    log(`batch with interactive at ${RATE} req/s beside it (${PACED_SECONDS} s)`);
    const beside = await submit();
    await sleep(500);
    const during = await paced(interactive, BODY, { seconds: PACED_SECONDS, rate: RATE });
    const stillRunning = !ended(await poll(beside.id));
    const besideBatch = await untilEnded(beside.id);

    const p = (samples: Samples, q: number) => percentile(samples.times, q);
    const addedP99 = p(during, 99) - p(baseline, 99);
    const half = Math.floor(rss.length / 2);
    const medianOf = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
    const firstHalf = medianOf(rss.slice(1, half).map((sample) => sample.mb));
    const secondHalf = medianOf(rss.slice(half).map((sample) => sample.mb));
    const usPerRequest = (c: { ns: number }, n: number) => c.ns / 1000 / n;

    const out = [
      `## Batch decisions (${values.postgres ? "PostgreSQL" : "SQLite"}, ${REQUESTS} requests, fake model server)`,
      "",
      "| measure | value |",
      "| --- | ---: |",
      `| interactive saturating (${CONNECTIONS} connections) | ${f1(interactiveRps)} req/s |`,
      `| batch alone (first start → end) | ${f1(batchRps)} req/s in ${f1(runSecondsOf(aloneBatch))} s |`,
      `| batch ÷ interactive | ${f2(batchRps / interactiveRps)} (aim ≥ ${THROUGHPUT_TARGET}) |`,
      `| submission upload (${(lines.length / 1024 / 1024).toFixed(1)} MiB) | ${f1(alone.uploadSeconds)} s |`,
      `| gateway CPU per interactive request (saturating) | ${f1(usPerRequest(saturatingCpu, saturating.requests))} µs |`,
      `| gateway CPU per batch request (upload and checks included) | ${f1(usPerRequest(aloneCpu, REQUESTS))} µs |`,
      `| results | ${resultLines.length} lines, ${ok} status 200; counts ${JSON.stringify(aloneBatch.request_counts)} |`,
      `| gateway RSS before / median 1st half / median 2nd half / max / end | ${f1(rss[0]!.mb)} / ${f1(firstHalf)} / ${f1(secondHalf)} / ${f1(Math.max(...rss.map((sample) => sample.mb)))} / ${f1(rss.at(-1)!.mb)} MB |`,
      `| interactive at ${RATE} req/s, no batch: p50 / p99 | ${f2(p(baseline, 50))} / ${f2(p(baseline, 99))} ms |`,
      `| interactive at ${RATE} req/s, batch running: p50 / p99 | ${f2(p(during, 50))} / ${f2(p(during, 99))} ms${stillRunning ? "" : " (the batch ended before the paced load did)"} |`,
      `| added p99 | ${f2(addedP99)} ms (aim ≤ ${ADDED_P99_TARGET_MS}) |`,
      `| batch beside the interactive load | ${f1(besideBatch.request_counts.total / runSecondsOf(besideBatch))} req/s over its whole run |`,
      `| interactive failures: baseline / during | ${baseline.failures} / ${during.failures} |`,
    ];
    process.stdout.write(`${out.join("\n")}\n`);
  } finally {
    for (const cleanup of cleanups.reverse()) await cleanup();
  }
}

await main();
