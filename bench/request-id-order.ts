/**
 * What the order of request ids costs the books: usage_records is keyed by request_id, so random ids put every new
 * record at a random place in the primary key's index (one index page written per request), while ids that begin
 * with their time (src/domain/api-keys.ts, newRequestId) add them at its end (one page shared by many requests).
 *
 *   npx tsx bench/request-id-order.ts [--records 200000] [--requests 4000] [--batch 8] [--rounds 4] [--no-postgres]
 *
 * For each database, two stores side by side, one per kind of id, each filled first with `--records` records made
 * with its kind of id (history, as on a gateway in use); then `--rounds` rounds, the two kinds in turns (the order
 * alternating), each of `--requests` requests in steady state through store.commitBatch (every batch admits `--batch`
 * new requests and completes the batch before: the gateway's group commit at moderate load), preview mode.
 * Printed per request: CPU (SQLite: this process, which runs the database; PostgreSQL: this process and the
 * database's processes from /proc), wall time, and WAL bytes (SQLite: the -wal file's growth with checkpoints off;
 * PostgreSQL: pg_current_wal_lsn() after a CHECKPOINT, so both kinds start with the same full-page-image debt).
 */
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { newRequestId } from "../src/domain/api-keys.ts";
import type { AdmitCommand } from "../src/domain/bookkeeping.ts";
import { openStore } from "../src/store/open-store.ts";
import { openSqliteStore, type SqliteStore } from "../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../src/store/store.ts";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import { benchAdmission, benchCompletion, lsnBytes, provisionBenchOrg, randomRequestId } from "./book-steps.ts";
import { postgresCpuSince, readPostgresCpu } from "./proc-cpu.ts";

const args = process.argv.slice(2);
const numberArg = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : fallback;
};
const RECORDS = numberArg("records", 200_000);
const REQUESTS = numberArg("requests", 4000);
const BATCH = numberArg("batch", 8);
const ROUNDS = numberArg("rounds", 4);
const POSTGRES = !args.includes("--no-postgres");
const FILL_BATCH = 500;

const KINDS = { random: randomRequestId, "time first": newRequestId } as const;
type Kind = keyof typeof KINDS;

interface Side {
  kind: Kind;
  store: Store;
  who: { orgId: string; keyId: string };
  pending: AdmitCommand[];
  /** WAL position now, in bytes. */
  wal(): Promise<number>;
  /** Starts counting the CPU of the database's own processes: the ns spent since (0 for SQLite: it runs in this process). */
  serverClock(): () => number;
  beforeRound(): Promise<void>;
}

interface Figures {
  cpuUs: number;
  serverUs: number;
  wallUs: number;
  walBytes: number;
}

const log = (msg: string) => process.stderr.write(`${msg}\n`);
const f1 = (v: number) => v.toFixed(1);

/** One batch: `size` new admissions, the previous batch's completions. */
async function step(side: Side, size: number): Promise<void> {
  const admissions = Array.from({ length: size }, () =>
    benchAdmission("preview", side.who.orgId, side.who.keyId, Date.now(), false, KINDS[side.kind]),
  );
  const result = await side.store.commitBatch({ admissions, completions: side.pending.map((a) => benchCompletion(a, Date.now())) });
  if (result.admissions.some((r) => r.kind !== "admitted") || result.completions.some((r) => r.kind !== "completed")) {
    throw new Error(`unexpected results: ${JSON.stringify(result).slice(0, 300)}`);
  }
  side.pending = admissions;
}

async function fill(side: Side): Promise<void> {
  const t0 = performance.now();
  for (let n = 0; n < RECORDS; n += FILL_BATCH) await step(side, FILL_BATCH);
  log(`  ${side.kind}: ${RECORDS} records of history in ${f1((performance.now() - t0) / 1000)} s`);
}

async function measure(side: Side): Promise<Figures> {
  await side.beforeRound();
  const [wal0, server, cpu0, t0] = [await side.wal(), side.serverClock(), process.cpuUsage(), performance.now()];
  for (let n = 0; n < REQUESTS; n += BATCH) await step(side, BATCH);
  const [t1, cpu1, serverNs, wal1] = [performance.now(), process.cpuUsage(cpu0), server(), await side.wal()];
  return {
    cpuUs: (cpu1.user + cpu1.system) / REQUESTS,
    serverUs: serverNs / 1000 / REQUESTS,
    wallUs: ((t1 - t0) * 1000) / REQUESTS,
    walBytes: (wal1 - wal0) / REQUESTS,
  };
}

