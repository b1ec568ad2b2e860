/**
 * The usage summaries on a large SQLite database: `npx tsx bench/usage-summary.ts [records]` (default 1,000,000).
 *
 * 1. A database at migration 006 is seeded with `records` usage records over the last 31 UTC days (100 organizations,
 *    one of them with 30 % of the records; 90 % succeeded, the rest failed, a few in flight), in one transaction.
 * 2. For reference, the totals as 006 computed them (SQL sums over usage_records) are timed on it.
 * 3. Migration 007 is applied: the roll-up (usage_daily) is filled from the records by its backfill.
 * 4. In process: `usageSummary` (src/gateway/usage-summary.ts, what both routes call) over the store. SQLite is
 *    synchronous, so its whole time blocks the event loop: that is the block reported.
 * 5. Through HTTP, a gateway process on the file: GET /v1/usage/summary?days=31 (the big organization's key) and
 *    GET /admin/v1/usage/summary?days=31, one after the other; then /healthz probed every 20 ms for 10 s, alone and
 *    while the key polls its summary at 10/s and the admin at 1/s. Every answer is checked against the record count.
 */
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { generateApiKey } from "../src/domain/api-keys.ts";
import { DAY_MS } from "../src/domain/utc-day.ts";
import { usageSummary } from "../src/gateway/usage-summary.ts";
import { readMigrations } from "../src/store/migration-files.ts";
import { applyMigrations, SQLITE_MIGRATIONS_DIR } from "../src/store/sqlite/migrations.ts";
import { openSqliteStore } from "../src/store/sqlite/sqlite-store.ts";
import { mulberry32 } from "../test/support/seeded-random.ts";
import { OPEN_LIMITS, startGateway } from "./support.ts";

/** The usage_records columns as migration 006 left them (the records of an older version). */
const USAGE_COLUMNS_006 =
  "request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens, output_tokens, " +
  "cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms, deployment, attempts";

const RECORDS = Number(process.argv[2] ?? 1_000_000);
const ORGS = 100;
const DAYS = 31;
const ADMIN_TOKEN = "bench-admin-token-0123456789abcdefghij";

const ms = (ns: bigint) => Number(ns) / 1e6;
function time<T>(fn: () => T): { value: T; ms: number } {
  const start = process.hrtime.bigint();
  const value = fn();
  return { value, ms: ms(process.hrtime.bigint() - start) };
}
async function timeAsync<T>(fn: () => Promise<T>): Promise<{ value: T; ms: number }> {
  const start = process.hrtime.bigint();
  const value = await fn();
  return { value, ms: ms(process.hrtime.bigint() - start) };
}
function stats(samples: number[]): { p50: number; p99: number; max: number } {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
  return { p50: at(0.5), p99: at(0.99), max: s.at(-1)! };
}
const f = (n: number) => n.toFixed(n < 10 ? 2 : 1);

interface Seeded {
  bigOrg: string;
  bigKey: string;
  bigOrgRecords: number;
}

/** Organizations, one key for the big one, and the records, at migration 006 (no roll-up yet). */
function seed(db: Database.Database, nowMs: number): Seeded {
  const random = mulberry32(42);
  const orgs = Array.from({ length: ORGS }, (_, i) => `org_bench_${String(i).padStart(3, "0")}`);
  const insertOrg = db.prepare("INSERT INTO organizations (id, name, paused, created_at_ms) VALUES (?, ?, 0, ?)");
  for (const id of orgs) insertOrg.run(id, `Bench ${id}`, nowMs - 40 * DAY_MS);
  const key = generateApiKey();
  db.prepare("INSERT INTO api_keys (id, org_id, name, hash, created_at_ms) VALUES (?, ?, 'bench', ?, ?)").run(
    key.id,
    orgs[0],
    key.hash,
    nowMs - 40 * DAY_MS,
  );
  const insert = db.prepare(`INSERT INTO usage_records (${USAGE_COLUMNS_006}) VALUES (${Array(19).fill("?").join(", ")})`);
  const firstDay = nowMs - (nowMs % DAY_MS) - (DAYS - 1) * DAY_MS;
  let big = 0;
  db.transaction(() => {
    for (let i = 0; i < RECORDS; i++) {
      const org = random() < 0.3 ? orgs[0]! : orgs[1 + Math.floor(random() * (ORGS - 1))]!;
      if (org === orgs[0]) big++;
      const createdAtMs = Math.min(nowMs - 1, firstDay + Math.floor(random() * DAYS * DAY_MS));
      const roll = random();
      const outcome =
        nowMs - createdAtMs < 60_000 && roll < 0.5 ? "in_flight" : roll < 0.9 ? "succeeded" : roll < 0.95 ? "model_error" : "gateway_error";
      const final = outcome !== "in_flight";
      const input = final ? 200 + Math.floor(random() * 2000) : 0;
      const output = final ? Math.floor(random() * 60) : 0;
      insert.run(
        `req_${i.toString(36)}`,
        org,
        key.id,
        createdAtMs,
        "api",
        "jev-1",
        "paid",
        outcome,
        final ? (outcome === "succeeded" ? 200 : 502) : null,
        input,
        output,
        outcome === "succeeded" ? Math.floor(input * 0.7 + output * 2.1) : 0,
        final ? 300 : null,
        final ? 310 : 0,
        outcome === "succeeded" || !final ? null : "failed",
        0,
        final ? createdAtMs + 300 : null,
        final ? "default" : null,
        final ? 1 : 0,
      );
    }
  })();
  return { bigOrg: orgs[0]!, bigKey: key.raw, bigOrgRecords: big };
}

