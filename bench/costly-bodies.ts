/**
 * The costliest bodies up to max_request_bytes (test/support/costly-bodies.ts: thousands of unknown fields or options
 * where the schema walks, huge labels, deep nesting), sent 10 at a time: how long does each take to check, and how
 * long does GET /healthz wait while they run?
 *
 *   npx tsx bench/costly-bodies.ts [--rounds 3] [--at-once 10] [--shape SUBSTRING] [--health-limit-ms 100] [--profile DIR]
 *
 * Per shape, first in this process: what the gateway does with the body before it answers a 422 (the scan for depth
 * and forwarded text, JSON.parse, the bounded schema check, the field errors), best of 5. Then through a real gateway
 * process (preview mode, SQLite in a temp folder, open limits; the fake model server with a context big enough for
 * 1 MiB, for the valid shapes): one body alone (median response time), then `--rounds` times `--at-once` copies sent
 * together on as many connections, while a process of its own (health-poller.ts) polls /healthz (one request at a
 * time, 1 ms apart): the slowest response of a round, and /healthz's p50 and worst latency over the rounds.
 *
 * Exit code 1 when a body answers another status than expected, or /healthz waited longer than --health-limit-ms.
 */
import assert from "node:assert/strict";
import { fork } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Agent, request } from "undici";
import { DecisionRequest } from "../src/contract/decision.ts";
import { boundDecisionRequest } from "../src/contract/decision-bound.ts";
import { scanJson } from "../src/contract/json-members.ts";
import { MAX_JSON_DEPTH } from "../src/contract/json-text.ts";
import { compileBoundedSchema, summarizeFieldErrors } from "../src/contract/validation.ts";
import { COSTLY_SHAPES, COSTLY_VALID_SHAPES, type CostlyShape, fitBody, MAX_REQUEST_BYTES } from "../test/support/costly-bodies.ts";
import { OPEN_LIMITS, provisionOrg, ROOT, type Started, startGateway, startProcess } from "./support.ts";

const { values } = parseArgs({
  options: {
    rounds: { type: "string", default: "3" },
    "at-once": { type: "string", default: "10" },
    shape: { type: "string" },
    "health-limit-ms": { type: "string", default: "100" },
    profile: { type: "string" },
  },
});
const ROUNDS = Number(values.rounds);
const AT_ONCE = Number(values["at-once"]);
const HEALTH_LIMIT_MS = Number(values["health-limit-ms"]);

const log = (msg: string) => process.stderr.write(`${msg}\n`);

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? Number.NaN : s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
}

// ── in this process: the checks of one body ──────────────────────────────────────────────────

const validate = compileBoundedSchema(DecisionRequest, boundDecisionRequest);

/** Best of 5: scan + JSON.parse, the bounded schema check, the field errors (ms each). */
function checkTimes(text: string): { parse: number; validate: number; errors: number } {
  const best = { parse: Infinity, validate: Infinity, errors: Infinity };
  for (let r = 0; r < 5; r++) {
    const t0 = performance.now();
    const scanned = scanJson(text, MAX_JSON_DEPTH, ["state", "questions"]);
    // A body nested too deep is refused by the scan, before parsing.
    const body = scanned.deeperThanLimit ? null : (JSON.parse(text) as unknown);
    const t1 = performance.now();
    const ok = body === null || validate(body);
    const t2 = performance.now();
    if (!ok) summarizeFieldErrors(validate.errors!);
    const t3 = performance.now();
    best.parse = Math.min(best.parse, t1 - t0);
    best.validate = Math.min(best.validate, t2 - t1);
    best.errors = Math.min(best.errors, t3 - t2);
  }
  return best;
}

// ── through the gateway ──────────────────────────────────────────────────────────────────────

const decisions = new Agent({ connections: AT_ONCE, keepAliveTimeout: 60_000 });

async function post(url: string, key: string, body: string): Promise<{ status: number; ms: number; text: string }> {
  const t0 = performance.now();
  const res = await request(`${url}/v1/systemone`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body,
    dispatcher: decisions,
  });
  const text = await res.body.text();
  return { status: res.statusCode, ms: performance.now() - t0, text };
}

/** The /healthz poller, in a process of its own (health-poller.ts): its latencies are the gateway's alone. */
function startHealthPoller(url: string): { during<T>(work: Promise<T>): Promise<[T, number[]]>; stop(): void } {
  const child = fork(join(ROOT, "bench/health-poller.ts"), [url], { execArgv: ["--import", "tsx"], stdio: "inherit" });
  return {
    async during(work) {
      const latencies = new Promise<number[]>((resolve) => child.once("message", (m) => resolve(m as number[])));
      child.send("start");
      const result = await work;
      child.send("stop");
      return [result, await latencies];
    },
    stop: () => child.disconnect(),
  };
}

