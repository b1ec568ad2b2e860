/**
 * What PostgreSQL's latency targets (added p50 ≤ 1 ms and added p99 ≤ 3 ms at 300 req/s evenly paced) leave on this
 * machine. A request of the gateway on PostgreSQL waits for two durable transactions in series: its admission,
 * committed before the model is called, and its completion, committed before it is answered. This bench paces
 * "requests" that do only that, without HTTP or a model, from one process, against one scratch database, on
 * connections set up as the store's bookkeeping ones (pipelined, jit off, generic plans of prepared statements):
 *
 *   round trips   two `SELECT 1` in series: the round trips alone, nothing written
 *   durable pair  two one-row transactions in series, each one round trip (BEGIN, INSERT, COMMIT pipelined, then
 *                 BEGIN, UPDATE of the same row, COMMIT; a table with only its primary key): the least two durable
 *                 steps can cost
 *   preview rows  the rows a preview request changes in the gateway's own tables, by the simplest statements, one
 *                 round trip per transaction and no read before the write: its usage record inserted in flight (a
 *                 copy, under a new id and time, of one the store wrote, found by its key), its organization's and
 *                 the service's preview counters, its day's usage row; then the record completed, and the day's row
 *   books preview / books paid
 *                 the gateway's own two steps (`GroupCommit.admit`, then `.complete`) on the PostgreSQL store opened as
 *                 a serving gateway opens it, one organization, as bench/gateway.ts's setups (e) and (f) submit them
 *                 (a request's completion right after its admission; it prints the steps per transaction)
 *
 * Whatever a gateway adds over a pass-through proxy includes its two durable steps, so the durable pair's p50 and p99
 * are a floor of the added p50 and p99; the preview rows' and the books' show what the rows and the store's way of
 * writing them add to it. Each run takes the setups in turns: a warm-up of `--warm-seconds`, then `--seconds` at
 * `--rate`; latency from each request's start to its end; PostgreSQL's CPU per request at that rate (the database's
 * backends and the server's shared processes, from /proc). Prints per-run figures and the medians over runs; asserts
 * nothing. Targets only the test server (TDS_TEST_POSTGRES_URL) and drops its database. About 1 minute per run.
 *
 *   npx tsx bench/pg-latency-floor.ts [--runs 3] [--seconds 10] [--warm-seconds 2] [--rate 300]
 */
import { parseArgs } from "node:util";
import type pg from "pg";
import { utcDay } from "../src/domain/utc-day.ts";
import { GroupCommit } from "../src/store/group-commit.ts";
import { GLOBAL_PREVIEW_SCOPE } from "../src/store/input-checks.ts";
import { openStore } from "../src/store/open-store.ts";
import { connectionSettings, openPool, pipelinedTransaction } from "../src/store/postgres/postgres-connection.ts";
import type { Store } from "../src/store/store.ts";
import { dayStartOf } from "../src/store/usage-daily-rows.ts";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import { benchAdmission, benchCompletion, provisionBenchOrg, randomRequestId } from "./book-steps.ts";
import { evenly, median, percentile } from "./load.ts";
import { postgresCpuSince, readPostgresCpu } from "./proc-cpu.ts";

const { values: args } = parseArgs({
  options: {
    runs: { type: "string", default: "3" },
    seconds: { type: "string", default: "10" },
    "warm-seconds": { type: "string", default: "2" },
    rate: { type: "string", default: "300" },
  },
});
const RUNS = Number(args.runs);
const SECONDS = Number(args.seconds);
const WARM_SECONDS = Number(args["warm-seconds"]);
const RATE = Number(args.rate);

type Request = () => Promise<void>;

/** `one` started `rate` times a second for `seconds`, evenly (open loop); each request's duration in ms. */
async function pace(one: Request, seconds: number, rate: number): Promise<{ times: number[]; failures: number }> {
  const times: number[] = [];
  let failures = 0;
  await evenly(
    async () => {
      const t0 = performance.now();
      try {
        await one();
        times.push(performance.now() - t0);
      } catch (err) {
        if (failures++ === 0) console.log(`first failure: ${String(err)}`);
      }
    },
    { seconds, rate },
  );
  return { times, failures };
}

interface Setup {
  name: string;
  one: Request;
}

interface Figures {
  p50: number;
  p99: number;
  p999: number;
  pgCpuUs: number;
  failures: number;
}

