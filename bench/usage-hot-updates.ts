/**
 * What PostgreSQL's CPU per preview request would be if completing a usage record were a HOT update (heap-only: no
 * new index entries). Today it cannot be: the completion changes `outcome`, which `usage_records_by_org_outcome_time`
 * holds and the partial index `usage_records_in_flight` filters on. The bench measures the store's steps on two
 * scratch databases, one as migrated and one without those two indexes and with `usage_records` at fillfactor 70 (room
 * on each page for the new row version), in turns: `store.commitBatch` in steady batches (each admits B requests and
 * completes the B of the batch before, as bench/store-costs.ts does, and leaves the last B in flight), after 3,200
 * requests of history and VACUUM (ANALYZE), on the store opened as a serving gateway opens it (statistics kept fresh,
 * generic plans) with one bookkeeping connection. Prints per round PostgreSQL's CPU per request (its backends of the
 * database and its shared processes, from /proc) and the share of the record updates that were HOT
 * (pg_stat_user_tables), then medians. Dropping the two indexes also saves the two entries the admission's insert
 * wrote into them, and the usage listing by outcome and the sweep would read more without them: this measures the
 * gain only.
 *
 *   npx tsx bench/usage-hot-updates.ts [--rounds 3] [--requests 3000] [--mode preview|paid]
 */
import { parseArgs } from "node:util";
import pg from "pg";
import { openStore } from "../src/store/open-store.ts";
import type { PostgresStore } from "../src/store/postgres/postgres-store.ts";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import { provisionBenchOrg } from "./book-steps.ts";
import { median } from "./load.ts";
import { postgresCpuSince, readPostgresCpu } from "./proc-cpu.ts";
import { steadyBatches } from "./store-costs.ts";

const { values: args } = parseArgs({
  options: {
    rounds: { type: "string", default: "3" },
    requests: { type: "string", default: "3000" },
    mode: { type: "string", default: "preview" },
  },
});
const ROUNDS = Number(args.rounds);
const REQUESTS = Number(args.requests);
const MODE = args.mode === "paid" ? "paid" : "preview";
const BATCH_SIZES = [8, 32];

type Who = { orgId: string; keyId: string };

interface Variant {
  name: string;
  db: { url: string; name: string; drop(): Promise<void> };
  monitor: pg.Client;
  store?: PostgresStore;
  who: Who;
}

/**
 * A scratch database with `changes` applied, 3,200 requests of history, VACUUM (ANALYZE), and the store opened on it as a
 * serving gateway opens it (its statistics kept fresh, so its bookkeeping statements keep generic plans), on one
 * bookkeeping connection. Added to `into` as soon as the database exists, so that it is dropped whatever happens.
 */
async function variant(into: Variant[], name: string, changes: string[]): Promise<void> {
  const db = await createTestDatabase("tds_bench_hot");
  const v: Variant = { name, db, monitor: new pg.Client({ connectionString: db.url }), who: { orgId: "", keyId: "" } };
  into.push(v);
  await v.monitor.connect();
  const seed = await openStore(db.url);
  try {
    for (const sql of changes) await v.monitor.query(sql);
    v.who = await provisionBenchOrg(seed, MODE === "paid" ? 1_000_000_000_000 : 0);
    await steadyBatches(seed, MODE, v.who, 32, 100, (run) => run());
  } finally {
    await seed.close();
  }
  await v.monitor.query("VACUUM (ANALYZE)");
  v.store = (await openStore(`${db.url}?pool_size=1`, { postgres: { keepStatisticsFresh: true } })) as PostgresStore;
}

/**
 * The record updates counted so far, the store's bookkeeping connection's included: a backend publishes its counts
 * when it goes idle, at most once a second unless told to.
 */
async function updates(v: Variant): Promise<{ hot: number; all: number }> {
  await v.store!.bookkeepingPool.query("SELECT pg_stat_force_next_flush()");
  const row = (
    await v.monitor.query<{ hot: string; all: string }>(
      "SELECT n_tup_hot_upd AS hot, n_tup_upd AS all FROM pg_stat_user_tables WHERE relname = 'usage_records'",
    )
  ).rows[0]!;
  return { hot: Number(row.hot), all: Number(row.all) };
}

async function main(): Promise<void> {
  const variants: Variant[] = [];
  try {
    await variant(variants, "as migrated", []);
    await variant(variants, "no outcome indexes, fillfactor 70", [
      "DROP INDEX usage_records_in_flight",
      "DROP INDEX usage_records_by_org_outcome_time",
      "ALTER TABLE usage_records SET (fillfactor = 70)",
    ]);
    const cpu = new Map<string, number[]>();
    console.log(
      `${MODE} requests, store.commitBatch on one bookkeeping connection; PostgreSQL CPU µs per request (two steps), HOT share of the record updates`,
    );
    for (let round = 1; round <= ROUNDS; round++) {
      for (const size of BATCH_SIZES) {
        for (const v of round % 2 ? variants : [...variants].reverse()) {
          const batches = Math.ceil(REQUESTS / size);
          const before = await updates(v);
          let perRequest = Number.NaN;
          await steadyBatches(v.store!, MODE, v.who, size, batches, async (run) => {
            const cpu0 = readPostgresCpu(v.db.name);
            await run();
            const spent = postgresCpuSince(cpu0, readPostgresCpu(v.db.name));
            perRequest = (spent.backendsNs + spent.backgroundNs) / 1000 / (batches * size);
          });
          const after = await updates(v);
          cpu.set(`${v.name}/${size}`, [...(cpu.get(`${v.name}/${size}`) ?? []), perRequest]);
          const hot = after.all > before.all ? (after.hot - before.hot) / (after.all - before.all) : Number.NaN;
          console.log(`round ${round}, batches of ${size}, ${v.name}: ${perRequest.toFixed(1)} µs, ${(hot * 100).toFixed(0)} % HOT`);
        }
      }
    }
    console.log("\n| batch | as migrated µs (rounds) | no outcome indexes µs (rounds) | ratio of medians |\n| ---: | ---: | ---: | ---: |");
    for (const size of BATCH_SIZES) {
      const [a, b] = variants.map((v) => cpu.get(`${v.name}/${size}`) ?? []);
      const cell = (xs: number[]) => `${median(xs).toFixed(1)} (${xs.map((x) => x.toFixed(1)).join(" / ")})`;
      console.log(`| ${size} | ${cell(a!)} | ${cell(b!)} | ${(median(b!) / median(a!)).toFixed(2)} |`);
    }
  } finally {
    for (const v of variants) {
      await v.store?.close();
      await v.monitor.end().catch(() => undefined);
      await v.db.drop();
    }
  }
}

await main();
