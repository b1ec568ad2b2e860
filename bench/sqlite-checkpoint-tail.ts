/**
 * The SQLite paid/preview tail at a paced rate, without HTTP: a serving store (SERVING_SQLITE) behind the group
 * commit, each request an admission then (after a simulated model call) a completion, evenly paced at `--rate`
 * req/s for `--seconds`. Prints request latency p50/p99/max (from the request's due time, so a stalled event loop
 * counts), commits that met a busy database, the WAL restarts seen (the -wal header's checkpoint sequence), the
 * -wal file's size, and how long the event loop was blocked (monitorEventLoopDelay).
 *
 *   npx tsx bench/sqlite-checkpoint-tail.ts [--rate 300] [--seconds 10] [--mode paid|preview] [--model-ms 0.5]
 */
import { randomBytes, randomUUID } from "node:crypto";
import { closeSync, mkdtempSync, openSync, readSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { GroupCommit } from "../src/store/group-commit.ts";
import { openSqliteStore, SERVING_SQLITE } from "../src/store/sqlite/sqlite-store.ts";
import { benchAdmission, benchCompletion } from "./book-steps.ts";

const { values } = parseArgs({
  options: {
    rate: { type: "string", default: "300" },
    seconds: { type: "string", default: "10" },
    mode: { type: "string", default: "paid" },
    "model-ms": { type: "string", default: "0.5" },
    warmup: { type: "string", default: "3" },
  },
});
const RATE = Number(values.rate);
const SECONDS = Number(values.seconds);
const MODE = values.mode as "paid" | "preview";
const MODEL_MS = Number(values["model-ms"]);
const WARMUP = Number(values.warmup);

function walRestarts(file: string): number {
  const header = Buffer.alloc(32);
  try {
    const fd = openSync(`${file}-wal`, "r");
    try {
      return readSync(fd, header, 0, 32, 0) === 32 ? header.readUInt32BE(12) : 0;
    } finally {
      closeSync(fd);
    }
  } catch {
    return 0;
  }
}

const pct = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? Number.NaN;

const dir = mkdtempSync(join(tmpdir(), "tds-ckpt-tail-"));
const file = join(dir, "tds.sqlite");
const errors: string[] = [];
const store = openSqliteStore(file, { ...SERVING_SQLITE, onCheckpointError: (m) => errors.push(m) });
let busyCommits = 0;
let commits = 0;
const commitMs: number[] = [];
const group = new GroupCommit(store, {
  onCommit: (_steps, seconds, ok) => {
    commits++;
    if (!ok) busyCommits++;
    commitMs.push(seconds * 1000);
  },
});
const orgId = `org_${randomUUID().replace(/-/g, "")}`;
await store.createOrganization({ id: orgId, name: "bench", nowMs: Date.now() });
const keyId = `key_${randomUUID().replace(/-/g, "")}`;
await store.createApiKey({ id: keyId, orgId, name: "bench", hash: randomBytes(32).toString("hex"), nowMs: Date.now() });
if (MODE === "paid") await store.grantCredits({ orgId, amountMicrousd: 1e15, nowMs: Date.now() });

async function one(due: number, times: number[]): Promise<void> {
  const a = benchAdmission(MODE, orgId, keyId, Date.now());
  const r = await group.admit(a);
  if (r.kind !== "admitted") throw new Error(JSON.stringify(r));
  if (MODEL_MS > 0) await sleep(MODEL_MS);
  const c = await group.complete(benchCompletion(a, Date.now()));
  if (c.kind !== "completed") throw new Error(JSON.stringify(c));
  times.push(performance.now() - due);
}

async function paced(seconds: number): Promise<number[]> {
  const times: number[] = [];
  const total = Math.round(RATE * seconds);
  const inFlight: Promise<void>[] = [];
  const start = performance.now();
  for (let i = 0; i < total; i++) {
    const due = start + (i * 1000) / RATE;
    const wait = due - performance.now();
    if (wait > 0.5) await sleep(wait);
    inFlight.push(one(due, times));
  }
  await Promise.all(inFlight);
  return times;
}

await paced(WARMUP);
const [restarts0, busy0, commits0] = [walRestarts(file), busyCommits, commits];
commitMs.length = 0;
const loop = monitorEventLoopDelay({ resolution: 1 });
loop.enable();
const times = (await paced(SECONDS)).sort((x, y) => x - y);
loop.disable();
const sortedCommits = commitMs.sort((x, y) => x - y);
console.log(
  [
    `${MODE} ${RATE} req/s ${SECONDS} s: p50 ${pct(times, 50).toFixed(2)} p99 ${pct(times, 99).toFixed(2)} p99.9 ${pct(times, 99.9).toFixed(2)} max ${times.at(-1)!.toFixed(2)} ms`,
    `commits ${commits - commits0}, busy ${busyCommits - busy0}; commit ms p50 ${pct(sortedCommits, 50).toFixed(3)} p99 ${pct(sortedCommits, 99).toFixed(3)} max ${sortedCommits.at(-1)!.toFixed(2)}`,
    `WAL restarts ${walRestarts(file) - restarts0}; -wal ${(statSync(`${file}-wal`).size / 1048576).toFixed(1)} MiB`,
    `event-loop delay p99 ${(loop.percentile(99) / 1e6).toFixed(2)} max ${(loop.max / 1e6).toFixed(2)} ms`,
    `over 2 ms: ${times.filter((t) => t > 2).length}, over 5 ms: ${times.filter((t) => t > 5).length} of ${times.length}`,
    errors.length ? `checkpoint errors: ${errors.join("; ")}` : "",
  ]
    .filter(Boolean)
    .join("\n"),
);
await store.close();
rmSync(dir, { recursive: true, force: true });
