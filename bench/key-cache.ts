/**
 * What keeping API key lookups (TDS_KEY_CACHE_MS) saves: two gateways side by side on each database, one reading
 * the key for every request (0, the default), one keeping it for 1000 ms, in front of the precomputed model server.
 *
 *   npx tsx bench/key-cache.ts [--slices 5] [--requests 8000] [--connections 32] [--rate 300] [--paced-seconds 6] [--no-postgres]
 *
 * For each database (SQLite; PostgreSQL, a scratch database of the local server, skipped with a note when it cannot
 * be created) and mode preview, `--slices` times: each gateway `--requests` requests at `--connections` connections
 * (autocannon), then each `--paced-seconds` at `--rate` req/s evenly paced, the two taken in alternating order. Around
 * every saturating slice it reads the CPU time of the gateway (every thread, /proc) and, on PostgreSQL, of the bench
 * database's backends and of the server's shared processes (which also serve any other database's load). Every
 * request uses the gateway's one key, so with 1000 ms nearly every lookup is kept: the best case. Prints the medians
 * of the slices per gateway and the ratio kept ÷ read. Nothing is asserted.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import { median, paced, percentile, saturate } from "./load.ts";
import { cpuSince, postgresCpuSince, readCpu, readPostgresCpu } from "./proc-cpu.ts";
import { OPEN_LIMITS, provisionOrg, realisticRequest, type Started, startGateway, startPrecomputedModel } from "./support.ts";

const { values } = parseArgs({
  options: {
    slices: { type: "string", default: "5" },
    requests: { type: "string", default: "8000" },
    connections: { type: "string", default: "32" },
    rate: { type: "string", default: "300" },
    "paced-seconds": { type: "string", default: "6" },
    "no-postgres": { type: "boolean", default: false },
  },
});
const KEPT_MS = "1000";

interface Variant {
  label: string;
  gateway: Started;
  key: string;
  /** The PostgreSQL database's name, whose backends are this gateway's alone. */
  database: string | null;
  cpuUs: number[];
  postgresUs: number[];
  backendsUs: number[];
  p50: number[];
  p99: number[];
}

const cleanups: Array<() => Promise<void>> = [];
const body = JSON.stringify(realisticRequest());

async function variant(
  label: string,
  databaseUrl: string,
  database: string | null,
  keyCacheMs: string,
  modelUrl: string,
): Promise<Variant> {
  const key = await provisionOrg(databaseUrl);
  const gateway = await startGateway({
    TDS_MODEL_SERVICE_URL: modelUrl,
    TDS_DATABASE_URL: databaseUrl,
    TDS_SERVICE_MODE: "preview",
    TDS_KEY_CACHE_MS: keyCacheMs,
    ...OPEN_LIMITS,
  });
  cleanups.push(() => gateway.stop());
  return { label, gateway, key, database, cpuUs: [], postgresUs: [], backendsUs: [], p50: [], p99: [] };
}

async function compare(name: string, variants: [Variant, Variant]): Promise<void> {
  const target = (v: Variant) => ({ url: v.gateway.url, keys: [v.key] });
  const connections = Number(values.connections);
  for (const v of variants) await saturate(target(v), body, { connections, amount: 3000 });
  for (let slice = 0; slice < Number(values.slices); slice++) {
    const inTurn = slice % 2 === 0 ? variants : [variants[1], variants[0]];
    for (const v of inTurn) {
      const cpu = readCpu(v.gateway.child.pid!);
      const pgCpu = v.database ? readPostgresCpu(v.database) : null;
      const s = await saturate(target(v), body, { connections, amount: Number(values.requests) });
      v.cpuUs.push(cpuSince(cpu, readCpu(v.gateway.child.pid!)).ns / 1000 / s.requests);
      if (pgCpu && v.database) {
        const spent = postgresCpuSince(pgCpu, readPostgresCpu(v.database));
        v.postgresUs.push((spent.backendsNs + spent.backgroundNs) / 1000 / s.requests);
        v.backendsUs.push(spent.backendsNs / 1000 / s.requests);
      }
    }
    for (const v of inTurn) {
      const s = await paced(target(v), body, { seconds: Number(values["paced-seconds"]), rate: Number(values.rate) });
      v.p50.push(percentile(s.times, 50));
      v.p99.push(percentile(s.times, 99));
    }
  }
  const [read, kept] = variants;
  const row = (label: string, f: (v: Variant) => number[], digits: number) => {
    const [a, b] = [median(f(read)), median(f(kept))];
    return `| ${label} | ${a.toFixed(digits)} | ${b.toFixed(digits)} | ${(b / a).toFixed(2)} |`;
  };
  console.log(`\n${name}\n\n| figure | ${read.label} | ${kept.label} | ratio |\n| --- | ---: | ---: | ---: |`);
  console.log(row("gateway CPU µs per request, saturating", (v) => v.cpuUs, 0));
  if (read.database) {
    console.log(row("PostgreSQL CPU µs per request, saturating", (v) => v.postgresUs, 0));
    console.log(row("  of which its backends of the bench database", (v) => v.backendsUs, 0));
  }
  console.log(row(`p50 ms at ${values.rate} req/s paced`, (v) => v.p50, 2));
  console.log(row(`p99 ms at ${values.rate} req/s paced`, (v) => v.p99, 2));
  console.log(`(slices: read ${read.cpuUs.map((x) => x.toFixed(0)).join(" / ")}; kept ${kept.cpuUs.map((x) => x.toFixed(0)).join(" / ")})`);
}

/** Two scratch databases of the local PostgreSQL server, or null (said) when it cannot create them. */
async function postgresDatabases() {
  try {
    const dbs = [await createTestDatabase("tds_bench_keys"), await createTestDatabase("tds_bench_keys")];
    for (const db of dbs) cleanups.push(() => db.drop());
    return dbs;
  } catch (err) {
    console.log(`\nPostgreSQL skipped: ${err instanceof Error ? err.message : String(err)}`);
    return null;
  }
}

const dir = mkdtempSync(join(tmpdir(), "tds-key-cache-"));
try {
  console.log(`${cpus().length} cores, Node ${process.version}; preview mode; TDS_KEY_CACHE_MS 0 (read) against ${KEPT_MS} (kept)`);
  const model = await startPrecomputedModel();
  cleanups.push(() => model.stop());
  await compare("SQLite", [
    await variant("read (0)", `sqlite:${join(dir, "read.sqlite")}`, null, "0", model.url),
    await variant(`kept (${KEPT_MS} ms)`, `sqlite:${join(dir, "kept.sqlite")}`, null, KEPT_MS, model.url),
  ]);
  const dbs = values["no-postgres"] ? null : await postgresDatabases();
  if (dbs) {
    await compare("PostgreSQL", [
      await variant("read (0)", dbs[0]!.url, dbs[0]!.name, "0", model.url),
      await variant(`kept (${KEPT_MS} ms)`, dbs[1]!.url, dbs[1]!.name, KEPT_MS, model.url),
    ]);
  }
} finally {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
  rmSync(dir, { recursive: true, force: true });
}