/** Statements sent as the store sends its own: prepared once per connection, BEGIN and COMMIT pipelined with them. */
const inTransaction = (pool: pg.Pool, statements: pg.QueryConfig[]) =>
  pipelinedTransaction(pool, async (p) => {
    for (const statement of statements) p.send(statement);
  });

/**
 * The preview rows setup: each request copies `template` (a preview usage record in flight that the store wrote) under
 * a new request id and time, adds to the organization's and the service's preview counters of the day and to the day's
 * usage row, then completes the record and the day's row. Prepared statements, one round trip per transaction.
 */
async function previewRows(pool: pg.Pool, template: string, orgId: string): Promise<Request> {
  const columns = (
    await pool.query<{ column_name: string }>(
      "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'usage_records' ORDER BY ordinal_position",
    )
  ).rows.map((r) => r.column_name);
  const fresh: Record<string, string> = { request_id: "$1", created_at_ms: "$2" };
  const copy =
    `INSERT INTO usage_records (${columns.join(", ")}) ` +
    `SELECT ${columns.map((c) => fresh[c] ?? c).join(", ")} FROM usage_records WHERE request_id = $3`;
  const counter = "UPDATE preview_counters SET count = count + 1 WHERE scope = $1 AND day = $2";
  return async () => {
    const id = randomRequestId();
    const nowMs = Date.now();
    const dayStart = dayStartOf(nowMs);
    await inTransaction(pool, [
      { name: "floor_copy", text: copy, values: [id, nowMs, template] },
      // One row at a time, the organization's first: every transaction locks them in the same order.
      { name: "floor_counter", text: counter, values: [orgId, utcDay(nowMs)] },
      { name: "floor_counter", text: counter, values: [GLOBAL_PREVIEW_SCOPE, utcDay(nowMs)] },
      {
        name: "floor_day",
        text:
          "INSERT INTO usage_daily VALUES ($1, $2, 1, 1, 0, 0, 0, 0, 0) ON CONFLICT (day_start_ms, org_id) " +
          "DO UPDATE SET requests = usage_daily.requests + 1, in_flight = usage_daily.in_flight + 1",
        values: [orgId, dayStart],
      },
    ]);
    await inTransaction(pool, [
      {
        name: "floor_complete",
        text:
          "UPDATE usage_records SET outcome = 'succeeded', http_status = 200, input_tokens = 681, output_tokens = 9, latency_ms = 1.5, " +
          "completed_at_ms = created_at_ms + 2, gateway_latency_ms = 0.8, deployment = 'bench', attempts = 1 WHERE request_id = $1",
        values: [id],
      },
      {
        name: "floor_day_complete",
        text:
          "UPDATE usage_daily SET in_flight = in_flight - 1, succeeded = succeeded + 1, input_tokens = input_tokens + 681, " +
          "output_tokens = output_tokens + 9 WHERE day_start_ms = $1 AND org_id = $2",
        values: [dayStart, orgId],
      },
    ]);
  };
}

