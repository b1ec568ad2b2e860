/**
 * Bodies just under max_request_bytes (1 MiB by default), of many shapes: is each one answered quickly, whatever its
 * status, and does the gateway keep answering others (GET /healthz) meanwhile?
 *
 *   npx tsx bench/large-bodies.ts [--runs 5] [--shape SUBSTRING] [--limit-ms 100] [--profile DIR] [--no-scaling]
 *
 * Starts the fake model server (test/fixtures/fake-model-server.ts, with a context big enough for 1 MiB, so that valid
 * bodies reach a 200) and a real gateway process (preview mode, SQLite in a temp folder, open limits), provisions an
 * organization and key, then sends each body `--runs` times, one at a time, while a second connection polls
 * /healthz (one request at a time, 1 ms apart). Per shape: the status, the median and worst response time (client side: upload, the
 * gateway's work, the model call for a 200, the answer), and the worst /healthz latency seen while that body was
 * in flight. For a 200, the gateway's own time (gateway_latency_ms) and the model call's (latency_ms, the fake model
 * server parsing and answering 1 MiB in its own process) are shown apart. The baseline row is /healthz with nothing else in flight.
 *
 * Then, in this process, the schema check alone (JSON.parse, the route's validator: the body cut to a bounded size,
 * then Ajv with allErrors; the field errors of the response) on pathological shapes at n, 2n and 4n: each step must
 * grow linearly (4n/n ≈ 4).
 *
 * --profile DIR writes the gateway process's V8 CPU profile (.cpuprofile) into DIR when it exits.
 * Exit code 1 when a shape answers a status other than expected, or its median time in the gateway (the whole response
 * time, or gateway_latency_ms for a 200, whose model call is the fake's) exceeds --limit-ms.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Agent, request } from "undici";
import { DecisionRequest } from "../src/contract/decision.ts";
import { boundDecisionRequest } from "../src/contract/decision-bound.ts";
import { compileBoundedSchema, summarizeFieldErrors } from "../src/contract/validation.ts";
import { OPEN_LIMITS, provisionOrg, type Started, startGateway, startProcess } from "./support.ts";

const { values } = parseArgs({
  options: {
    runs: { type: "string", default: "5" },
    shape: { type: "string" },
    "limit-ms": { type: "string", default: "100" },
    profile: { type: "string" },
    "no-scaling": { type: "boolean", default: false },
  },
});
const RUNS = Number(values.runs);
const LIMIT_MS = Number(values["limit-ms"]);
const MAX_REQUEST_BYTES = 1_048_576;
/** "Just under" the limit: room for a little slack, never over it. */
const TARGET_BYTES = MAX_REQUEST_BYTES - 2_048;

type Json = unknown;
const many = (n: number, f: (i: number) => [string, Json]) => Object.fromEntries(Array.from({ length: n }, (_, i) => f(i)));
const questions = (n: number, q: (i: number) => Json) => many(n, (i) => [`q${i}`, q(i)]);
const nest = (depth: number, inner = "") => `${"[".repeat(depth)}${inner}${"]".repeat(depth)}`;

/** The largest n ≤ 2^24 whose body fits TARGET_BYTES (bodies grow with n). */
function fit(make: (n: number) => string): string {
  let lo = 1;
  let hi = 1;
  while (hi < 1 << 24 && Buffer.byteLength(make(hi)) <= TARGET_BYTES) hi *= 2;
  while (lo < hi - 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (Buffer.byteLength(make(mid)) <= TARGET_BYTES) lo = mid;
    else hi = mid;
  }
  return make(lo);
}

interface Shape {
  name: string;
  expect: number;
  body: () => string;
}