/** The totals as migration 006's adapter computed them: sums over the records of the period. */
function before(db: Database.Database, fromMs: number, toMs: number, orgId: string) {
  const sums = "count(*) AS requests, sum(input_tokens), sum(output_tokens), sum(cost_microusd)";
  const days = `SELECT (created_at_ms / ${DAY_MS}) * ${DAY_MS} AS day_start_ms, ${sums} FROM usage_records WHERE created_at_ms >= ? AND created_at_ms < ?`;
  const all = time(() => {
    db.prepare(`${days} GROUP BY day_start_ms`).all(fromMs, toMs);
    db.prepare(`SELECT org_id, ${sums} FROM usage_records WHERE created_at_ms >= ? AND created_at_ms < ? GROUP BY org_id`).all(
      fromMs,
      toMs,
    );
  });
  const one = time(() => db.prepare(`${days} AND org_id = ? GROUP BY day_start_ms`).all(fromMs, toMs, orgId));
  return { all: all.ms, one: one.ms };
}

async function probeHealth(url: string, seconds: number, during?: () => Promise<void>): Promise<number[]> {
  const latencies: number[] = [];
  const end = Date.now() + seconds * 1000;
  const background = during?.();
  while (Date.now() < end) {
    const { ms: took } = await timeAsync(async () => (await fetch(`${url}/healthz`)).arrayBuffer());
    latencies.push(took);
    await new Promise((r) => setTimeout(r, 20));
  }
  await background;
  return latencies;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "tds-usage-summary-bench-"));
  const path = join(dir, "tds.sqlite");
  try {
    const nowMs = Date.now();
    const toMs = nowMs - (nowMs % DAY_MS) + DAY_MS;
    const fromMs = toMs - DAYS * DAY_MS;
    const migrations = readMigrations(SQLITE_MIGRATIONS_DIR);
    const db = new Database(path);
    chmodSync(path, 0o600);
    db.pragma("journal_mode = WAL");
    applyMigrations(
      db,
      migrations.filter((m) => m.version < 7),
    );
    db.pragma("synchronous = OFF");
    const seeding = time(() => seed(db, nowMs));
    const seeded = seeding.value;
    console.log(`seeded ${RECORDS} records (${seeded.bigOrgRecords} of ${seeded.bigOrg}) in ${(seeding.ms / 1000).toFixed(1)} s`);
    db.exec("ANALYZE");
    const old = before(db, fromMs, toMs, seeded.bigOrg);
    console.log(`before (006, sums over the records): every organization, 31 days ${f(old.all)} ms; one organization ${f(old.one)} ms`);
    db.pragma("synchronous = NORMAL");
    const backfill = time(() => applyMigrations(db, migrations));
    const rows = (db.prepare("SELECT count(*) AS n FROM usage_daily").get() as { n: number }).n;
    console.log(`migration 007 (backfill of usage_daily): ${(backfill.ms / 1000).toFixed(2)} s, ${rows} rows`);
    db.close();

    // In process: the one implementation, over the store; its time is all synchronous (the event-loop block).
    const store = openSqliteStore(path);
    const inProcess: Record<string, number[]> = {
      "every organization, 31 days": [],
      "every organization, 14 days": [],
      "one organization, 31 days": [],
    };
    for (let i = -5; i < 30; i++) {
      if (i < 0) {
        await usageSummary(store, { nowMs, days: 31 });
        continue;
      }
      inProcess["every organization, 31 days"]!.push((await timeAsync(() => usageSummary(store, { nowMs, days: 31 }))).ms);
      inProcess["every organization, 14 days"]!.push((await timeAsync(() => usageSummary(store, { nowMs, days: 14 }))).ms);
      inProcess["one organization, 31 days"]!.push(
        (await timeAsync(() => usageSummary(store, { nowMs, days: 31, orgId: seeded.bigOrg }))).ms,
      );
    }
    const check = await usageSummary(store, { nowMs, days: 31 });
    const counted = check.days.reduce((n, d) => n + d.requests, 0);
    if (counted !== RECORDS) throw new Error(`the summary counted ${counted} of ${RECORDS} records`);
    await store.close();

    // Through HTTP: a gateway process on the file.
    const gateway = await startGateway({
      TDS_DATABASE_URL: `sqlite:${path}`,
      TDS_ADMIN_TOKEN: ADMIN_TOKEN,
      TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9",
      ...OPEN_LIMITS,
    });
    const http: Record<string, number[]> = { "GET /v1/usage/summary?days=31": [], "GET /admin/v1/usage/summary?days=31": [] };
    try {
      const own = { authorization: `Bearer ${seeded.bigKey}` };
      const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };
      const get = async (p: string, headers: Record<string, string>) => {
        const res = await fetch(`${gateway.url}${p}`, { headers });
        if (res.status !== 200) throw new Error(`${p}: ${res.status} ${await res.text()}`);
        return (await res.json()) as { days: { requests: number }[]; truncated?: boolean };
      };
      // Warm-up (JIT, statement preparation), then measured.
      for (let i = 0; i < 5; i++) await Promise.all([get("/v1/usage/summary?days=31", own), get("/admin/v1/usage/summary?days=31", admin)]);
      for (let i = 0; i < 30; i++) {
        const a = await timeAsync(() => get("/v1/usage/summary?days=31", own));
        const b = await timeAsync(() => get("/admin/v1/usage/summary?days=31", admin));
        http["GET /v1/usage/summary?days=31"]!.push(a.ms);
        http["GET /admin/v1/usage/summary?days=31"]!.push(b.ms);
        if (i === 0) {
          const mine = a.value.days.reduce((n, d) => n + d.requests, 0);
          const all = b.value.days.reduce((n, d) => n + d.requests, 0);
          if (mine !== seeded.bigOrgRecords || all !== RECORDS || a.value.truncated)
            throw new Error(`summaries counted ${mine} / ${all}, expected ${seeded.bigOrgRecords} / ${RECORDS}`);
        }
      }
      const idle = await probeHealth(gateway.url, 5);
      const polled = await probeHealth(gateway.url, 10, async () => {
        const end = Date.now() + 10_000;
        const poll = async (p: string, headers: Record<string, string>, everyMs: number) => {
          while (Date.now() < end) {
            const started = Date.now();
            await get(p, headers);
            await new Promise((r) => setTimeout(r, Math.max(0, everyMs - (Date.now() - started))));
          }
        };
        await Promise.all([poll("/v1/usage/summary?days=31", own, 100), poll("/admin/v1/usage/summary?days=31", admin, 1000)]);
      });

      console.log(`\n### Usage summaries (\`npx tsx bench/usage-summary.ts ${RECORDS}\`)\n`);
      console.log("| measured | p50 ms | p99 ms | max ms |\n| --- | ---: | ---: | ---: |");
      for (const [label, samples] of Object.entries(inProcess)) {
        const s = stats(samples);
        console.log(`| usageSummary in process (event-loop block), ${label} | ${f(s.p50)} | ${f(s.p99)} | ${f(s.max)} |`);
      }
      for (const [label, samples] of Object.entries(http)) {
        const s = stats(samples);
        console.log(`| ${label} (${RECORDS.toLocaleString("en")} records) | ${f(s.p50)} | ${f(s.p99)} | ${f(s.max)} |`);
      }
      const i = stats(idle);
      const p = stats(polled);
      console.log(`| GET /healthz alone | ${f(i.p50)} | ${f(i.p99)} | ${f(i.max)} |`);
      console.log(
        `| GET /healthz while one key polls its summary at 10/s and the admin at 1/s | ${f(p.p50)} | ${f(p.p99)} | ${f(p.max)} |`,
      );
      console.log(
        `\nseeding ${(seeding.ms / 1000).toFixed(1)} s; migration 007 backfill ${(backfill.ms / 1000).toFixed(2)} s (${rows} rows); ` +
          `before (006): every organization ${f(old.all)} ms, one organization ${f(old.one)} ms`,
      );
    } finally {
      await gateway.stop();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
