import { randomBytes } from "node:crypto";
import pg from "pg";

export const TEST_POSTGRES_URL = process.env.TDS_TEST_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/test";

/** A fresh, empty database on the test server, dropped (connections terminated first) by drop(). */
export async function createTestDatabase(prefix = "tds_it"): Promise<{ url: string; name: string; drop(): Promise<void> }> {
  const name = `${prefix}_${randomBytes(5).toString("hex")}`;
  const admin = new pg.Client({ connectionString: TEST_POSTGRES_URL });
  try {
    await admin.connect();
  } catch (err) {
    throw new Error(`PostgreSQL is not reachable at ${TEST_POSTGRES_URL} (run scripts/ensure-services.sh): ${(err as Error).message}`);
  }
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = new URL(TEST_POSTGRES_URL);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    name,
    async drop() {
      const c = new pg.Client({ connectionString: TEST_POSTGRES_URL });
      await c.connect();
      await c.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", [name]);
      await c.query(`DROP DATABASE IF EXISTS ${name}`);
      await c.end();
    },
  };
}