const SHAPES: Shape[] = [
  {
    name: "many invalid questions {type:noul,criteria:1}",
    expect: 422,
    body: () => fit((n) => JSON.stringify({ state: 1, questions: questions(n, () => ({ type: "noul", criteria: 1 })) })),
  },
  {
    name: "many valid questions (> max_questions)",
    expect: 422,
    body: () => fit((n) => JSON.stringify({ state: 1, questions: questions(n, () => ({ type: "noul" })) })),
  },
  {
    name: "32 questions, each with many unknown fields",
    expect: 422,
    body: () =>
      fit((n) => JSON.stringify({ state: 1, questions: questions(32, () => ({ type: "noul", ...many(n, (i) => [`k${i}`, 1]) })) })),
  },
  {
    name: "many unknown top-level fields",
    expect: 422,
    body: () => fit((n) => JSON.stringify({ state: 1, questions: { q: { type: "noul" } }, ...many(n, (i) => [`k${i}`, 1]) })),
  },
  {
    name: "noul criteria with many unknown keys",
    expect: 422,
    body: () =>
      fit((n) => JSON.stringify({ state: 1, questions: questions(32, () => ({ type: "noul", criteria: many(n, (i) => [`k${i}`, 1]) })) })),
  },
  {
    name: "32 x choice, 255 options with long names",
    expect: 200,
    body: () =>
      fit((n) =>
        JSON.stringify({
          state: 1,
          questions: questions(32, (q) => ({ type: "choice", criteria: many(255, (i) => [`${"option ".repeat(n)}${q}.${i}`, null]) })),
        }),
      ),
  },
  {
    name: "32 x choice, 255 options, long descriptions",
    expect: 200,
    body: () =>
      fit((n) =>
        JSON.stringify({
          state: 1,
          questions: questions(32, () => ({ type: "choice", criteria: many(255, (i) => [`o${i}`, "d".repeat(n)]) })),
        }),
      ),
  },
  {
    name: "32 x score, 255 levels",
    expect: 200,
    body: () =>
      fit((n) =>
        JSON.stringify({
          state: 1,
          questions: questions(32, () => ({ type: "score", criteria: Array.from({ length: 255 }, (_, i) => `${"level ".repeat(n)}${i}`) })),
        }),
      ),
  },
  {
    name: "32 questions, huge state/instructions/criteria",
    expect: 200,
    body: () =>
      fit((n) =>
        JSON.stringify({
          state: { ticket: "s".repeat(8 * n), history: Array.from({ length: 50 }, (_, i) => ({ i, text: "h".repeat(n) })) },
          questions: questions(32, (q) =>
            q % 3 === 0
              ? { type: "noul", instructions: "i".repeat(n), criteria: { true: "t".repeat(n), false: { why: "f".repeat(n) } } }
              : q % 3 === 1
                ? { type: "choice", instructions: { text: "i".repeat(n) }, criteria: { a: "a".repeat(n), b: ["b".repeat(n)], c: null } }
                : { type: "score", instructions: ["i".repeat(n)], criteria: ["low".repeat(n), { level: "high".repeat(n) }] },
          ),
        }),
      ),
  },
  // The body object and the state array are two levels: 254 more reach the limit of 256 exactly.
  {
    name: "state: many arrays nested to the 256-level limit",
    expect: 200,
    body: () => fit((n) => `{"state":[${Array.from({ length: n }, () => nest(254)).join(",")}],"questions":{"q":{"type":"noul"}}}`),
  },
  {
    name: "instructions/criteria values nested 250 deep",
    expect: 200,
    body: () =>
      fit(
        (n) =>
          `{"state":${nest(255)},"questions":{${Array.from(
            { length: 32 },
            (_, q) =>
              `"q${q}":{"type":"choice","instructions":${nest(250)},"criteria":{${Array.from({ length: n }, (_, i) => `"o${i}":${nest(250)}`).join(",")}}}`,
          ).join(",")}}}`,
      ),
  },
  {
    name: "state: many arrays, the last 257 levels deep",
    expect: 422,
    body: () =>
      fit(
        (n) =>
          `{"state":[${Array.from({ length: n }, (_, i) => nest(i === n - 1 ? 255 : 254)).join(",")}],"questions":{"q":{"type":"noul"}}}`,
      ),
  },
  { name: "state nested ~500,000 deep", expect: 422, body: () => fit((n) => `{"state":${nest(n)},"questions":{"q":{"type":"noul"}}}`) },
  {
    name: "state: one object with very many keys",
    expect: 200,
    body: () => fit((n) => JSON.stringify({ state: many(n, (i) => [`k${i}`, i]), questions: { q: { type: "noul" } } })),
  },
  {
    name: "state: one ~1 MiB string",
    expect: 200,
    body: () => fit((n) => JSON.stringify({ state: "x".repeat(n), questions: { q: { type: "noul" } } })),
  },
  {
    name: 'state: a string of escapes (\\u00e9 \\n \\")',
    expect: 200,
    body: () => fit((n) => `{"state":"${'\\u00e9\\n\\"'.repeat(n)}","questions":{"q":{"type":"noul"}}}`),
  },
  {
    name: "model: a ~1 MiB name",
    expect: 422,
    body: () => fit((n) => JSON.stringify({ state: 1, model: "m".repeat(n), questions: { q: { type: "noul" } } })),
  },
  {
    name: "question id of ~1 MiB",
    expect: 422,
    body: () => fit((n) => JSON.stringify({ state: 1, questions: { ["x".repeat(n)]: { type: "noul" } } })),
  },
  {
    name: "type tag of ~1 MiB",
    expect: 422,
    body: () => fit((n) => JSON.stringify({ state: 1, questions: { q: { type: "x".repeat(n) } } })),
  },
  {
    name: "option name of ~1 MiB",
    expect: 200,
    body: () =>
      fit((n) => JSON.stringify({ state: 1, questions: { q: { type: "choice", criteria: { ["o".repeat(n)]: null, b: null } } } })),
  },
  {
    name: "state: many numbers",
    expect: 200,
    body: () =>
      fit((n) => JSON.stringify({ state: Array.from({ length: n }, (_, i) => i * 1.25 - 7), questions: { q: { type: "noul" } } })),
  },
  {
    name: "state: many 20-digit integers and 1e308s",
    expect: 200,
    body: () =>
      fit(
        (n) =>
          `{"state":[${Array.from({ length: n }, (_, i) => (i % 2 ? "12345678901234567890" : "1.5e308")).join(",")}],"questions":{"q":{"type":"noul"}}}`,
      ),
  },
  {
    name: "state: many empty arrays and objects",
    expect: 200,
    body: () =>
      fit((n) => `{"state":[${Array.from({ length: n }, (_, i) => (i % 2 ? "[]" : "{}")).join(",")}],"questions":{"q":{"type":"noul"}}}`),
  },
  {
    name: "whitespace around a small body",
    expect: 200,
    body: () => fit((n) => `${" ".repeat(n)}{"state":1,${"\n".repeat(n)}"questions":{"q":{"type":"noul"}}}${"\t".repeat(n)}`),
  },
];

