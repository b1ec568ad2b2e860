/**
 * `bench/gateway.ts --store-costs`: the cost of the gateway's durable steps, `store.commitBatch` called directly
 * (no HTTP, no group committer), one transaction after the other, in steady state: every batch admits B new
 * requests and completes the B admitted by the batch before (2B steps), for B = 1, 8 and 32, in preview and in paid
 * mode. Printed per step (a step is one admission or one completion; a request is two steps):
 *
 * - SQLite (a file in the temp dir, WAL, synchronous=NORMAL as the gateway opens it, no checkpoints while
 *   counting): wall µs (the bench process is single-threaded and synchronous here, so this is also its CPU), WAL
 *   bytes from the -wal file's growth, rows changed (total_changes()).
 * - PostgreSQL (a scratch database, a pool of one connection): wall µs, client CPU µs (this process: the store's
 *   JavaScript and pg's protocol work, what a gateway pays per step), server CPU µs (the database's backend plus
 *   PostgreSQL's shared processes, from /proc), WAL bytes (pg_current_wal_lsn() differences; cluster-wide, so
 *   other activity on the server adds to it), transactions and rows inserted/updated/deleted per batch (from
 *   pg_stat_database, flushed with pg_stat_force_next_flush()).
 */
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { openStore } from "../src/store/open-store.ts";
import type { PostgresStore } from "../src/store/postgres/postgres-store.ts";
import { openSqliteStore, type SqliteStore } from "../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../src/store/store.ts";
import { createTestDatabase, TEST_POSTGRES_URL } from "../test/support/postgres-db.ts";
import { benchAdmission, benchCompletion, lsnBytes, provisionBenchOrg } from "./book-steps.ts";
import { postgresCpuSince, readPostgresCpu } from "./proc-cpu.ts";

type Mode = "preview" | "paid";
const MODES: Mode[] = ["preview", "paid"];
const BATCH_SIZES = [1, 8, 32];
/** Requests per measured configuration (each is two steps). */
const REQUESTS = 2000;
const GRANT = 1_000_000_000_000;

// ── the steps ────────────────────────────────────────────────────────────────────────────────

/** An organization with a key (and credits in paid mode). */
const provision = (store: Store, mode: Mode) => provisionBenchOrg(store, mode === "paid" ? GRANT : 0);

/**
 * Runs `batches` steady-state batches of `size` requests (each admits `size` new requests and completes the previous
 * batch's) after one batch that only admits; `measure` wraps the steady-state ones.
 */
export async function steadyBatches(
  store: Store,
  mode: Mode,
  who: { orgId: string; keyId: string },
  size: number,
  batches: number,
  measure: (run: () => Promise<void>) => Promise<void>,
): Promise<void> {
  const admitSome = () => Array.from({ length: size }, () => benchAdmission(mode, who.orgId, who.keyId, Date.now()));
  let pending = admitSome();
  await store.commitBatch({ admissions: pending, completions: [] });
  await measure(async () => {
    for (let i = 0; i < batches; i++) {
      const admissions = admitSome();
      const result = await store.commitBatch({ admissions, completions: pending.map((a) => benchCompletion(a, Date.now())) });
      if (result.admissions.some((r) => r.kind !== "admitted") || result.completions.some((r) => r.kind !== "completed")) {
        throw new Error(`unexpected results: ${JSON.stringify(result).slice(0, 300)}`);
      }
      pending = admissions;
    }
  });
}

const batchesFor = (size: number) => Math.max(60, Math.ceil(REQUESTS / size));
const f1 = (v: number) => (Number.isFinite(v) ? v.toFixed(1) : "–");
const f2 = (v: number) => (Number.isFinite(v) ? v.toFixed(2) : "–");

// ── SQLite ───────────────────────────────────────────────────────────────────────────────────

