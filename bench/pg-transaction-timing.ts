/**
 * Where a bookkeeping transaction's time goes on PostgreSQL. A scratch database gets realistic table sizes (by default
 * 1M usage records, as many ledger entries, 100k idempotency entries, 100 organizations), copied in SQL from rows the
 * store itself wrote; then steady-state batches of paid requests with an Idempotency-Key (each batch admits B and
 * completes the B of the batch before, as `bench/store-costs.ts` does) run through `store.commitBatch`, with every
 * statement timed from the moment it is sent to its answer, per round trip:
 *
 *   pipelined   the store as it is: [BEGIN, advisory locks, combined read] and [combined write, COMMIT]
 *   one by one  each statement sent after the answer to the one before (what the store did before pipelining)
 *
 * each before ANALYZE ever ran (autovacuum off: nothing analyzes) and after, and with the store's session settings (jit
 * off; generic plans on the bookkeeping connections) against plan_cache_mode force_custom_plan and auto through the URL's
 * options (which come after the store's). Then `EXPLAIN (ANALYZE, BUFFERS)` of the combined read and write of one
 * batch, before and after ANALYZE.
 *
 *   npx tsx bench/pg-transaction-timing.ts [--records 1000000] [--batches 300] [--batch 8] [--explain-only]
 *
 * Prints numbers, asserts nothing; targets only the test server (TDS_TEST_POSTGRES_URL) and drops its database.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { parseArgs } from "node:util";
import pg from "pg";
import type { AdmitCommand } from "../src/domain/bookkeeping.ts";
import { openPostgresStore, type PostgresStore } from "../src/store/postgres/postgres-store.ts";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import { benchAdmission, benchCompletion } from "./book-steps.ts";

const { values: args } = parseArgs({
  options: {
    records: { type: "string", default: "1000000" },
    batches: { type: "string", default: "300" },
    batch: { type: "string", default: "8" },
    orgs: { type: "string", default: "100" },
    "explain-only": { type: "boolean", default: false },
  },
});
const RECORDS = Number(args.records);
const BATCHES = Number(args.batches);
const BATCH = Number(args.batch);
const ORGS = Number(args.orgs);
const ROUNDS = 6;

// ── the steps ──

interface Org {
  orgId: string;
  keyId: string;
}

async function provision(store: PostgresStore): Promise<Org[]> {
  const orgs: Org[] = [];
  for (let i = 0; i < ORGS; i++) {
    const nowMs = Date.now();
    const org = await store.createOrganization({ id: `org_${randomUUID().replace(/-/g, "")}`, name: `bench-${i}`, nowMs });
    const keyId = `key_${randomUUID().replace(/-/g, "")}`;
    await store.createApiKey({ id: keyId, orgId: org.id, name: "bench", hash: randomBytes(32).toString("hex"), nowMs });
    await store.grantCredits({ orgId: org.id, amountMicrousd: 1_000_000_000_000, nowMs });
    orgs.push({ orgId: org.id, keyId });
  }
  return orgs;
}

// ── bulk rows, copied from rows the store wrote ──

/** Copies `template` (one row of `table`) `count` times in SQL, with `vary` giving some columns' expressions of g. */
async function copyRows(c: pg.Client, table: string, template: string, count: number, vary: Record<string, string>): Promise<void> {
  const columns = (
    await c.query<{ column_name: string }>(
      "SELECT column_name FROM information_schema.columns WHERE table_name = $1 AND table_schema = current_schema() " +
        "AND is_generated = 'NEVER' AND is_identity = 'NO' ORDER BY ordinal_position",
      [table],
    )
  ).rows.map((r) => r.column_name);
  const list = columns.join(", ");
  const select = columns.map((col) => vary[col] ?? `t.${col}`).join(", ");
  for (let from = 1; from <= count; from += 200_000) {
    const to = Math.min(count, from + 199_999);
    await c.query(`INSERT INTO ${table} (${list}) SELECT ${select} FROM (${template} LIMIT 1) t, generate_series(${from}, ${to}) g`);
  }
}

async function fill(url: string, orgs: Org[]): Promise<void> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    const orgArray = `(ARRAY[${orgs.map((o) => `'${o.orgId}'`).join(",")}])[1 + g % ${orgs.length}]`;
    const request = "'bulk_' || lpad(g::text, 9, '0')";
    await copyRows(c, "usage_records", "SELECT * FROM usage_records WHERE outcome = 'succeeded'", RECORDS, {
      request_id: request,
      org_id: orgArray,
      created_at_ms: "t.created_at_ms - g * 60",
      completed_at_ms: "t.completed_at_ms - g * 60",
    });
    await copyRows(c, "ledger_entries", "SELECT * FROM ledger_entries WHERE reservation_id IS NOT NULL", RECORDS, {
      org_id: orgArray,
      reservation_id: request,
    });
    await copyRows(c, "idempotency_keys", "SELECT * FROM idempotency_keys", Math.ceil(RECORDS / 10), {
      org_id: orgArray,
      key: "'bulk_' || g",
      request_id: request,
    });
    await c.query("CHECKPOINT");
  } finally {
    await c.end();
  }
}

