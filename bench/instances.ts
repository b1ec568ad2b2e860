/**
 * One instance on SQLite, one on PostgreSQL, and two on PostgreSQL + Redis, in one run on this
 * machine, against the fake model server answering at once. Loopback only, bounded in time.
 *
 *   npx tsx bench/instances.ts [--seconds 10] [--connections 32]
 */
import { mkdtempSync, rmSync } from "node:fs";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { createTestDatabase } from "../test/support/postgres-db.ts";
import {
  type LoadResult,
  load,
  OPEN_LIMITS,
  provisionOrg,
  realisticRequest,
  row,
  startFakeModel,
  startGateway,
  TABLE_HEAD,
} from "./support.ts";

const { values } = parseArgs({ options: { seconds: { type: "string", default: "10" }, connections: { type: "string", default: "32" } } });
const seconds = Number(values.seconds);
const connections = Number(values.connections);
const body = JSON.stringify(realisticRequest());
const redisUrl = process.env.TDS_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";

const fake = await startFakeModel();
const dir = mkdtempSync(join(tmpdir(), "tds-bench-"));
const results: Array<[string, LoadResult]> = [];
try {
  const base = { TDS_MODEL_SERVICE_URL: fake.url, ...OPEN_LIMITS };

  const sqliteUrl = `sqlite:${join(dir, "bench.sqlite")}`;
  const sqliteKey = await provisionOrg(sqliteUrl);
  const sqlite = await startGateway({ ...base, TDS_DATABASE_URL: sqliteUrl });
  await load({ url: sqlite.url, path: "/v1/systemone", body, key: sqliteKey, connections, seconds: 2 }); // warm-up
  results.push(["1 instance, SQLite", await load({ url: sqlite.url, path: "/v1/systemone", body, key: sqliteKey, connections, seconds })]);
  await sqlite.stop();

  const db = await createTestDatabase("tds_bench");
  try {
    const pgKey = await provisionOrg(db.url);
    const pg = await startGateway({ ...base, TDS_DATABASE_URL: db.url });
    await load({ url: pg.url, path: "/v1/systemone", body, key: pgKey, connections, seconds: 2 });
    results.push(["1 instance, PostgreSQL", await load({ url: pg.url, path: "/v1/systemone", body, key: pgKey, connections, seconds })]);
    await pg.stop();

    const pgRedis = await startGateway({ ...base, TDS_DATABASE_URL: db.url, TDS_REDIS_URL: redisUrl });
    await load({ url: pgRedis.url, path: "/v1/systemone", body, key: pgKey, connections, seconds: 2 });
    results.push([
      "1 instance, PostgreSQL + Redis",
      await load({ url: pgRedis.url, path: "/v1/systemone", body, key: pgKey, connections, seconds }),
    ]);
    await pgRedis.stop();

    const pair = await Promise.all([0, 1].map(() => startGateway({ ...base, TDS_DATABASE_URL: db.url, TDS_REDIS_URL: redisUrl })));
    await Promise.all(
      pair.map((g) => load({ url: g.url, path: "/v1/systemone", body, key: pgKey, connections: connections / 2, seconds: 2 })),
    );
    const both = await Promise.all(
      pair.map((g) => load({ url: g.url, path: "/v1/systemone", body, key: pgKey, connections: connections / 2, seconds })),
    );
    results.push([
      "2 instances, PostgreSQL + Redis (sum; worst p50/p99)",
      {
        rps: both[0]!.rps + both[1]!.rps,
        p50: Math.max(both[0]!.p50, both[1]!.p50),
        p99: Math.max(both[0]!.p99, both[1]!.p99),
        requests: both[0]!.requests + both[1]!.requests,
        errors: both[0]!.errors + both[1]!.errors,
        non2xx: both[0]!.non2xx + both[1]!.non2xx,
      },
    ]);
    await Promise.all(pair.map((g) => g.stop()));
  } finally {
    await db.drop();
  }
} finally {
  await fake.stop();
  rmSync(dir, { recursive: true, force: true });
}

console.log(
  `\n${cpus().length} cores (${cpus()[0]?.model ?? "?"}), Node ${process.version}, ${seconds} s per setup, ${connections} connections, preview mode, fake model answering at once\n`,
);
console.log(TABLE_HEAD);
for (const [name, r] of results) console.log(row(name, r));
const first = results[0]![1].rps;
console.log(`\nrelative to 1 instance on SQLite: ${results.map(([n, r]) => `${n}: ${(r.rps / first).toFixed(2)}×`).join("; ")}`);