async function sqliteCosts(): Promise<string> {
  const lines = [
    "| SQLite file, commitBatch | requests per batch | µs per batch | µs per step | µs per request | WAL bytes per step | rows changed per batch |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  const dir = mkdtempSync(join(tmpdir(), "tds-store-costs-"));
  try {
    for (const mode of MODES) {
      for (const size of BATCH_SIZES) {
        const path = join(dir, `${mode}-${size}.sqlite`);
        // No checkpointer and no automatic checkpoints: the -wal file only grows while counting.
        const store: SqliteStore = openSqliteStore(path, { checkpointIntervalMs: 0 });
        store.db.pragma("wal_autocheckpoint = 0");
        const who = await provision(store, mode);
        const changes = store.db.prepare<[], { n: number }>("SELECT total_changes() AS n");
        const walBytes = () => statSync(`${path}-wal`).size;
        const batches = batchesFor(size);
        await steadyBatches(store, mode, who, size, batches, async (run) => {
          const [wal0, rows0, t0] = [walBytes(), changes.get()!.n, performance.now()];
          await run();
          const [t1, rows1, wal1] = [performance.now(), changes.get()!.n, walBytes()];
          const us = ((t1 - t0) * 1000) / batches;
          const steps = batches * 2 * size;
          lines.push(
            `| ${mode} | ${size} | ${f1(us)} | ${f1(us / (2 * size))} | ${f1(us / size)} | ${((wal1 - wal0) / steps).toFixed(0)} | ${f1((rows1 - rows0) / batches)} |`,
          );
        });
        await store.close();
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return lines.join("\n");
}

// ── PostgreSQL ───────────────────────────────────────────────────────────────────────────────

interface PgStats {
  walBytes: bigint;
  xactCommit: number;
  inserted: number;
  updated: number;
  deleted: number;
}

/**
 * The WAL position and the database's counters, after the store's connections flushed their statistics (a backend
 * publishes them when it goes idle, at most once a second unless told to; each pool of a store opened with pool_size=1
 * has one connection).
 */
async function pgStats(store: PostgresStore, monitor: pg.Client, database: string): Promise<PgStats> {
  await store.bookkeepingPool.query("SELECT pg_stat_force_next_flush()");
  await store.pool.query("SELECT pg_stat_force_next_flush()");
  await monitor.query("SELECT pg_stat_clear_snapshot()");
  const row = (
    await monitor.query<{ lsn: string; xact_commit: string; tup_inserted: string; tup_updated: string; tup_deleted: string }>(
      "SELECT pg_current_wal_lsn()::text AS lsn, xact_commit, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database WHERE datname = $1",
      [database],
    )
  ).rows[0]!;
  return {
    walBytes: lsnBytes(row.lsn),
    xactCommit: Number(row.xact_commit),
    inserted: Number(row.tup_inserted),
    updated: Number(row.tup_updated),
    deleted: Number(row.tup_deleted),
  };
}

/** Runs `fn` on a connection of its own to `url`. */
async function monitorOf<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

async function postgresCosts(): Promise<string> {
  const db = await createTestDatabase("tds_bench_store");
  const monitor = new pg.Client({ connectionString: TEST_POSTGRES_URL });
  await monitor.connect();
  const settings = (
    await monitor.query<{ name: string; setting: string }>(
      "SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum', 'synchronous_commit', 'fsync', 'wal_level', 'full_page_writes', 'shared_buffers', 'server_version') ORDER BY name",
    )
  ).rows;
  // History first, then statistics (the server may run without autovacuum): plans as on a database in use.
  const seed = (await openStore(db.url)) as PostgresStore;
  await steadyBatches(seed, "paid", await provision(seed, "paid"), 32, 100, (run) => run());
  await seed.close();
  const vacuum = () => monitorOf(db.url, (c) => c.query("VACUUM (ANALYZE)"));
  const lines = [
    `PostgreSQL (${settings.map((s) => `${s.name}=${s.setting}`).join(", ")}), pool of one connection, ` +
      "3200 requests of history and VACUUM (ANALYZE) before each row:",
    "",
    "| PostgreSQL, commitBatch | requests per batch | wall µs per batch | wall µs per step | client CPU µs per step | server CPU µs per step (backend + shared) | WAL bytes per step | transactions per batch | rows ins/upd/del per batch |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
  ];
  try {
    for (const mode of MODES) {
      for (const size of BATCH_SIZES) {
        const store = (await openStore(`${db.url}?pool_size=1`)) as PostgresStore;
        try {
          const who = await provision(store, mode);
          await vacuum();
          const batches = batchesFor(size);
          await steadyBatches(store, mode, who, size, batches, async (run) => {
            const s0 = await pgStats(store, monitor, db.name);
            const [cpu0, client0, t0] = [readPostgresCpu(db.name), process.cpuUsage(), performance.now()];
            await run();
            const [t1, client1, cpu1] = [performance.now(), process.cpuUsage(), readPostgresCpu(db.name)];
            const s1 = await pgStats(store, monitor, db.name);
            const steps = batches * 2 * size;
            const server = postgresCpuSince(cpu0, cpu1);
            const clientUs = client1.user - client0.user + (client1.system - client0.system);
            // Two statements of the bench (the second reading's pg_stat_force_next_flush, one per pool) are transactions of their own.
            const xacts = (s1.xactCommit - s0.xactCommit - 2) / batches;
            const per = (n: number) => f1(n / batches);
            lines.push(
              `| ${mode} | ${size} | ${f1(((t1 - t0) * 1000) / batches)} | ${f1(((t1 - t0) * 1000) / steps)} | ${f1(clientUs / steps)} | ` +
                `${f1((server.backendsNs + server.backgroundNs) / 1000 / steps)} (${f1(server.backendsNs / 1000 / steps)} + ${f1(server.backgroundNs / 1000 / steps)}) | ` +
                `${(Number(s1.walBytes - s0.walBytes) / steps).toFixed(0)} | ${f2(xacts)} | ${per(s1.inserted - s0.inserted)} / ${per(s1.updated - s0.updated)} / ${per(s1.deleted - s0.deleted)} |`,
            );
          });
        } finally {
          await store.close();
        }
      }
    }
  } finally {
    await monitor.end();
    await db.drop();
  }
  return lines.join("\n");
}

/** Both tables (PostgreSQL when `postgres` and reachable; otherwise a note why not). */
export async function storeCosts(options: { postgres: boolean; log: (msg: string) => void }): Promise<string> {
  options.log("store costs: SQLite");
  const parts = [
    `store.commitBatch, ${REQUESTS} requests per row (at least 60 batches), one transaction after the other:`,
    "",
    await sqliteCosts(),
  ];
  if (!options.postgres) return parts.join("\n");
  options.log("store costs: PostgreSQL");
  try {
    parts.push("", await postgresCosts());
  } catch (err) {
    parts.push("", `PostgreSQL store costs skipped: ${(err as Error).message}`);
  }
  return parts.join("\n");
}
