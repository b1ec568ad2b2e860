/**
 * What OpenTelemetry tracing costs the gateway: CPU time per request of the gateway process with tracing off (no
 * OTEL_* variables) and on, every request sampled (OTEL_TRACES_SAMPLER=always_on) and exported over OTLP/HTTP
 * (http/protobuf) to a local sink that reads and drops the exports. Loopback only.
 *
 *   npx tsx bench/tracing.ts [--runs 3] [--requests 3000] [--connections 16] [--before DIR]
 *
 * `--before DIR`: a checkout of the code before tracing existed (e.g. `git worktree add DIR <commit>`, with this
 * checkout's node_modules linked into it), run as a third gateway in the same turns: "off" ÷ "before" is what the
 * tracing code costs a gateway that does not trace.
 *
 * Processes: the fake model server (test/fixtures/fake-model-server.ts) and two gateways (src/server.ts, preview
 * mode, SQLite, each its own file, LOG_LEVEL=warn), both up for the whole comparison; the sink runs in this process.
 * After a warm-up of each, a run takes the two gateways in turns (the order alternating from run to run):
 * `--requests` decisions (bench/support.ts realisticRequest(), one span tree of 5 spans each when traced) over
 * `--connections` connections (autocannon), then a pause of a second in which the traced gateway exports what it
 * holds (its batch span processor is told to send every 200 ms), with the CPU time of the gateway process (every
 * thread's schedstat in /proc: proc-cpu.ts) read before the load and after the pause. CPU time per request does not
 * depend on how the two cores were shared with the load generator and the model server, unlike throughput.
 *
 * Prints per run and as medians: CPU µs per request off and on, and on ÷ off; the spans the sink received. Then what
 * the request path runs while tracing is off, timed alone in this process (no context manager registered, as in an
 * untraced gateway): the HTTP adapter's look for a traced attempt (src/models/systemone-http/call-span.ts), the one
 * call per request that is not a null check, in ns per call and as a share of the off gateway's CPU per request.
 */

import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs, promisify } from "node:util";
import { traceExchange } from "../src/models/systemone-http/call-span.ts";
import { median, saturate } from "./load.ts";
import { cpuSince, readCpu } from "./proc-cpu.ts";
import { provisionOrg, realisticRequest, type Started, startFakeModel, startGateway } from "./support.ts";

const { values } = parseArgs({
  options: {
    runs: { type: "string", default: "3" },
    requests: { type: "string", default: "3000" },
    connections: { type: "string", default: "16" },
    before: { type: "string" },
  },
});
const RUNS = Number(values.runs);
const REQUESTS = Number(values.requests);
const CONNECTIONS = Number(values.connections);
const BEFORE = values.before;
const BODY = JSON.stringify(realisticRequest());
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const log = (msg: string) => process.stderr.write(`${msg}\n`);

