/**
 * The CPU floor of what the decision contract requires, against the targets of bench/gateway.ts (gateway CPU per
 * request ÷ the pass-through proxy's ≤ 2.5× SQLite preview, 3× SQLite paid, 4× PostgreSQL preview, 5× PostgreSQL paid).
 *
 *   npx tsx bench/essential-floor.ts        (about 1 minute; needs PostgreSQL on 127.0.0.1:5432 for its two setups)
 *
 * Every essential step of one POST /v1/systemone is measured alone, in this process, with the project's own functions
 * and bench/support.ts realisticRequest():
 *
 *   1. body parse: strict UTF-8 decode of the body bytes + parseJsonText (as src/http/json-body-parser.ts does);
 *   2. validation: the route's body validator, compileBoundedSchema(DecisionRequest, boundDecisionRequest);
 *   3. API key check: what src/http/auth.ts does per request besides the store lookup (Bearer header, keyIdOf,
 *      apiKeyMatches: sha256 + constant-time compare, keyRefusal);
 *   4. books: store.commitBatch in steady-state batches of 8 requests (about what a gateway commits at 32 connections: ~15 steps per transaction; each admits 8 and completes the 8 before: one
 *      admission + one completion per request), SQLite opened as a serving gateway opens it (SERVING_SQLITE, so its
 *      checkpoint thread counts), PostgreSQL a scratch database with 8,000 requests of history, opened as a serving
 *      gateway opens it (keepStatisticsFresh: analyzed tables, generic plans); this process's CPU only (the store's
 *      JavaScript and pg's protocol work); PostgreSQL's own CPU is printed apart, as information. A transaction that
 *      finds SQLite busy (its checkpoint thread holding the lock) is committed again after a pause, as the group
 *      committer does; the failed attempts count;
 *   5. model request body: the JSON text the System One HTTP adapter sends (decideRequestBody: the request's own text of
 *      state and questions plus the model name, as a Buffer);
 *   6. model answer: parseJsonBody + parseDecideEnvelope on the bytes bench/precomputed-model.ts sends (fetched from
 *      it), then checkAnswers against the request's questions;
 *   7. response: chargeOf + the DecisionResponse object + JSON.stringify, as DecisionPipeline.succeeded builds it.
 *
 * CPU is process.cpuUsage() (user + system, every thread of this process: GC helpers and SQLite's checkpoint thread
 * count) around N iterations after a warm-up of N, three rounds, median (N = 20,000; books: 4,000 requests).
 * The proxy's own CPU per request is measured in the same run: bench/precomputed-model.ts and bench/passthrough-proxy.ts
 * as child processes (as bench/gateway.ts starts them), saturated at 32 connections for three slices of 3 s after a
 * 2 s warm-up, the proxy's CPU (all threads) read from /proc around each slice; median.
 *
 * floor ratio = (proxy µs + sum of the steps' µs) ÷ proxy µs: a lower bound of the gateway's ratio, since everything
 * else it does (Fastify's routing, hooks and reply, rate limits, metrics, logging, promises and timers, the model
 * call's HTTP client, the key lookup, the group committer, the GC of all that) is left out. Nearly: the proxy reads its
 * upstream's answer through undici's `request` and a stream, a few µs per call more than the gateway's own handler on
 * `dispatch`, and that is counted in the proxy's part of the floor.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { DecisionRequest, type DecisionResponse, type Question } from "../src/contract/decision.ts";
import { boundDecisionRequest } from "../src/contract/decision-bound.ts";
import { forwardedText, parseJsonText } from "../src/contract/json-text.ts";
import { compileBoundedSchema } from "../src/contract/validation.ts";
import { apiKeyMatches, generateApiKey, keyIdOf, newRequestId } from "../src/domain/api-keys.ts";
import { parseUsd } from "../src/domain/money.ts";
import { checkAnswers } from "../src/gateway/answer-check.ts";
import { type Charging, chargeOf } from "../src/gateway/charging.ts";
import { round3 } from "../src/gateway/completion.ts";
import { keyRefusal } from "../src/gateway/key-controls.ts";
import { BEARER } from "../src/http/auth.ts";
import { parseDecideEnvelope, parseJsonBody } from "../src/models/systemone-http/parse-response.ts";
import { decideRequestBody } from "../src/models/systemone-http/systemone-http-service.ts";
import { openStore } from "../src/store/open-store.ts";
import { SERVING_SQLITE } from "../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../src/store/store.ts";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import { benchAdmission, benchCompletion, provisionBenchOrg, RESERVATION_MICROUSD } from "./book-steps.ts";
import { median, saturate } from "./load.ts";
import { cpuSince, postgresCpuSince, readCpu, readPostgresCpu } from "./proc-cpu.ts";
import { realisticRequest, type Started, startPassthroughProxy, startPrecomputedModel } from "./support.ts";

type Mode = "preview" | "paid";
type SetupId = "sqlite-preview" | "sqlite-paid" | "pg-preview" | "pg-paid";

const N = 20_000;
const ROUNDS = 3;
const BOOK_REQUESTS = 4_000;
const BATCH = 8;
const PROXY_CONNECTIONS = 32;
const PROXY_SLICES = 3;
const PROXY_SLICE_SECONDS = 3;
const PROXY_WARMUP_SECONDS = 2;
const GRANT = 1_000_000_000_000;
/** The model the bench's model server names, as the gateway forwards it (call.model) and answers it (response.model). */
const MODEL = "bench-precomputed";