// ── timing every statement ──

type Label = "BEGIN" | "lock" | "read" | "write" | "COMMIT" | "other";

function labelOf(config: unknown): Label {
  const { text = "", name = "" } = (typeof config === "string" ? { text: config } : config) as { text?: string; name?: string };
  if (text.startsWith("BEGIN")) return "BEGIN";
  if (text === "COMMIT") return "COMMIT";
  if (name === "tds_lockIdempotency") return "lock";
  if (name.startsWith("tds_")) return text.includes("RETURNING 1") ? "write" : "read";
  return "other";
}

interface Timings {
  /** Per transaction: from BEGIN sent to COMMIT answered. */
  transactions: number[];
  /** Per round trip: the statements sent before waiting, and the wait. */
  trips: Map<string, number[]>;
}

/** What the wrapped clients do with each statement. */
interface Instrument {
  timings: Timings | null;
  serial: boolean;
  /** EXPLAIN (ANALYZE, BUFFERS) the next combined read and write, into `plans`. */
  explain: boolean;
  plans: Map<"read" | "write", string>;
}

const newTimings = (): Timings => ({ transactions: [], trips: new Map() });

function push<K>(map: Map<K, number[]>, key: K, value: number): void {
  const list = map.get(key);
  if (list) list.push(value);
  else map.set(key, [value]);
}

/** Wraps each new bookkeeping client's query: times it, or sends it only after the previous answer (serial), or EXPLAINs it. */
function instrument(store: PostgresStore): Instrument {
  const inst: Instrument = { timings: null, serial: false, explain: false, plans: new Map() };
  store.bookkeepingPool.on("connect", (client) => {
    const query = client.query.bind(client) as (config: unknown, ...rest: unknown[]) => Promise<pg.QueryResult> | undefined;
    let chain: Promise<unknown> = Promise.resolve();
    let begunAt = 0;
    let trip: { labels: Label[]; sentAt: number } | null = null;
    let inFlight = 0;
    const send = (config: unknown, rest: unknown[]): Promise<pg.QueryResult> => {
      const label = labelOf(config);
      const sentAt = performance.now();
      if (label === "BEGIN") begunAt = sentAt;
      if (trip === null) trip = { labels: [], sentAt };
      trip.labels.push(label);
      inFlight++;
      const explained =
        inst.explain && (label === "read" || label === "write") && !inst.plans.has(label)
          ? query({ text: `EXPLAIN (ANALYZE, BUFFERS) ${(config as pg.QueryConfig).text}`, values: (config as pg.QueryConfig).values })!
          : null;
      // The read's own answer is needed; a write's is not read, so its EXPLAIN ANALYZE (which runs it) stands for it.
      const answer = label === "write" && explained ? explained : query(config, ...rest)!;
      const done = () => {
        const t = performance.now();
        inFlight--;
        if (inst.timings) {
          if (label === "COMMIT") inst.timings.transactions.push(t - begunAt);
          if (inFlight === 0 && trip) {
            push(inst.timings.trips, trip.labels.join("+"), t - trip.sentAt);
          }
        }
        if (inFlight === 0) trip = null;
      };
      if (explained) {
        explained.then(
          (r) => inst.plans.set(label as "read" | "write", r.rows.map((row) => row["QUERY PLAN"]).join("\n")),
          () => {},
        );
      }
      answer.then(done, done);
      return answer;
    };
    client.query = ((config: unknown, ...rest: unknown[]) => {
      // A call with a callback (pg-pool's own pool.query) is passed on untimed.
      if (typeof rest.at(-1) === "function") return query(config, ...rest);
      if (!inst.serial) return send(config, rest);
      const answer = chain.then(() => send(config, rest));
      chain = answer.catch(() => {});
      return answer;
    }) as typeof client.query;
  });
  return inst;
}

const quantile = (values: number[], q: number) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
};
const ms = (v: number) => (Number.isFinite(v) ? v.toFixed(2) : "–");

/** B admissions for organizations picked at random. */
function admitSome(orgs: Org[]): AdmitCommand[] {
  return Array.from({ length: BATCH }, () => {
    const org = orgs[Math.floor(Math.random() * orgs.length)]!;
    return benchAdmission("paid", org.orgId, org.keyId, Date.now(), true);
  });
}