const median = (values: number[]) => {
  const s = [...values].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

async function compare(database: string, sides: Side[]): Promise<string[]> {
  for (const side of sides) await fill(side);
  const runs = new Map<Kind, Figures[]>(sides.map((s) => [s.kind, []]));
  for (let round = 0; round < ROUNDS; round++) {
    for (const side of round % 2 === 0 ? sides : [...sides].reverse()) {
      const figures = await measure(side);
      runs.get(side.kind)!.push(figures);
      log(
        `  round ${round + 1}, ${side.kind}: ${f1(figures.cpuUs)} + ${f1(figures.serverUs)} µs CPU, ${figures.walBytes.toFixed(0)} WAL bytes per request`,
      );
    }
  }
  const lines: string[] = [];
  const medians = new Map<Kind, Figures>();
  for (const [kind, list] of runs) {
    const m: Figures = {
      cpuUs: median(list.map((f) => f.cpuUs)),
      serverUs: median(list.map((f) => f.serverUs)),
      wallUs: median(list.map((f) => f.wallUs)),
      walBytes: median(list.map((f) => f.walBytes)),
    };
    medians.set(kind, m);
    const each = (pick: (f: Figures) => number, digits = 1) => list.map((f) => pick(f).toFixed(digits)).join(" / ");
    lines.push(
      `| ${database} | ${kind} | ${f1(m.cpuUs)} (${each((f) => f.cpuUs)}) | ${database === "SQLite" ? "–" : `${f1(m.serverUs)} (${each((f) => f.serverUs)})`} | ` +
        `${f1(m.wallUs)} (${each((f) => f.wallUs)}) | ${m.walBytes.toFixed(0)} (${each((f) => f.walBytes, 0)}) |`,
    );
  }
  const [a, b] = [medians.get("random")!, medians.get("time first")!];
  const ratio = (x: number, y: number) => (y > 0 ? (x / y).toFixed(2) : "–");
  lines.push(
    `| ${database} | time first ÷ random | ${ratio(b.cpuUs, a.cpuUs)} | ${database === "SQLite" ? "–" : ratio(b.serverUs, a.serverUs)} | ${ratio(b.wallUs, a.wallUs)} | ${ratio(b.walBytes, a.walBytes)} |`,
  );
  return lines;
}

async function sqliteSides(dir: string): Promise<Side[]> {
  const sides: Side[] = [];
  for (const kind of Object.keys(KINDS) as Kind[]) {
    const path = join(dir, `${kind.replace(" ", "-")}.sqlite`);
    // No checkpoints: the -wal file only grows, and its growth is what the requests wrote.
    const store: SqliteStore = openSqliteStore(path, { checkpointIntervalMs: 0 });
    store.db.pragma("wal_autocheckpoint = 0");
    sides.push({
      kind,
      store,
      who: await provisionBenchOrg(store),
      pending: [],
      wal: async () => statSync(`${path}-wal`).size,
      serverClock: () => () => 0,
      beforeRound: async () => {
        store.db.pragma("wal_checkpoint(TRUNCATE)");
      },
    });
  }
  return sides;
}

async function postgresSides(): Promise<{ sides: Side[]; drop(): Promise<void> }> {
  const sides: Side[] = [];
  const drops: Array<() => Promise<void>> = [];
  for (const kind of Object.keys(KINDS) as Kind[]) {
    const db = await createTestDatabase("tds_bench_ids");
    drops.push(() => db.drop());
    const store = await openStore(`${db.url}?pool_size=4`);
    const monitor = new pg.Client({ connectionString: db.url });
    await monitor.connect();
    drops.unshift(() => monitor.end());
    drops.unshift(() => store.close());
    const lsn = async () => {
      const text = (await monitor.query<{ lsn: string }>("SELECT pg_current_wal_lsn()::text AS lsn")).rows[0]!.lsn;
      return Number(lsnBytes(text));
    };
    sides.push({
      kind,
      store,
      who: await provisionBenchOrg(store),
      pending: [],
      wal: lsn,
      serverClock: () => {
        const before = readPostgresCpu(db.name);
        return () => {
          const since = postgresCpuSince(before, readPostgresCpu(db.name));
          return since.backendsNs + since.backgroundNs;
        };
      },
      beforeRound: async () => {
        await monitor.query("VACUUM (ANALYZE) usage_records");
        await monitor.query("CHECKPOINT");
      },
    });
  }
  return {
    sides,
    drop: async () => {
      for (const d of drops) await d();
    },
  };
}

const header = [
  `Request id order: ${RECORDS} records of history, then ${ROUNDS} rounds of ${REQUESTS} requests per kind in steady-state batches of ${BATCH} (preview; medians, then the rounds)`,
  "",
  "| database | request ids | CPU µs per request (this process) | database processes' CPU µs per request | wall µs per request | WAL bytes per request |",
  "| --- | --- | ---: | ---: | ---: | ---: |",
];
const dir = mkdtempSync(join(tmpdir(), "tds-bench-ids-"));
try {
  log("SQLite");
  const sqlite = await sqliteSides(dir);
  header.push(...(await compare("SQLite", sqlite)));
  for (const s of sqlite) await s.store.close();
  if (POSTGRES) {
    log("PostgreSQL");
    try {
      const pgSides = await postgresSides();
      try {
        header.push(...(await compare("PostgreSQL", pgSides.sides)));
      } finally {
        await pgSides.drop();
      }
    } catch (err) {
      header.push("", `PostgreSQL skipped: ${(err as Error).message}`);
    }
  }
  console.log(header.join("\n"));
} finally {
  rmSync(dir, { recursive: true, force: true });
}
