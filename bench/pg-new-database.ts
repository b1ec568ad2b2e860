/**
 * A gateway's first seconds on a new PostgreSQL database: what the bookkeeping connections' `enable_seqscan=off`,
 * `enable_hashjoin=off` and `enable_mergejoin=off` save (postgres-connection.ts, sessionOptions). Each gateway starts on
 * a database of its own, created for it, and is loaded from its first request; the other variant turns the three back
 * on for its connections with the URL's `options`, which the store sends after its own.
 *
 *   npx tsx bench/pg-new-database.ts [--seconds 20] [--rounds 2] [--connections 32]
 *
 * For each round, each mode (preview, paid) and each variant in turn: a new database, an organization with a key (and
 * credits), the gateway in front of the precomputed model server, `--seconds` of saturating load at `--connections`
 * (autocannon) from the moment it answers. Around the load it reads the CPU time of the gateway (every thread, /proc)
 * and of the database's backends, and afterwards the Seq Scans of `usage_records` with the rows they read
 * (pg_stat_user_tables). The store analyzes its tables within 10 s of their first 50 rows (postgres-statistics.ts),
 * so what differs is the time before that. Prints every slice and the medians; nothing is asserted.
 */
import { parseArgs } from "node:util";
import pg from "pg";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import { median, saturate } from "./load.ts";
import { cpuSince, postgresCpuSince, readCpu, readPostgresCpu } from "./proc-cpu.ts";
import { OPEN_LIMITS, provisionOrg, realisticRequest, startGateway, startPrecomputedModel } from "./support.ts";

const { values } = parseArgs({
  options: {
    seconds: { type: "string", default: "20" },
    rounds: { type: "string", default: "2" },
    connections: { type: "string", default: "32" },
  },
});
const SECONDS = Number(values.seconds);
const ROUNDS = Number(values.rounds);
const CONNECTIONS = Number(values.connections);
const PAID_GRANT = 1_000_000_000_000;

const VARIANTS = [
  { label: "by index (the store's settings)", options: "" },
  {
    label: "Seq Scans and hash or merge joins allowed (URL options)",
    options: "-c enable_seqscan=on -c enable_hashjoin=on -c enable_mergejoin=on",
  },
] as const;
const MODES = ["preview", "paid"] as const;

interface Slice {
  requests: number;
  failures: number;
  rps: number;
  gatewayUs: number;
  postgresUs: number;
  seqScans: number;
  seqRows: number;
}

async function usageSeqScans(url: string): Promise<{ scans: number; rows: number }> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const row = (
      await client.query<{ scans: string; rows: string }>(
        "SELECT seq_scan AS scans, seq_tup_read AS rows FROM pg_stat_user_tables WHERE relname = 'usage_records'",
      )
    ).rows[0];
    return { scans: Number(row?.scans ?? 0), rows: Number(row?.rows ?? 0) };
  } finally {
    await client.end();
  }
}

/** Waits (at most 10 s) until no other session is connected to the database. */
async function backendsGone(url: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    for (let waited = 0; waited < 10_000; waited += 100) {
      const others = await client.query("SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()");
      if (others.rowCount === 0) return;
      await new Promise((r) => setTimeout(r, 100));
    }
    console.error("(sessions still connected after 10 s: the Seq Scan counts may miss their last second)");
  } finally {
    await client.end();
  }
}

/** The database's URL, with `options` when given. */
function withOptions(url: string, options: string): string {
  if (!options) return url;
  const u = new URL(url);
  u.searchParams.set("options", options);
  return u.toString();
}