/** An OTLP/HTTP sink: reads every export, answers 200, counts them and their bytes. */
async function startSink(): Promise<{ url: string; exports: number; bytes: number; close(): Promise<void> }> {
  const sink = {
    url: "",
    exports: 0,
    bytes: 0,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
  const server = createServer((req, res) => {
    req.on("data", (chunk: Buffer) => {
      sink.bytes += chunk.length;
    });
    req.on("end", () => {
      sink.exports++;
      res.writeHead(200, { "content-type": "application/x-protobuf" }).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  sink.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return sink;
}

/** An organization and key in a database of the code before, made by that code: its raw key. */
async function provisionBefore(checkout: string, databaseUrl: string): Promise<string> {
  const script = 'const { provisionOrg } = await import("./bench/support.ts"); console.log(await provisionOrg(process.argv.at(-1)));';
  const { stdout } = await promisify(execFile)(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script, databaseUrl], {
    cwd: checkout,
  });
  return stdout.trim().split("\n").at(-1)!;
}

interface Setup {
  name: "before" | "off" | "on";
  gateway: Started;
  key: string;
  cpuUsPerRequest: number[];
}

const dir = mkdtempSync(join(tmpdir(), "tds-bench-tracing-"));
const started: Started[] = [];
const sink = await startSink();
try {
  const model = await startFakeModel();
  started.push(model);
  const common = {
    TDS_MODEL_SERVICE_URL: model.url,
    TDS_REQUESTS_PER_MINUTE: "1000000",
    TDS_PREVIEW_REQUEST_LIMIT: "100000000",
    TDS_PREVIEW_GLOBAL_REQUEST_LIMIT: "100000000",
  };
  const setups: Setup[] = [];
  for (const name of BEFORE ? (["before", "off", "on"] as const) : (["off", "on"] as const)) {
    const databaseUrl = `sqlite:${join(dir, `${name}.sqlite`)}`;
    // The code before provisions its own database (its schema is older than this checkout's).
    const key = name === "before" ? await provisionBefore(BEFORE!, databaseUrl) : await provisionOrg(databaseUrl);
    const traced = {
      OTEL_EXPORTER_OTLP_ENDPOINT: sink.url,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf",
      OTEL_TRACES_SAMPLER: "always_on",
      OTEL_BSP_SCHEDULE_DELAY: "200",
    };
    const gateway = await startGateway(
      { ...common, TDS_DATABASE_URL: databaseUrl, ...(name === "on" ? traced : {}) },
      [],
      name === "before" ? BEFORE : undefined,
    );
    started.push(gateway);
    setups.push({ name, gateway, key, cpuUsPerRequest: [] });
  }

  const load = async (s: Setup, amount: number) => {
    const samples = await saturate({ url: s.gateway.url, keys: [s.key] }, BODY, { connections: CONNECTIONS, amount });
    if (samples.failures > 0) throw new Error(`${s.name}: ${samples.failures} of ${samples.requests} requests failed`);
    return samples;
  };

  for (const s of setups) await load(s, 1000);
  await sleep(1000);
  const exportsBefore = sink.exports;

  for (let run = 0; run < RUNS; run++) {
    const order = run % 2 === 0 ? setups : [...setups].reverse();
    for (const s of order) {
      const pid = s.gateway.child.pid!;
      const before = readCpu(pid);
      const samples = await load(s, REQUESTS);
      await sleep(1000);
      const cpu = cpuSince(before, readCpu(pid));
      const us = cpu.ns / 1000 / samples.requests;
      s.cpuUsPerRequest.push(us);
      log(
        `run ${run + 1}, tracing ${s.name}: ${us.toFixed(1)} µs CPU per request (${(samples.requests / samples.seconds).toFixed(0)} req/s)`,
      );
    }
  }

  const byName = (name: Setup["name"]) => setups.find((s) => s.name === name);
  const [off, on, before] = [byName("off")!, byName("on")!, byName("before")];
  const ratios = off.cpuUsPerRequest.map((o, i) => on.cpuUsPerRequest[i]! / o);
  const f1 = (v: number) => v.toFixed(1);
  console.log(`\nCPU per request of the gateway process, ${RUNS} runs of ${REQUESTS} requests at ${CONNECTIONS} connections`);
  console.log("| tracing | CPU µs per request (runs) | median |");
  console.log("| --- | ---: | ---: |");
  console.log(`| off (no OTEL_* variables) | ${off.cpuUsPerRequest.map(f1).join(" / ")} | ${f1(median(off.cpuUsPerRequest))} |`);
  console.log(`| on, always_on, OTLP http/protobuf | ${on.cpuUsPerRequest.map(f1).join(" / ")} | ${f1(median(on.cpuUsPerRequest))} |`);
  console.log(`| on ÷ off | ${ratios.map((r) => r.toFixed(2)).join(" / ")} | ${median(ratios).toFixed(2)} |`);
  if (before) {
    const offRatios = before.cpuUsPerRequest.map((b, i) => off.cpuUsPerRequest[i]! / b);
    console.log(`| before (no tracing code) | ${before.cpuUsPerRequest.map(f1).join(" / ")} | ${f1(median(before.cpuUsPerRequest))} |`);
    console.log(`| off ÷ before | ${offRatios.map((r) => r.toFixed(2)).join(" / ")} | ${median(offRatios).toFixed(2)} |`);
  }
  const headers: Record<string, string> = { accept: "application/json" };
  const origin = new URL("http://127.0.0.1:9090");
  const calls = 5_000_000;
  let traced = 0;
  const t0 = process.cpuUsage();
  for (let i = 0; i < calls; i++) if (traceExchange(headers, "POST", origin, "/v1/systemone") !== undefined) traced++;
  const spent = process.cpuUsage(t0);
  const nsPerCall = ((spent.user + spent.system) * 1000) / calls;
  if (traced > 0 || "traceparent" in headers) throw new Error("an untraced call was traced");
  console.log(
    `\nTracing off, per request: the adapter's look for a traced attempt costs ${nsPerCall.toFixed(1)} ns ` +
      `(${((nsPerCall / 1000 / median(off.cpuUsPerRequest)) * 100).toFixed(4)} % of the off gateway's CPU per request).`,
  );
  console.log(
    `\nThe sink received ${sink.exports - exportsBefore} exports during the runs (${sink.exports} in all, ${(sink.bytes / 1e6).toFixed(1)} MB).`,
  );
} finally {
  await Promise.all(started.map((s) => s.stop()));
  await sink.close();
  rmSync(dir, { recursive: true, force: true });
}