async function main(): Promise<void> {
  const db = await createTestDatabase("tds_bench_floor");
  let store: Store | undefined;
  // Connections as the store's bookkeeping ones: pipelined, jit off, generic plans of prepared statements.
  const pool = openPool(connectionSettings(db.url), 8, { bookkeeping: { genericPlans: true } });
  try {
    store = await openStore(db.url);
    await pool.query(
      'CREATE TABLE floor_records (request_id text COLLATE "C" PRIMARY KEY, org_id text NOT NULL, created_at_ms bigint NOT NULL, outcome text NOT NULL)',
    );
    const settings = (
      await pool.query<{ name: string; setting: string }>(
        "SELECT name, setting FROM pg_settings WHERE name IN ('synchronous_commit', 'fsync', 'wal_sync_method', 'server_version', 'autovacuum') ORDER BY name",
      )
    ).rows;
    const preview = await provisionBenchOrg(store, 0);
    const paid = await provisionBenchOrg(store, 1_000_000_000_000);
    let commits: { steps: number; ms: number }[] = [];
    let books = new GroupCommit(store);
    const booksOf =
      (mode: "preview" | "paid", who: { orgId: string; keyId: string }): Request =>
      async () => {
        const admission = benchAdmission(mode, who.orgId, who.keyId, Date.now());
        const admitted = await books.admit(admission);
        if (admitted.kind !== "admitted") throw new Error(`not admitted: ${admitted.kind}`);
        const completed = await books.complete(benchCompletion(admission, Date.now()));
        if (completed.kind !== "completed") throw new Error(`not completed: ${completed.kind}`);
      };
    // History first, then the store opened as a serving gateway opens it (keepStatisticsFresh: its first refresh
    // analyzes the tables, and its bookkeeping connections use generic plans, which on tables never analyzed scan them
    // whole). One preview record is left in flight: the preview rows setup copies it.
    for (const seed of [booksOf("preview", preview), booksOf("paid", paid)]) await pace(seed, 5, RATE);
    const template = benchAdmission("preview", preview.orgId, preview.keyId, Date.now());
    await store.commitBatch({ admissions: [template], completions: [] });
    const seeded = store;
    store = undefined;
    await seeded.close();
    store = await openStore(db.url, { postgres: { keepStatisticsFresh: true, onStatisticsProblem: (m) => console.log(m) } });
    books = new GroupCommit(store, { onCommit: (steps, seconds) => void commits.push({ steps, ms: seconds * 1000 }) });
    const setups: Setup[] = [
      {
        name: "round trips",
        one: async () => {
          await pool.query("SELECT 1");
          await pool.query("SELECT 1");
        },
      },
      {
        name: "durable pair",
        one: async () => {
          const id = randomRequestId();
          const insert = "INSERT INTO floor_records VALUES ($1, 'org', $2, 'in_flight')";
          await inTransaction(pool, [{ name: "floor_insert", text: insert, values: [id, Date.now()] }]);
          const update = "UPDATE floor_records SET outcome = 'succeeded' WHERE request_id = $1";
          await inTransaction(pool, [{ name: "floor_update", text: update, values: [id] }]);
        },
      },
      { name: "preview rows", one: await previewRows(pool, template.requestId, preview.orgId) },
      { name: "books preview", one: booksOf("preview", preview) },
      { name: "books paid", one: booksOf("paid", paid) },
    ];
    console.log(
      `PostgreSQL (${settings.map((s) => `${s.name}=${s.setting}`).join(", ")}); ${RUNS} runs, each setup ${WARM_SECONDS} s warm-up + ` +
        `${SECONDS} s at ${RATE} req/s evenly paced; ms from each request's start to its end; PostgreSQL CPU µs per request`,
    );
    const results = new Map<string, Figures[]>();
    for (let run = 1; run <= RUNS; run++) {
      for (const setup of setups) {
        await pace(setup.one, WARM_SECONDS, RATE);
        commits = [];
        const cpu0 = readPostgresCpu(db.name);
        const { times, failures } = await pace(setup.one, SECONDS, RATE);
        const cpu = postgresCpuSince(cpu0, readPostgresCpu(db.name));
        const transactions = commits.length
          ? `; ${commits.length} transactions of ${(commits.reduce((n, c) => n + c.steps, 0) / commits.length).toFixed(2)} steps, ` +
            `p50 ${percentile(
              commits.map((c) => c.ms),
              50,
            ).toFixed(2)} ms`
          : "";
        const r: Figures = {
          p50: percentile(times, 50),
          p99: percentile(times, 99),
          p999: percentile(times, 99.9),
          pgCpuUs: (cpu.backendsNs + cpu.backgroundNs) / 1000 / Math.max(1, times.length + failures),
          failures,
        };
        results.set(setup.name, [...(results.get(setup.name) ?? []), r]);
        console.log(
          `run ${run} ${setup.name}: p50 ${r.p50.toFixed(2)}, p99 ${r.p99.toFixed(2)}, p99.9 ${r.p999.toFixed(2)} ms, ` +
            `PostgreSQL ${r.pgCpuUs.toFixed(1)} µs per request${failures ? `, ${failures} failed` : ""}${transactions}`,
        );
      }
    }
    const cell = (xs: number[], digits = 2) => `${median(xs).toFixed(digits)} (${xs.map((x) => x.toFixed(digits)).join(" / ")})`;
    console.log(
      "\n| setup | p50 ms | p99 ms | p99.9 ms | PostgreSQL CPU µs per request | failed (left out of the times) |\n| --- | ---: | ---: | ---: | ---: | ---: |",
    );
    for (const setup of setups) {
      const rs = results.get(setup.name) ?? [];
      console.log(
        `| ${setup.name} | ${cell(rs.map((r) => r.p50))} | ${cell(rs.map((r) => r.p99))} | ${cell(rs.map((r) => r.p999))} | ` +
          `${cell(
            rs.map((r) => r.pgCpuUs),
            1,
          )} | ${rs.reduce((n, r) => n + r.failures, 0)} |`,
      );
    }
  } finally {
    await pool.end();
    await store?.close();
    await db.drop();
  }
}

await main();
