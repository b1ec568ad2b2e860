/**
 * What PostgreSQL's CPU per preview request would be if completing a usage record were a HOT update (heap-only: no
 * new index entries). Today it cannot be: the completion changes `outcome`, which `usage_records_by_org_outcome_time`
 * holds and the partial index `usage_records_in_flight` filters on. The bench measures the store's steps on two
 * scratch databases, one as migrated and one without those two indexes and with `usage_records` at fillfactor 70 (room
 * on each page for the new row version), in turns: `store.commitBatch` in steady batches (each admits B requests and
 * completes the B of the batch before, as bench/store-costs.ts does), one connection, after 3,200 requests of history
 * and VACUUM (ANALYZE). Prints per round PostgreSQL's CPU per request (its backends of the database and its shared
 * processes, from /proc) and the share of the record updates that were HOT (pg_stat_user_tables), then medians.
 * Without those indexes the usage listing by outcome and the sweep would read more: this measures the gain only.
 *
 *   npx tsx bench/usage-hot-updates.ts [--rounds 3] [--requests 3000] [--mode preview|paid]
 */
import { parseArgs } from "node:util";
import pg from "pg";
import { openStore } from "../src/store/open-store.ts";
import type { Store } from "../src/store/store.ts";
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
  store: Store;
  who: Who;
}

async function variant(name: string, changes: string[]): Promise<Variant> {
  const db = await createTestDatabase("tds_bench_hot");
  const monitor = new pg.Client({ connectionString: db.url });
  await monitor.connect();
  const store = await openStore(`${db.url}?pool_size=1`);
  for (const sql of changes) await monitor.query(sql);
  const who = await provisionBenchOrg(store, MODE === "paid" ? 1_000_000_000_000 : 0);
  await steadyBatches(store, MODE, who, 32, 100, (run) => run());
  await monitor.query("VACUUM (ANALYZE)");
  return { name, db, monitor, store, who };
}

const updates = async (v: Variant) => {
  await v.monitor.query("SELECT pg_stat_force_next_flush()");
  const row = (
    await v.monitor.query<{ hot: string; all: string }>(
      "SELECT n_tup_hot_upd AS hot, n_tup_upd AS all FROM pg_stat_user_tables WHERE relname = 'usage_records'",
    )
  ).rows[0]!;
  return { hot: Number(row.hot), all: Number(row.all) };
};

async function main(): Promise<void> {
  const variants = [
    await variant("as migrated", []),
    await variant("no outcome indexes, fillfactor 70", [
      "DROP INDEX usage_records_in_flight",
      "DROP INDEX usage_records_by_org_outcome_time",
      "ALTER TABLE usage_records SET (fillfactor = 70)",
    ]),
  ];
  try {
    const cpu = new Map<string, number[]>();
    console.log(
      `${MODE} requests, store.commitBatch on one connection; PostgreSQL CPU µs per request (two steps), HOT share of the record updates`,
    );
    for (let round = 1; round <= ROUNDS; round++) {
      for (const size of BATCH_SIZES) {
        for (const v of round % 2 ? variants : [...variants].reverse()) {
          const batches = Math.ceil(REQUESTS / size);
          const before = await updates(v);
          const cpu0 = readPostgresCpu(v.db.name);
          await steadyBatches(v.store, MODE, v.who, size, batches, (run) => run());
          const spent = postgresCpuSince(cpu0, readPostgresCpu(v.db.name));
          const after = await updates(v);
          const perRequest = (spent.backendsNs + spent.backgroundNs) / 1000 / (batches * size);
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
      await v.store.close();
      await v.monitor.end();
      await v.db.drop();
    }
  }
}

await main();