// ── measuring ────────────────────────────────────────────────────────────────────────────────

const decisions = new Agent({ connections: 1, keepAliveTimeout: 60_000 });
const health = new Agent({ connections: 1, keepAliveTimeout: 60_000 });

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

/** Polls /healthz, one request at a time, until `done` settles; the worst latency and the number of answers. */
async function pollHealth(url: string, done: Promise<unknown>): Promise<{ maxMs: number; answers: number }> {
  let finished = false;
  void done.finally(() => (finished = true));
  let maxMs = 0;
  let answers = 0;
  while (!finished) {
    const t0 = performance.now();
    const res = await request(`${url}/healthz`, { dispatcher: health });
    await res.body.text();
    assert.equal(res.statusCode, 200);
    maxMs = Math.max(maxMs, performance.now() - t0);
    answers++;
    // A pause of 1 ms: sensitive to any stall of the event loop, without the poll itself taking a core.
    await new Promise((r) => setTimeout(r, 1));
  }
  return { maxMs, answers };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

const log = (msg: string) => process.stderr.write(`${msg}\n`);

// ── the schema check alone, at n, 2n, 4n ─────────────────────────────────────────────────────

const SCALING: Array<{ name: string; make: (n: number) => string }> = [
  {
    name: "n questions {type:noul,criteria:1}",
    make: (n) => JSON.stringify({ state: 1, questions: questions(n, () => ({ type: "noul", criteria: 1 })) }),
  },
  { name: "n questions with a bad type tag", make: (n) => JSON.stringify({ state: 1, questions: questions(n, () => ({ type: "x" })) }) },
  {
    name: "n unknown top-level fields",
    make: (n) => JSON.stringify({ state: 1, questions: { q: { type: "noul" } }, ...many(n, (i) => [`k${i}`, 1]) }),
  },
  {
    name: "32 questions × n/32 unknown fields",
    make: (n) => JSON.stringify({ state: 1, questions: questions(32, () => ({ type: "noul", ...many(n / 32, (i) => [`k${i}`, 1]) })) }),
  },
  {
    name: "32 noul criteria × n/32 unknown keys",
    make: (n) =>
      JSON.stringify({ state: 1, questions: questions(32, () => ({ type: "noul", criteria: many(n / 32, (i) => [`k${i}`, 1]) })) }),
  },
  {
    name: "one choice of n options",
    make: (n) => JSON.stringify({ state: 1, questions: { q: { type: "choice", criteria: many(n, (i) => [`o${i}`, 1]) } } }),
  },
  {
    name: "32 × 255 options, names of n/2000 × 8 chars",
    make: (n) =>
      JSON.stringify({
        state: 1,
        questions: questions(32, () => ({ type: "choice", criteria: many(255, (i) => [`${"option ".repeat(n / 2000)}${i}`, null]) })),
      }),
  },
  { name: "state of n keys", make: (n) => JSON.stringify({ state: many(n, (i) => [`k${i}`, i]), questions: { q: { type: "noul" } } }) },
  {
    name: "state/instructions/criteria: n/128 arrays 250 deep",
    make: (n) =>
      `{"state":[${Array.from({ length: n / 256 }, () => nest(250)).join(",")}],"questions":{"q":{"type":"choice","instructions":[${Array.from({ length: n / 512 }, () => nest(250)).join(",")}],"criteria":{${Array.from({ length: 200 }, (_, i) => `"o${i}":[${Array.from({ length: n / 102_400 }, () => nest(250)).join(",")}]`).join(",")}}}}}`,
  },
  {
    name: "model name of 16n characters",
    make: (n) => JSON.stringify({ state: 1, model: "m".repeat(16 * n), questions: { q: { type: "noul" } } }),
  },
  {
    name: "question id of 8n astral characters",
    make: (n) => JSON.stringify({ state: 1, questions: { ["😀".repeat(8 * n)]: { type: "noul" } } }),
  },
];

function scalingTable(): string {
  const validate = compileBoundedSchema(DecisionRequest, boundDecisionRequest);
  const best = (text: string) => {
    const ms = [Infinity, Infinity, Infinity];
    let problems = 0;
    for (let r = 0; r < 7; r++) {
      const t0 = performance.now();
      const body = JSON.parse(text) as unknown;
      const t1 = performance.now();
      const ok = validate(body);
      const t2 = performance.now();
      problems = ok ? 0 : summarizeFieldErrors(validate.errors!).total;
      const t3 = performance.now();
      for (const [i, t] of [t1 - t0, t2 - t1, t3 - t2].entries()) ms[i] = Math.min(ms[i]!, t);
    }
    return { ms, problems };
  };
  const rows = [
    "| shape | n | KiB | JSON.parse ms | Ajv ms | field errors ms | problems |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const shape of SCALING) {
    for (const n of [12_800, 25_600, 51_200]) {
      const text = shape.make(n);
      const { ms, problems } = best(text);
      rows.push(
        `| ${shape.name} | ${n} | ${(Buffer.byteLength(text) / 1024).toFixed(0)} | ${ms[0]!.toFixed(1)} | ${ms[1]!.toFixed(1)} | ${ms[2]!.toFixed(1)} | ${problems} |`,
      );
    }
  }
  return rows.join("\n");
}

async function main(): Promise<void> {
  const shapes = values.shape ? SHAPES.filter((s) => s.name.includes(values.shape!)) : SHAPES;
  const dir = mkdtempSync(join(tmpdir(), "tds-large-bodies-"));
  const databaseUrl = `sqlite:${join(dir, "tds.sqlite")}`;
  let model: Started | null = null;
  let gateway: Started | null = null;
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

    // Warm-up: the code paths of a 200 and a 422 are compiled before anything is measured.
    for (let i = 0; i < 20; i++) {
      await post(
        url,
        key,
        JSON.stringify({ state: { i }, questions: { q: { type: "noul" }, c: { type: "choice", criteria: { a: 1, b: 2 } } } }),
      );
      await post(url, key, JSON.stringify({ state: 1, questions: { q: { type: "noul", criteria: 1 } }, x: 1 }));
    }
    const idle = new Promise((r) => setTimeout(r, 1000));
    const baseline = await pollHealth(url, idle);

    const rows: string[] = [];
    rows.push(`| body | bytes | status | median ms | max ms | 200: gateway / model call ms | /healthz max ms (answers) |`);
    rows.push(`| --- | ---: | ---: | ---: | ---: | ---: | ---: |`);
    rows.push(`| (nothing in flight: /healthz alone for 1 s) | – | – | – | – | – | ${baseline.maxMs.toFixed(1)} (${baseline.answers}) |`);
    for (const shape of shapes) {
      const body = shape.body();
      const bytes = Buffer.byteLength(body);
      assert.ok(bytes <= MAX_REQUEST_BYTES, `${shape.name}: ${bytes} bytes`);
      const times: number[] = [];
      const gatewayMs: number[] = [];
      const modelMs: number[] = [];
      const statuses = new Set<number>();
      let healthMax = 0;
      let healthAnswers = 0;
      for (let run = 0; run < RUNS; run++) {
        const sent = post(url, key, body);
        const [result, h] = await Promise.all([sent, pollHealth(url, sent)]);
        times.push(result.ms);
        statuses.add(result.status);
        healthMax = Math.max(healthMax, h.maxMs);
        healthAnswers += h.answers;
        if (result.status === 200) {
          const answer = JSON.parse(result.text) as { gateway_latency_ms: number; latency_ms: number };
          gatewayMs.push(answer.gateway_latency_ms);
          modelMs.push(answer.latency_ms);
        }
        if (result.status !== shape.expect)
          failures.push(`${shape.name}: expected ${shape.expect}, got ${result.status}: ${result.text.slice(0, 300)}`);
        else if (result.status !== 200) {
          const parsed = JSON.parse(result.text) as { detail?: unknown };
          if (typeof parsed.detail !== "string") failures.push(`${shape.name}: error body without a detail`);
        }
      }
      const med = median(times);
      // For a 200 the model call (the fake server parsing and answering 1 MiB in its own process) is not the gateway's time.
      const own = gatewayMs.length > 0 ? median(gatewayMs) : med;
      if (own > LIMIT_MS) failures.push(`${shape.name}: median ${own.toFixed(1)} ms of the gateway's own time > ${LIMIT_MS} ms`);
      const split = gatewayMs.length > 0 ? `${median(gatewayMs).toFixed(1)} / ${median(modelMs).toFixed(1)}` : "–";
      const row = `| ${shape.name} | ${bytes} | ${[...statuses].join(",")} | ${med.toFixed(1)} | ${Math.max(...times).toFixed(1)} | ${split} | ${healthMax.toFixed(1)} (${healthAnswers}) |`;
      rows.push(row);
      log(row);
    }
    console.log(`\n${RUNS} runs per body, one at a time; /healthz polled on a second connection meanwhile (one at a time, 1 ms apart).\n`);
    console.log(rows.join("\n"));
    if (!values["no-scaling"]) {
      console.log("\nThe schema check alone, in this process (best of 7), at n, 2n and 4n:\n");
      console.log(scalingTable());
    }
    if (failures.length > 0) {
      console.log(`\nFAILED:\n${failures.map((f) => `- ${f}`).join("\n")}`);
      process.exitCode = 1;
    }
  } finally {
    await decisions.close();
    await health.close();
    await gateway?.stop();
    await model?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