/** `batches` steady-state batches (each admits B and completes the B before), `during` told before each. */
async function steady(store: PostgresStore, orgs: Org[], batches: number, during: (i: number) => void = () => {}): Promise<void> {
  let pending = admitSome(orgs);
  await store.commitBatch({ admissions: pending, completions: [] });
  for (let i = 0; i < batches; i++) {
    const admissions = admitSome(orgs);
    during(i);
    const result = await store.commitBatch({ admissions, completions: pending.map((a) => benchCompletion(a, Date.now())) });
    if (result.admissions.some((r) => r.kind !== "admitted") || result.completions.some((r) => r.kind !== "completed")) {
      throw new Error(`unexpected results: ${JSON.stringify(result).slice(0, 300)}`);
    }
    pending = admissions;
  }
  during(-1);
  await store.commitBatch({ admissions: [], completions: pending.map((a) => benchCompletion(a, Date.now())) });
}

/** One way of running the transactions: a store (its session settings) and whether statements go one by one. */
interface Setup {
  title: string;
  store: PostgresStore;
  inst: Instrument;
  serial: boolean;
  timings: Timings;
}

/** The setups in turns (ROUNDS rounds of BATCHES / ROUNDS batches each), so that the machine's load falls on all alike. */
async function measure(setups: Setup[], orgs: Org[]): Promise<string[]> {
  const per = Math.ceil(BATCHES / ROUNDS);
  for (const s of setups) {
    s.inst.serial = s.serial;
    await steady(s.store, orgs, 10);
  }
  for (let round = 0; round < ROUNDS; round++) {
    for (const s of setups) {
      s.inst.serial = s.serial;
      s.inst.timings = s.timings;
      await steady(s.store, orgs, per);
      s.inst.timings = null;
    }
  }
  const lines: string[] = [];
  for (const { title, timings: t } of setups) {
    lines.push(`${title}: transaction p50 ${ms(quantile(t.transactions, 0.5))} ms, p99 ${ms(quantile(t.transactions, 0.99))} ms`);
    for (const [trip, values] of t.trips) {
      if (values.length < BATCHES / 2) continue;
      lines.push(`  round trip [${trip}]: p50 ${ms(quantile(values, 0.5))} ms, p99 ${ms(quantile(values, 0.99))} ms (${values.length})`);
    }
  }
  return lines;
}

async function main(): Promise<void> {
  const db = await createTestDatabase("tds_bench_txn");
  const out: string[] = [
    `${RECORDS} usage records, ${RECORDS} ledger entries, ${ORGS} organizations; batches of ${BATCH} paid requests with keys`,
  ];
  try {
    const store = await openPostgresStore(db.url, { poolSize: 2 });
    const inst = instrument(store);
    const orgs = await provision(store);
    await steady(store, orgs, 2);
    const t0 = performance.now();
    await fill(db.url, orgs);
    out.push(`filled in ${((performance.now() - t0) / 1000).toFixed(0)} s`);
    const sessions: { name: string; store: PostgresStore; inst: Instrument }[] = [
      { name: "store's session (jit off, generic plans)", store, inst },
    ];
    for (const [name, options] of [
      ["plan_cache_mode force_custom_plan", "-c plan_cache_mode=force_custom_plan"],
      ["plan_cache_mode auto", "-c plan_cache_mode=auto"],
    ] as const) {
      const other = await openPostgresStore(`${db.url}?options=${encodeURIComponent(options)}`, { poolSize: 2 });
      sessions.push({ name, store: other, inst: instrument(other) });
    }
    const explain = async (when: string) => {
      for (const s of [sessions[0]!, sessions[2]!]) {
        s.inst.plans.clear();
        await steady(s.store, orgs, 1, (i) => {
          s.inst.explain = i === 0;
        });
        for (const [label, plan] of s.inst.plans) out.push(`\n### EXPLAIN ${label}, ${when}, ${s.name}\n${plan}`);
      }
    };
    const time = async (when: string) => {
      if (args["explain-only"]) return;
      const setups: Setup[] = sessions.flatMap((s, i) =>
        (i === 0 ? [false, true] : [false]).map((serial) => ({
          title: `${serial ? "one by one" : "pipelined"}, ${when}, ${s.name}`,
          store: s.store,
          inst: s.inst,
          serial,
          timings: newTimings(),
        })),
      );
      out.push(...(await measure(setups, orgs)));
    };
    await explain("never analyzed");
    await time("never analyzed");
    const a0 = performance.now();
    const c = new pg.Client({ connectionString: db.url });
    await c.connect();
    await c.query("ANALYZE");
    await c.end();
    out.push(`\nANALYZE took ${((performance.now() - a0) / 1000).toFixed(1)} s`);
    await explain("after ANALYZE");
    await time("after ANALYZE");
    for (const s of sessions) await s.store.close();
  } finally {
    await db.drop();
  }
  console.log(out.join("\n"));
}

await main();