async function slice(modelUrl: string, mode: (typeof MODES)[number], options: string): Promise<Slice> {
  const db = await createTestDatabase("tds_bench_new");
  try {
    const key = await provisionOrg(db.url, mode === "paid" ? PAID_GRANT : 0);
    // The store's own statements at start (migrations done by provisionOrg, the first refresh) are not counted.
    const before = await usageSeqScans(db.url);
    const gateway = await startGateway({
      TDS_MODEL_SERVICE_URL: modelUrl,
      ...OPEN_LIMITS,
      TDS_DATABASE_URL: withOptions(db.url, options),
      TDS_SERVICE_MODE: mode,
      // Paid mode warns that the model publishes no context; nothing else is logged at warn.
      LOG_LEVEL: "error",
    });
    let load: Awaited<ReturnType<typeof saturate>>;
    let cpu: ReturnType<typeof cpuSince>;
    let postgres: ReturnType<typeof postgresCpuSince>;
    try {
      const pid = gateway.child.pid!;
      const cpu0 = readCpu(pid);
      const pg0 = readPostgresCpu(db.name);
      load = await saturate({ url: gateway.url, keys: [key] }, JSON.stringify(realisticRequest()), {
        connections: CONNECTIONS,
        seconds: SECONDS,
      });
      cpu = cpuSince(cpu0, readCpu(pid));
      postgres = postgresCpuSince(pg0, readPostgresCpu(db.name));
    } finally {
      await gateway.stop();
    }
    // After the gateway's backends ended: each reports its statistics as it ends.
    await backendsGone(db.url);
    const after = await usageSeqScans(db.url);
    return {
      requests: load.requests,
      failures: load.failures,
      rps: load.requests / load.seconds,
      gatewayUs: cpu.ns / 1000 / load.requests,
      postgresUs: postgres.backendsNs / 1000 / load.requests,
      seqScans: after.scans - before.scans,
      seqRows: after.rows - before.rows,
    };
  } finally {
    await db.drop();
  }
}

const fmt = (n: number, digits = 1) => n.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });

const model = await startPrecomputedModel();
const slices = new Map<string, Slice[]>();
try {
  console.log(`${ROUNDS} round(s); each slice: a new database, ${SECONDS} s saturating at ${CONNECTIONS} connections from the start\n`);
  console.log(
    "| round | mode | variant | requests | req/s | gateway CPU µs/req | PostgreSQL backends CPU µs/req | Seq Scans of usage_records | rows they read |",
  );
  console.log("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
  for (let round = 1; round <= ROUNDS; round++) {
    for (const mode of MODES) {
      // Alternate which variant goes first, so that neither always gets the machine as the other left it.
      const order = round % 2 === 1 ? VARIANTS : [...VARIANTS].reverse();
      for (const variant of order) {
        const s = await slice(model.url, mode, variant.options);
        const id = `${mode}|${variant.label}`;
        slices.set(id, [...(slices.get(id) ?? []), s]);
        console.log(
          `| ${round} | ${mode} | ${variant.label} | ${s.requests}${s.failures ? ` (${s.failures} failed)` : ""} | ${fmt(s.rps, 0)} | ` +
            `${fmt(s.gatewayUs)} | ${fmt(s.postgresUs)} | ${s.seqScans} | ${s.seqRows.toLocaleString("en-US")} |`,
        );
      }
    }
  }
  console.log("\nMedians of the rounds:\n");
  console.log("| mode | variant | req/s | gateway CPU µs/req | PostgreSQL backends CPU µs/req | Seq Scans | rows they read |");
  console.log("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
  for (const mode of MODES) {
    for (const variant of VARIANTS) {
      const xs = slices.get(`${mode}|${variant.label}`) ?? [];
      const m = (f: (s: Slice) => number) => median(xs.map(f));
      const [rps, gatewayUs, postgresUs, scans] = [m((s) => s.rps), m((s) => s.gatewayUs), m((s) => s.postgresUs), m((s) => s.seqScans)];
      const rows = Math.round(m((s) => s.seqRows)).toLocaleString("en-US");
      console.log(`| ${mode} | ${variant.label} | ${fmt(rps, 0)} | ${fmt(gatewayUs)} | ${fmt(postgresUs)} | ${fmt(scans, 0)} | ${rows} |`);
    }
    const [byIndex, seq] = VARIANTS.map((v) => median((slices.get(`${mode}|${v.label}`) ?? []).map((s) => s.postgresUs)));
    console.log(`| ${mode} | by index ÷ allowed, PostgreSQL CPU per request | | | **${fmt(byIndex! / seq!, 2)}** | | |`);
  }
} finally {
  await model.stop();
}