async function main(): Promise<void> {
  const all: Array<{ shape: CostlyShape; valid: boolean }> = [
    ...COSTLY_SHAPES.map((shape) => ({ shape, valid: false })),
    ...COSTLY_VALID_SHAPES.map((shape) => ({ shape, valid: true })),
  ].filter(({ shape }) => values.shape === undefined || shape.name.includes(values.shape));
  const dir = mkdtempSync(join(tmpdir(), "tds-costly-bodies-"));
  const databaseUrl = `sqlite:${join(dir, "tds.sqlite")}`;
  let model: Started | null = null;
  let gateway: Started | null = null;
  let poller: ReturnType<typeof startHealthPoller> | null = null;
  const failures: string[] = [];
  try {
    model = await startProcess(
      ["test/fixtures/fake-model-server.ts", "--port", "0", "--max-input-tokens", "100000000"],
      {},
      /listening on (http:\/\/127\.0\.0\.1:\d+)/,
    );
    gateway = await startGateway(
      { TDS_DATABASE_URL: databaseUrl, TDS_MODEL_SERVICE_URL: model.url, TDS_MAX_REQUEST_BYTES: String(MAX_REQUEST_BYTES), ...OPEN_LIMITS },
      values.profile ? ["--cpu-prof", `--cpu-prof-dir=${values.profile}`] : [],
    );
    const key = await provisionOrg(databaseUrl);
    const { url } = gateway;
    for (let i = 0; i < 20; i++) {
      await post(url, key, JSON.stringify({ state: { i }, questions: { q: { type: "noul" }, c: { type: "choice", criteria: { a: 1 } } } }));
      await post(url, key, JSON.stringify({ state: 1, questions: { q: { type: "noul", criteria: 1 } }, x: 1 }));
    }
    poller = startHealthPoller(url);
    const [, baseline] = await poller.during(new Promise((r) => setTimeout(r, 1000)));

    const rows = [
      `| body | bytes | status | in process: parse / schema / errors ms | alone ms | ${AT_ONCE} at once: slowest ms | /healthz p50 / max ms (answers) |`,
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
      `| (nothing in flight: /healthz alone for 1 s) | – | – | – | – | – | ${quantile(baseline, 0.5).toFixed(1)} / ${Math.max(...baseline).toFixed(1)} (${baseline.length}) |`,
    ];
    for (const { shape, valid } of all) {
      const { body, n } = fitBody(shape);
      const bytes = Buffer.byteLength(body);
      assert.ok(bytes <= MAX_REQUEST_BYTES, `${shape.name}: ${bytes} bytes`);
      const expected = shape.expect(n).status;
      const check = checkTimes(body);
      const statuses = new Set<number>();
      const note = (r: { status: number; text: string }) => {
        statuses.add(r.status);
        if (r.status !== expected) failures.push(`${shape.name}: expected ${expected}, got ${r.status}: ${r.text.slice(0, 200)}`);
      };
      const alone: number[] = [];
      for (let i = 0; i < 3; i++) {
        const r = await post(url, key, body);
        note(r);
        alone.push(r.ms);
      }
      const healthMs: number[] = [];
      let slowest = 0;
      for (let round = 0; round < ROUNDS; round++) {
        const sent = Promise.all(Array.from({ length: AT_ONCE }, () => post(url, key, body)));
        const [results, latencies] = await poller.during(sent);
        for (const r of results) {
          note(r);
          slowest = Math.max(slowest, r.ms);
        }
        healthMs.push(...latencies);
      }
      const healthMax = Math.max(...healthMs);
      if (healthMax > HEALTH_LIMIT_MS) failures.push(`${shape.name}: /healthz waited ${healthMax.toFixed(1)} ms > ${HEALTH_LIMIT_MS} ms`);
      const row = `| ${shape.name}${valid ? " (valid)" : ""} | ${bytes} | ${[...statuses].join(",")} | ${check.parse.toFixed(1)} / ${check.validate.toFixed(1)} / ${check.errors.toFixed(1)} | ${quantile(alone, 0.5).toFixed(1)} | ${slowest.toFixed(1)} | ${quantile(healthMs, 0.5).toFixed(1)} / ${healthMax.toFixed(1)} (${healthMs.length}) |`;
      rows.push(row);
      log(row);
    }
    console.log(
      `\n${ROUNDS} rounds of ${AT_ONCE} bodies sent at once per shape; /healthz polled by another process meanwhile (one at a time, 1 ms apart).\n`,
    );
    console.log(rows.join("\n"));
    if (failures.length > 0) {
      console.log(`\nFAILED:\n${failures.map((f) => `- ${f}`).join("\n")}`);
      process.exitCode = 1;
    }
  } finally {
    await decisions.close();
    poller?.stop();
    await gateway?.stop();
    await model?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