const SETUPS: Array<{ id: SetupId; name: string; mode: Mode; target: number }> = [
  { id: "sqlite-preview", name: "SQLite preview", mode: "preview", target: 2.5 },
  { id: "sqlite-paid", name: "SQLite paid", mode: "paid", target: 3 },
  { id: "pg-preview", name: "PostgreSQL preview", mode: "preview", target: 4 },
  { id: "pg-paid", name: "PostgreSQL paid", mode: "paid", target: 5 },
];

const started = Date.now();
const log = (msg: string) => process.stderr.write(`[${((Date.now() - started) / 1000).toFixed(0).padStart(3)} s] ${msg}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const f1 = (v: number) => (Number.isFinite(v) ? v.toFixed(1) : "–");
const f2 = (v: number) => (Number.isFinite(v) ? v.toFixed(2) : "–");

/** Whatever the steps produce is folded into this, printed at the end, so that no step is optimized away. */
let sink = 0;

const cpuUs = (before: NodeJS.CpuUsage): number => {
  const d = process.cpuUsage(before);
  return d.user + d.system;
};

/** A median of rounds, with the lowest and highest round. */
interface Measured {
  us: number;
  min: number;
  max: number;
}

const measuredOf = (rounds: number[]): Measured => ({ us: median(rounds), min: Math.min(...rounds), max: Math.max(...rounds) });
const range = (m: Measured) => `${f1(m.min)}–${f1(m.max)}`;

/** CPU µs per iteration of `fn`: N warm-up iterations, then ROUNDS rounds of N, median. */
function perIteration(fn: (i: number) => number): Measured {
  for (let i = 0; i < N; i++) sink += fn(i);
  const rounds: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = process.cpuUsage();
    let acc = 0;
    for (let i = 0; i < N; i++) acc += fn(i);
    rounds.push(cpuUs(t0) / N);
    sink += acc;
  }
  return measuredOf(rounds);
}

// ── the request, the key, the model's answer ─────────────────────────────────────────────────

const BODY_TEXT = JSON.stringify(realisticRequest());
const BODY_BYTES = Buffer.from(BODY_TEXT, "utf8");
/** The body parser's decoder (json-body-parser.ts): strict UTF-8, BOM not ignored. */
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: false });

/** Distinct parsed bodies taken in turn: the later steps see objects of their own, not one object ever hot in cache. */
const RING = 64;

interface ParsedRequest {
  body: DecisionRequest;
  text: { state: string; questions: string };
}

function parseRequest(): ParsedRequest {
  const parsed = parseJsonText(utf8.decode(BODY_BYTES));
  if ("problem" in parsed) throw new Error(`realistic request: ${parsed.problem}`);
  const text = forwardedText(parsed.members);
  if (!text) throw new Error("realistic request: no state/questions text");
  return { body: parsed.body as DecisionRequest, text };
}

// ── steps 1–3, 5–7 (in-process, pure) ───────────────────────────────────────────────────────

interface StepResult extends Measured {
  step: string;
  setups: SetupId[] | "all";
}

function pureSteps(modelAnswer: Buffer): StepResult[] {
  const results: StepResult[] = [];
  const requests = Array.from({ length: RING }, parseRequest);

  log("step 1: body parse");
  results.push({
    step: "1. body parse (UTF-8 decode + parseJsonText)",
    ...perIteration(() => {
      const parsed = parseJsonText(utf8.decode(BODY_BYTES));
      return "problem" in parsed ? -1 : parsed.members.size;
    }),
    setups: "all",
  });

  log("step 2: validation");
  const validate = compileBoundedSchema(DecisionRequest, boundDecisionRequest);
  if (!validate(requests[0]!.body)) throw new Error(`realistic request invalid: ${JSON.stringify(validate.errors)}`);
  results.push({
    step: "2. validation (compileBoundedSchema(DecisionRequest, boundDecisionRequest))",
    ...perIteration((i) => (validate(requests[i % RING]!.body) ? 1 : 0)),
    setups: "all",
  });

  log("step 3: API key check");
  const key = generateApiKey();
  const header = `Bearer ${key.raw}`;
  const record = { revokedAtMs: null, expiresAtMs: null, retiresAtMs: null, replacedBy: null };
  results.push({
    step: "3. API key check (Bearer + keyIdOf + apiKeyMatches + keyRefusal)",
    ...perIteration(() => {
      const raw = BEARER.exec(header)?.[1];
      if (!raw) return -1;
      const id = keyIdOf(raw);
      if (id === null || !apiKeyMatches(raw, key.hash)) return -1;
      return keyRefusal(record, Date.now()) === null ? id.length : -1;
    }),
    setups: "all",
  });

  log("step 5: model request body");
  results.push({
    step: "5. model request body (adapter's JSON text → Buffer)",
    ...perIteration((i) => {
      const r = requests[i % RING]!;
      return decideRequestBody({ model: MODEL, state: r.body.state, questions: r.body.questions, text: r.text }).length;
    }),
    setups: "all",
  });

  log("step 6: model answer");
  const questionsOf = (i: number) => requests[i % RING]!.body.questions as Record<string, Question>;
  const answerOnce = (i: number): number => {
    const parsed = parseJsonBody(modelAnswer);
    if (!parsed.ok) return -1;
    const envelope = parseDecideEnvelope(parsed.value);
    if (!envelope.ok) return -1;
    const checked = checkAnswers(questionsOf(i), envelope.value.answers);
    return checked.ok ? envelope.value.usage.input_tokens : -1;
  };
  if (answerOnce(0) < 0) throw new Error("the precomputed model's answer is not accepted");
  results.push({
    step: "6. model answer (parseJsonBody + parseDecideEnvelope + checkAnswers)",
    ...perIteration(answerOnce),
    setups: "all",
  });

  log("step 7: response");
  const envelope = parseDecideEnvelope((parseJsonBody(modelAnswer) as { ok: true; value: unknown }).value);
  if (!envelope.ok) throw new Error("the precomputed model's answer is not accepted");
  const answerSets = requests.map((r) => {
    const checked = checkAnswers(r.body.questions as Record<string, Question>, envelope.value.answers);
    if (!checked.ok) throw new Error(checked.problem);
    return checked.answers;
  });
  const usage = envelope.value.usage;
  const price = { inputPerMillion: parseUsd("0.5")!, outputPerMillion: 0n };
  const chargings: Record<Mode, Charging> = {
    preview: { mode: "preview" },
    paid: {
      mode: "paid",
      price,
      priceInputUsd: "0.5",
      reservation: { amount: RESERVATION_MICROUSD, tokens: { input: 32_000, output: 768 } },
      keyBudget: null,
    },
  };
  const requestIds = Array.from({ length: RING }, () => newRequestId());
  for (const mode of ["preview", "paid"] as const) {
    const charging = chargings[mode];
    results.push({
      step: `7. response (chargeOf + DecisionResponse + JSON.stringify), ${mode}`,
      ...perIteration((i) => {
        const charge = chargeOf(charging, usage.input_tokens, usage.output_tokens);
        const response: DecisionResponse = {
          model: MODEL,
          request_id: requestIds[i % RING]!,
          service_mode: charging.mode,
          answers: answerSets[i % RING]!,
          usage: charge.usage,
          latency_ms: round3(1.2345 + (i & 7) * 0.001),
          gateway_latency_ms: round3(0.6789 + (i & 3) * 0.001),
        };
        return JSON.stringify(response).length;
      }),
      setups: mode === "preview" ? ["sqlite-preview", "pg-preview"] : ["sqlite-paid", "pg-paid"],
    });
  }
  return results;
}

// ── step 4: the books ────────────────────────────────────────────────────────────────────────

/** Transactions found the database busy (SQLite: its checkpoint thread held the lock) and committed again. */
let busyRetries = 0;

/**
 * store.commitBatch, committed again after a pause (2 ms, doubling up to 50 ms) while the store reads its failure as
 * "retryable", as the gateway's group committer does (src/store/group-commit.ts).
 */
async function commitBatch(store: Store, batch: Parameters<Store["commitBatch"]>[0]): ReturnType<Store["commitBatch"]> {
  for (let pause = 2; ; pause = Math.min(pause * 2, 50)) {
    try {
      return await store.commitBatch(batch);
    } catch (err) {
      if (store.classifyFailure(err) !== "retryable") throw err;
      busyRetries++;
    }
    await sleep(pause);
  }
}

/**
 * `batches` steady-state batches of BATCH requests on `store` (each admits BATCH new requests with production request
 * ids and completes the batch before's), after one batch that only admits; the last batch's admissions stay pending
 * for the next call. Checks every result.
 */
async function steadyBatches(
  store: Store,
  mode: Mode,
  who: { orgId: string; keyId: string },
  batches: number,
  pending: { admissions: ReturnType<typeof benchAdmission>[] },
): Promise<void> {
  const admitSome = () => Array.from({ length: BATCH }, () => benchAdmission(mode, who.orgId, who.keyId, Date.now(), false, newRequestId));
  if (pending.admissions.length === 0) {
    pending.admissions = admitSome();
    await commitBatch(store, { admissions: pending.admissions, completions: [] });
  }
  for (let i = 0; i < batches; i++) {
    const admissions = admitSome();
    const result = await commitBatch(store, { admissions, completions: pending.admissions.map((a) => benchCompletion(a, Date.now())) });
    if (result.admissions.some((r) => r.kind !== "admitted") || result.completions.some((r) => r.kind !== "completed")) {
      throw new Error(`unexpected results: ${JSON.stringify(result).slice(0, 300)}`);
    }
    sink += result.admissions.length;
    pending.admissions = admissions;
  }
}

/** This process's CPU µs per request (one admission + one completion). */
interface BookCost extends Measured {
  /** PostgreSQL's CPU µs per request: its backends of the database, and its shared processes (PostgreSQL only). */
  pgBackendUs?: number;
  pgSharedUs?: number;
}

/** Warm-up of BOOK_REQUESTS, then ROUNDS rounds of BOOK_REQUESTS in steady state; medians. */
async function bookCost(store: Store, mode: Mode, database?: string): Promise<BookCost> {
  const who = await provisionBenchOrg(store, mode === "paid" ? GRANT : 0);
  const batches = BOOK_REQUESTS / BATCH;
  const pending = { admissions: [] as ReturnType<typeof benchAdmission>[] };
  await steadyBatches(store, mode, who, batches, pending);
  const us: number[] = [];
  const backend: number[] = [];
  const shared: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const pg0 = database ? readPostgresCpu(database) : null;
    const t0 = process.cpuUsage();
    await steadyBatches(store, mode, who, batches, pending);
    us.push(cpuUs(t0) / BOOK_REQUESTS);
    if (pg0) {
      const pg = postgresCpuSince(pg0, readPostgresCpu(database!));
      backend.push(pg.backendsNs / 1000 / BOOK_REQUESTS);
      shared.push(pg.backgroundNs / 1000 / BOOK_REQUESTS);
    }
  }
  return database ? { ...measuredOf(us), pgBackendUs: median(backend), pgSharedUs: median(shared) } : measuredOf(us);
}

async function bookSteps(notes: string[]): Promise<Map<SetupId, BookCost>> {
  const costs = new Map<SetupId, BookCost>();
  const dir = mkdtempSync(join(tmpdir(), "tds-essential-floor-"));
  try {
    for (const mode of ["preview", "paid"] as const) {
      log(`step 4: books, SQLite ${mode}`);
      const store = await openStore(`sqlite:${join(dir, `${mode}.sqlite`)}`, { sqlite: SERVING_SQLITE });
      try {
        costs.set(`sqlite-${mode}`, await bookCost(store, mode));
      } finally {
        await store.close();
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  let db: Awaited<ReturnType<typeof createTestDatabase>>;
  try {
    db = await createTestDatabase("tds_bench_floor");
  } catch (err) {
    notes.push(`PostgreSQL setups skipped: ${(err as Error).message}`);
    return costs;
  }
  try {
    // History first (BOOK_REQUESTS requests of each mode), then the store opened as a serving gateway opens it
    // (keepStatisticsFresh: its first refresh analyzes the tables, and its bookkeeping connections use generic plans).
    // Generic plans made on tables never analyzed scan them whole: their cost would grow with every round.
    log("step 4: books, PostgreSQL history");
    const seed = await openStore(db.url);
    try {
      for (const mode of ["preview", "paid"] as const) {
        const who = await provisionBenchOrg(seed, mode === "paid" ? GRANT : 0);
        await steadyBatches(seed, mode, who, BOOK_REQUESTS / BATCH, { admissions: [] });
      }
    } finally {
      await seed.close();
    }
    const store = await openStore(db.url, { postgres: { keepStatisticsFresh: true } });
    try {
      for (const mode of ["preview", "paid"] as const) {
        log(`step 4: books, PostgreSQL ${mode}`);
        costs.set(`pg-${mode}`, await bookCost(store, mode, db.name));
      }
    } finally {
      await store.close();
    }
  } finally {
    await db.drop();
  }
  return costs;
}

// ── the proxy ────────────────────────────────────────────────────────────────────────────────

async function proxyCost(proxy: Started): Promise<Measured & { rps: number }> {
  const pid = proxy.child.pid!;
  const target = { url: proxy.url };
  log(`proxy: ${PROXY_WARMUP_SECONDS} s warm-up`);
  await saturate(target, BODY_TEXT, { connections: PROXY_CONNECTIONS, seconds: PROXY_WARMUP_SECONDS });
  const us: number[] = [];
  const rps: number[] = [];
  for (let s = 1; s <= PROXY_SLICES; s++) {
    log(`proxy: slice ${s} of ${PROXY_SLICES}, ${PROXY_SLICE_SECONDS} s at ${PROXY_CONNECTIONS} connections`);
    const cpu0 = readCpu(pid);
    const samples = await saturate(target, BODY_TEXT, { connections: PROXY_CONNECTIONS, seconds: PROXY_SLICE_SECONDS });
    await sleep(20); // work after the last response belongs to the slice (as bench/gateway.ts)
    const cpu = cpuSince(cpu0, readCpu(pid));
    if (samples.failures > 0) throw new Error(`proxy: ${samples.failures} failures`);
    us.push(cpu.ns / 1000 / samples.requests);
    rps.push(samples.requests / samples.seconds);
  }
  return { ...measuredOf(us), rps: median(rps) };
}

// ── main ─────────────────────────────────────────────────────────────────────────────────────

const notes: string[] = [];
const children: Started[] = [];
let proxy: Measured & { rps: number };
let modelAnswer: Buffer;
try {
  const model = await startPrecomputedModel();
  children.push(model);
  const proxyProcess = await startPassthroughProxy(model.url);
  children.push(proxyProcess);
  const res = await fetch(`${model.url}/v1/systemone`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: BODY_TEXT,
  });
  if (res.status !== 200) throw new Error(`precomputed model answered ${res.status}`);
  modelAnswer = Buffer.from(await res.arrayBuffer());
  proxy = await proxyCost(proxyProcess);
} finally {
  for (const c of children.reverse()) await c.stop();
}

const steps = pureSteps(modelAnswer);
const books = await bookSteps(notes);
for (const setup of SETUPS) {
  const cost = books.get(setup.id);
  if (cost) steps.push({ step: `4. books (commitBatch, batches of ${BATCH}), ${setup.name}`, ...cost, setups: [setup.id] });
}
steps.sort((a, b) => a.step.localeCompare(b.step, "en", { numeric: true }));

const forSetup = (s: StepResult, id: SetupId) => s.setups === "all" || s.setups.includes(id);
const setupNames = (s: StepResult) => (s.setups === "all" ? "all" : s.setups.map((id) => SETUPS.find((x) => x.id === id)!.name).join(", "));

const out: string[] = [];
out.push(
  `${cpus().length} cores (${cpus()[0]?.model ?? "?"}), Node ${process.version}; realistic request ${BODY_BYTES.length} bytes, ` +
    `model answer ${modelAnswer.length} bytes; N = ${N} (books: ${BOOK_REQUESTS} requests), ${ROUNDS} rounds, median`,
);
out.push("");
out.push("Essential steps, each alone in this process (process.cpuUsage(), user + system, all threads):");
out.push("");
out.push("| step | CPU µs per request (median) | rounds min–max | setups |");
out.push("| --- | ---: | ---: | --- |");
for (const s of steps) out.push(`| ${s.step} | ${f1(s.us)} | ${range(s)} | ${setupNames(s)} |`);
out.push("");
out.push(
  `Pass-through proxy (bench/passthrough-proxy.ts, ${PROXY_CONNECTIONS} connections, ${PROXY_SLICES} slices of ${PROXY_SLICE_SECONDS} s, ` +
    `its process's CPU from /proc, all threads): ${f1(proxy.us)} µs per request (median; slices ${range(proxy)}) at ${proxy.rps.toFixed(0)} req/s.`,
);
const pgRows = SETUPS.filter((s) => books.get(s.id)?.pgBackendUs !== undefined);
if (pgRows.length > 0) {
  out.push("");
  out.push("PostgreSQL's own CPU for the books (information only; not in the ratios, which count the gateway process):");
  out.push("");
  out.push("| setup | backend µs per request | shared processes µs per request |");
  out.push("| --- | ---: | ---: |");
  for (const s of pgRows) out.push(`| ${s.name} | ${f1(books.get(s.id)!.pgBackendUs!)} | ${f1(books.get(s.id)!.pgSharedUs!)} |`);
}
out.push("");
out.push("Floor ratio = (proxy + sum of the essential steps) ÷ proxy:");
out.push("");
out.push(
  "| setup | proxy µs | steps sum µs | floor ratio | floor ratio, each step's lowest round | target ratio | floor below target? | headroom µs for everything else |",
);
out.push("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |");
for (const setup of SETUPS) {
  if (!books.has(setup.id)) {
    out.push(`| ${setup.name} | ${f1(proxy.us)} | – | – | – | ${setup.target} | not measured | – |`);
    continue;
  }
  const mine = steps.filter((s) => forSetup(s, setup.id));
  const sum = mine.reduce((a, s) => a + s.us, 0);
  const ratio = (proxy.us + sum) / proxy.us;
  const lowest = (proxy.us + mine.reduce((a, s) => a + s.min, 0)) / proxy.us;
  const headroom = setup.target * proxy.us - proxy.us - sum;
  out.push(
    `| ${setup.name} | ${f1(proxy.us)} | ${f1(sum)} | ${f2(ratio)} | ${f2(lowest)} | ${setup.target} | ${ratio <= setup.target ? "yes" : "NO"} | ${f1(headroom)} |`,
  );
}
out.push("");
out.push(
  "The floor is a lower bound: it leaves out everything else the gateway does (Fastify routing, hooks and reply, the key " +
    "lookup, rate limits, quotas, metrics, logging, promises and timers, the model call's HTTP client, the group committer, " +
    "the GC of all that); nearly so, since the proxy's HTTP client (undici request + stream) costs a few µs more per call " +
    "than the gateway's (dispatch). Headroom = target × proxy − proxy − steps: the CPU per request left for all of it.",
);
if (busyRetries > 0)
  out.push(`\nBooks: ${busyRetries} transaction(s) found the database busy and were committed again (counted in the CPU).`);
for (const n of notes) out.push(`\n${n}`);
out.push(`\n(checksum of the steps' results, so that none is optimized away: ${sink})`);
console.log(out.join("\n"));
