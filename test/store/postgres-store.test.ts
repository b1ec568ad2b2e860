/**
 * The PostgreSQL adapter: the Store contract suite, unchanged, plus what only a server database has —
 * concurrent instances, advisory-locked migrations, SKIP LOCKED sweeps, connection loss and timeouts.
 *
 * Server: TDS_TEST_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/test). The contract tests each get a
 * fresh schema in that database (CREATE SCHEMA, reached through the URL's `options=-c search_path=…`); the tests
 * of migrations and concurrency each get a fresh database (CREATE DATABASE from the `postgres` maintenance
 * database). All are named tds_test_<epoch seconds>_<random>_<n> and dropped at the end; ones left by a run that
 * was killed are dropped by a later run once they are an hour old. Without a reachable server the file FAILS,
 * unless TDS_SKIP_POSTGRES=1.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { copyFileSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer, connect as netConnect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import Database from "better-sqlite3";
import pg from "pg";
import { runCli } from "../../src/cli/cli.ts";
import { isPostgresUrl } from "../../src/database-url.ts";
import { hashApiKey } from "../../src/domain/api-keys.ts";
import type { AdmitCommand, AdmitResult, CompleteResult } from "../../src/domain/bookkeeping.ts";
import { migrationReportOf, openStore } from "../../src/store/open-store.ts";
import { postgresUsageListQuery } from "../../src/store/postgres/postgres-bookkeeping.ts";
import { connectionSettings, parseBigint, poolSizes } from "../../src/store/postgres/postgres-connection.ts";
import { postgresFailureKind } from "../../src/store/postgres/postgres-errors.ts";
import { MIGRATION_LOCK_KEY, POSTGRES_MIGRATIONS_DIR, readPostgresMigrations } from "../../src/store/postgres/postgres-migrations.ts";
import { openPostgresStore, type PostgresStore, type PostgresStoreOptions } from "../../src/store/postgres/postgres-store.ts";
import type { UsageQuery } from "../../src/store/store.ts";
import { StoreInputError } from "../../src/store/store-errors.ts";
import { encodeUsageCursor } from "../../src/store/usage-cursor.ts";
import { checkRowsAfter010, rowsBefore010 } from "../support/books-before-010.ts";
import { auditRowWithAction, checkKeysAfter013, keyRowsBefore013 } from "../support/keys-before-013.ts";
import { SOURCES_AFTER_012, usageRowsBefore012, usageRowWithSource } from "../support/usage-before-012.ts";
import { REFUSED_STATEMENTS, SEEDED_BALANCE, seedInvariantRows } from "./refused-statements.ts";
import { admission, checkBalanceInvariants, completion, describeStoreContract, usageRecord } from "./store-contract.ts";

const BASE_URL = process.env.TDS_TEST_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const SKIP = process.env.TDS_SKIP_POSTGRES === "1";
const T0 = 1_767_225_600_000;
const HOUR = 3_600_000;
const MIGRATION_COUNT = readPostgresMigrations().length;

/** A paid admission: its reservation's id is the request id. */
function paidAdmission(requestId: string, orgId: string, amount: number, nowMs = T0, expiresAtMs = T0 + HOUR): AdmitCommand {
  return admission({ requestId, orgId, nowMs, reservation: { amountMicrousd: amount, expiresAtMs } });
}

async function admitOne(store: PostgresStore, command: AdmitCommand): Promise<AdmitResult> {
  return (await store.commitBatch({ admissions: [command], completions: [] })).admissions[0]!;
}

/** The URL with another database name. */
function databaseUrl(database: string): string {
  const url = new URL(BASE_URL);
  url.pathname = `/${database}`;
  return url.toString();
}

/** The URL whose connections use `schema` (libpq's `options` parameter, which pg passes on). */
function schemaUrl(schema: string): string {
  return `${BASE_URL}${BASE_URL.includes("?") ? "&" : "?"}options=${encodeURIComponent(`-c search_path=${schema}`)}`;
}

function redacted(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    return u.toString();
  } catch {
    return "(unparsable URL)";
  }
}

/** null when the server answers, else why not. */
async function unreachable(): Promise<string | null> {
  const client = new pg.Client({ connectionString: BASE_URL, connectionTimeoutMillis: 3000 });
  client.on("error", () => undefined);
  try {
    await client.connect();
    await client.query("SELECT 1");
    return null;
  } catch (err) {
    return `${(err as Error).message}${(err as { code?: string }).code ? ` (${(err as { code?: string }).code})` : ""}`;
  } finally {
    await client.end().catch(() => undefined);
  }
}

const problem = SKIP ? null : await unreachable();

if (SKIP) {
  it("PostgreSQL store tests", { skip: "TDS_SKIP_POSTGRES=1" }, () => undefined);
} else if (problem !== null) {
  it("PostgreSQL is reachable for the PostgreSQL store tests", () => {
    assert.fail(
      `PostgreSQL is not reachable at ${redacted(BASE_URL)}: ${problem}.\n` +
        "Start it (pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start), point TDS_TEST_POSTGRES_URL at a server, " +
        "or set TDS_SKIP_POSTGRES=1 to skip these tests.",
    );
  });
} else {
  definePostgresTests();
}

function definePostgresTests(): void {
  const admin = new pg.Pool({ connectionString: BASE_URL, max: 3 });
  admin.on("error", () => undefined);
  const maintenance = new pg.Pool({ connectionString: databaseUrl("postgres"), max: 1 });
  maintenance.on("error", () => undefined);
  const RUN = `${Math.floor(Date.now() / 1000)}_${randomBytes(3).toString("hex")}`;
  const LEFTOVER = /^tds_test_(\d+)_[0-9a-f]{6}_\d+$/;
  const schemas: string[] = [];
  const databases: string[] = [];
  let names = 0;
  const nextName = () => `tds_test_${RUN}_${++names}`;
  const opened: PostgresStore[] = [];
  const tempDirs: string[] = [];

  async function freshSchema(): Promise<{ schema: string; url: string }> {
    const schema = nextName();
    await admin.query(`CREATE SCHEMA ${schema}`);
    schemas.push(schema);
    return { schema, url: schemaUrl(schema) };
  }

  async function freshDatabase(): Promise<{ database: string; url: string }> {
    const database = nextName();
    await maintenance.query(`CREATE DATABASE ${database}`);
    databases.push(database);
    return { database, url: databaseUrl(database) };
  }

  /** Opens a store that is closed at the end of the file (tests close it earlier when they can). */
  async function open(url: string, options: PostgresStoreOptions = {}): Promise<PostgresStore> {
    const store = await openPostgresStore(url, options);
    opened.push(store);
    return store;
  }

  /** A client of its own (not pooled) on `url`, for holding locks and looking at the server. */
  async function rawClient(url: string): Promise<pg.Client> {
    const client = new pg.Client({ connectionString: url });
    client.on("error", () => undefined);
    await client.connect();
    return client;
  }

  /** Nothing checked out, nothing waiting, no more connections than the pools allow. */
  function assertPoolIdle(store: PostgresStore): void {
    for (const pool of [store.pool, store.bookkeepingPool]) {
      const { totalCount, idleCount, waitingCount } = pool;
      assert.equal(waitingCount, 0, "no call waits for a client");
      assert.equal(idleCount, totalCount, `every client went back to the pool (total ${totalCount}, idle ${idleCount})`);
    }
    assert.ok(store.pool.totalCount + store.bookkeepingPool.totalCount <= Math.max(2, store.settings.poolSize));
  }

  async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 5000): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const value = await probe();
      if (value !== undefined) return value;
      if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  async function dropLeftovers(): Promise<void> {
    const cutoff = Date.now() / 1000 - 3600;
    const old = (name: string) => {
      const m = LEFTOVER.exec(name);
      return m !== null && Number(m[1]) < cutoff;
    };
    const oldSchemas = (
      await admin.query<{ name: string }>("SELECT nspname AS name FROM pg_namespace WHERE nspname LIKE 'tds\\_test\\_%'")
    ).rows
      .map((r) => r.name)
      .filter(old);
    for (const s of oldSchemas) await admin.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`).catch(() => undefined);
    const oldDatabases = (
      await maintenance.query<{ name: string }>("SELECT datname AS name FROM pg_database WHERE datname LIKE 'tds\\_test\\_%'")
    ).rows
      .map((r) => r.name)
      .filter(old);
    for (const d of oldDatabases) await maintenance.query(`DROP DATABASE IF EXISTS ${d} WITH (FORCE)`).catch(() => undefined);
  }

  const leftovers = dropLeftovers();

  after(async () => {
    await leftovers.catch(() => undefined);
    await Promise.all(opened.map((s) => s.close().catch(() => undefined)));
    // In a few statements (each DROP commits once), not one per schema.
    for (let i = 0; i < schemas.length; i += 20) {
      await admin.query(`DROP SCHEMA IF EXISTS ${schemas.slice(i, i + 20).join(", ")} CASCADE`);
    }
    for (const d of databases) await maintenance.query(`DROP DATABASE IF EXISTS ${d} WITH (FORCE)`);
    await admin.end();
    await maintenance.end();
    for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
  });

  describeStoreContract("postgres (fresh schema per test)", async () => openPostgresStore((await freshSchema()).url));

  describe("PostgreSQL store: connections", () => {
    it("gives every connection statement_timeout, idle_in_transaction_session_timeout and application_name; the pool size is set", async () => {
      const { url } = await freshSchema();
      const store = await open(url, {
        poolSize: 3,
        statementTimeoutMs: 1234,
        applicationName: "tds-test-settings",
        keepStatisticsFresh: true,
      });
      assert.equal(store.dialect, "postgres");
      assert.deepEqual(store.settings, { poolSize: 3, statementTimeoutMs: 1234, applicationName: "tds-test-settings" });
      // pool_size 3: two connections for reads, one for the bookkeeping transactions (with generic plans: the store keeps
      // the statistics fresh).
      assert.deepEqual([store.pool.options.max, store.bookkeepingPool.options.max], [2, 1]);
      const clients = await Promise.all([store.pool.connect(), store.pool.connect(), store.bookkeepingPool.connect()]);
      try {
        const pids = new Set<number>();
        for (const [i, client] of clients.entries()) {
          const row = (
            await client.query<{ st: string; idle: string; app: string; plans: string; pid: number }>(
              "SELECT current_setting('statement_timeout') AS st, current_setting('idle_in_transaction_session_timeout') AS idle, " +
                "current_setting('application_name') AS app, current_setting('plan_cache_mode') AS plans, pg_backend_pid() AS pid",
            )
          ).rows[0]!;
          const plans = i === 2 ? "force_generic_plan" : "auto";
          assert.deepEqual([row.st, row.idle, row.app, row.plans], ["1234ms", "1234ms", "tds-test-settings", plans]);
          pids.add(row.pid);
        }
        assert.equal(pids.size, 3, "three connections");
      } finally {
        for (const client of clients) client.release();
      }
      await store.close();
    });

    it("uses the defaults: a pool of 10 and a 5 s statement timeout", async () => {
      const store = await open((await freshSchema()).url);
      assert.deepEqual(store.settings, { poolSize: 10, statementTimeoutMs: 5000, applicationName: "typed-decision-service" });
      const row = (await store.pool.query<{ st: string }>("SELECT current_setting('statement_timeout') AS st")).rows[0];
      assert.equal(row?.st, "5s");
      await store.close();
    });

    it("the URL parameters pool_size and statement_timeout_ms override the options and are not passed to the server", async () => {
      const { url } = await freshSchema();
      const store = await open(`${url}&pool_size=2&statement_timeout_ms=777&application_name=tds-from-url`, {
        poolSize: 9,
        statementTimeoutMs: 100,
      });
      assert.equal(store.settings.poolSize, 2);
      assert.deepEqual([store.pool.options.max, store.bookkeepingPool.options.max], [1, 1]);
      const row = (
        await store.pool.query<{ st: string; app: string }>(
          "SELECT current_setting('statement_timeout') AS st, current_setting('application_name') AS app",
        )
      ).rows[0];
      assert.deepEqual([row?.st, row?.app], ["777ms", "tds-from-url"], "application_name in the URL is pg's own parameter and wins");
      await store.close();
    });

    it("shares pool_size between the bookkeeping pool (lanes + 1) and the reads (at least 2)", () => {
      assert.deepEqual(poolSizes(10, 1), { bookkeeping: 2, reads: 8 });
      assert.deepEqual(poolSizes(10, 4), { bookkeeping: 5, reads: 5 });
      assert.deepEqual(poolSizes(10, 8), { bookkeeping: 8, reads: 2 }, "the reads keep 2");
      assert.deepEqual(poolSizes(10), { bookkeeping: 8, reads: 2 }, "without lanes: as many as lanesFor allows");
      assert.deepEqual(poolSizes(3, 4), { bookkeeping: 1, reads: 2 });
      assert.deepEqual(poolSizes(2, 1), { bookkeeping: 1, reads: 1 });
      assert.deepEqual(poolSizes(1), { bookkeeping: 1, reads: 1 }, "one connection of each kind at least");
    });

    it("parses the adapter's URL parameters and refuses bad values without showing the password", () => {
      const s = connectionSettings(
        "postgresql://u:secret@db:5432/tds?sslmode=disable&pool_size=20&application_name=a%20b&statement_timeout_ms=3000",
      );
      assert.deepEqual(s, {
        connectionString: "postgresql://u:secret@db:5432/tds?sslmode=disable&application_name=a%20b",
        poolSize: 20,
        statementTimeoutMs: 3000,
        applicationName: "typed-decision-service",
      });
      assert.equal(connectionSettings("postgres://db/tds?pool_size=3").connectionString, "postgres://db/tds");
      assert.equal(connectionSettings("postgres://db/tds", { poolSize: 4 }).poolSize, 4);
      for (const bad of [
        "pool_size=0",
        "pool_size=abc",
        "pool_size=1.5",
        "pool_size=100000",
        "statement_timeout_ms=-1",
        "statement_timeout_ms=",
        "statement_timeout_ms=99999999999",
      ]) {
        assert.throws(
          () => connectionSettings(`postgres://u:secret@db/tds?${bad}`),
          (err: Error) =>
            /PostgreSQL (pool_size|statement_timeout_ms) URL parameter must be a whole number/.test(err.message) &&
            !err.message.includes("secret"),
          bad,
        );
      }
      assert.throws(() => connectionSettings("postgres://db/tds", { poolSize: 0 }), /pool size/);
      assert.throws(() => connectionSettings("postgres://db/tds", { statementTimeoutMs: 1.5 }), /statement timeout/);
      assert.throws(() => connectionSettings("mysql://db/tds"), /postgres:\/\//);
    });

    it("reads bigint columns as numbers and refuses one outside the safe integer range instead of rounding it", async () => {
      assert.equal(parseBigint("9007199254740991"), Number.MAX_SAFE_INTEGER);
      assert.equal(parseBigint("-42"), -42);
      assert.throws(() => parseBigint("9007199254740993"), RangeError);
      const { schema, url } = await freshSchema();
      const store = await open(url);
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
      await store.grantCredits({ orgId: "org_1", amountMicrousd: 1000, nowMs: T0 });
      assert.equal(typeof (await store.getBalance("org_1")).available, "number");
      await admin.query(`UPDATE ${schema}.org_balances SET available = available + 9007199254740000, granted = granted + 9007199254740000`);
      await assert.rejects(store.getBalance("org_1"), /outside the range of exact JavaScript numbers/);
      assertPoolIdle(store);
      assert.equal((await store.listLedger("org_1")).length, 1, "the store keeps working");
      await store.close();
    });

    it("a statement that waits longer than statement_timeout fails; its transaction is rolled back and the client reused", async () => {
      const { schema, url } = await freshSchema();
      const app = `tds-test-timeout-${RUN}`;
      const store = await open(url, { poolSize: 2, statementTimeoutMs: 300, applicationName: app });
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
      await store.grantCredits({ orgId: "org_1", amountMicrousd: 1000, nowMs: T0 });
      const locker = await rawClient(schemaUrl(schema));
      try {
        await locker.query("BEGIN");
        await locker.query("SELECT * FROM org_balances WHERE org_id = 'org_1' FOR UPDATE");
        // 57014: cancelled by its statement_timeout, while the lock was still held (it is released only below).
        await assert.rejects(admitOne(store, paidAdmission("r1", "org_1", 10)), (err: { code?: string }) => err.code === "57014");
        await locker.query("ROLLBACK");
      } finally {
        await locker.end();
      }
      assertPoolIdle(store);
      assert.equal(await store.getReservation("r1"), null);
      assert.deepEqual(await admitOne(store, paidAdmission("r1", "org_1", 10)), { kind: "admitted" });
      await checkBalanceInvariants(store, "org_1");
      const states = (
        await admin.query<{ state: string }>("SELECT state FROM pg_stat_activity WHERE application_name = $1", [app])
      ).rows.map((r) => r.state);
      assert.ok(states.length > 0 && states.every((state) => state === "idle"), `no transaction left open: ${states.join(", ")}`);
      await store.close();
    });

    it("after pg_terminate_backend of its idle connections the next call fails cleanly or succeeds, and the store keeps working", async () => {
      const { url } = await freshSchema();
      const app = `tds-test-terminate-idle-${RUN}`;
      const store = await open(url, { poolSize: 3, applicationName: app });
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
      await store.grantCredits({ orgId: "org_1", amountMicrousd: 1000, nowMs: T0 });
      // Three connections in the pool.
      await Promise.all([store.getBalance("org_1"), store.listLedger("org_1"), store.countOrganizations()]);
      const seen: string[] = [];
      for (let round = 0; round < 3; round++) {
        const terminated = await admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", [app]);
        assert.ok((terminated.rowCount ?? 0) >= 1);
        // Immediately, before the pool may have noticed.
        for (let i = 0; i < 3; i++) {
          try {
            await admitOne(store, paidAdmission(`r${round}_${i}`, "org_1", 1));
            seen.push("ok");
          } catch (err) {
            const code = (err as { code?: string }).code;
            seen.push(code ?? (err as Error).message);
            assert.ok(
              store.classifyFailure(err) !== "other" || /Connection terminated/.test((err as Error).message),
              `a connection failure, not another error: ${String(err)}`,
            );
          }
        }
        for (let i = 0; i < 5; i++) assert.equal(await store.countOrganizations(), 1, "the pool recovered");
        assertPoolIdle(store);
      }
      const balance = await checkBalanceInvariants(store, "org_1");
      const reservations = (
        await store.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM usage_records WHERE reservation_status = 'pending'")
      ).rows[0]!.n;
      assert.equal(balance.reserved, reservations, "each reservation is there completely or not at all");
      assert.ok(seen.includes("ok"));
      await store.close();
    });

    it("pg_terminate_backend in the middle of a transaction: the call fails with 57P01, nothing of it stays, the client is discarded", async () => {
      const { schema, url } = await freshSchema();
      const app = `tds-test-terminate-busy-${RUN}`;
      const store = await open(url, { poolSize: 2, applicationName: app });
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
      await store.grantCredits({ orgId: "org_1", amountMicrousd: 1000, nowMs: T0 });
      const before = await store.getBalance("org_1");
      const locker = await rawClient(schemaUrl(schema));
      try {
        await locker.query("BEGIN");
        await locker.query("SELECT * FROM org_balances WHERE org_id = 'org_1' FOR UPDATE");
        const call = admitOne(store, paidAdmission("r1", "org_1", 10));
        const failed = assert.rejects(call, (err) => {
          assert.equal((err as { code?: string }).code, "57P01");
          assert.equal(store.classifyFailure(err), "unavailable");
          return true;
        });
        const pid = await waitFor(
          "the reservation to wait for the row lock",
          async () =>
            (
              await admin.query<{ pid: number }>(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
                [app],
              )
            ).rows[0]?.pid,
        );
        await admin.query("SELECT pg_terminate_backend($1)", [pid]);
        await failed;
        await locker.query("ROLLBACK");
      } finally {
        await locker.end();
      }
      assertPoolIdle(store);
      assert.deepEqual(await store.getBalance("org_1"), before);
      assert.equal(await store.getReservation("r1"), null);
      assert.deepEqual(await admitOne(store, paidAdmission("r1", "org_1", 10)), { kind: "admitted" });
      await checkBalanceInvariants(store, "org_1");
      assertPoolIdle(store);
      await store.close();
    });

    it("a connection lost in the middle of a transaction (network, no server message): the call fails, the client is discarded, nothing of it stays", async () => {
      // A TCP proxy in front of the server, whose connections the test cuts.
      const sockets = new Set<Socket>();
      const target = new URL(BASE_URL);
      const proxy = createServer((downstream) => {
        const upstream = netConnect(Number(target.port || 5432), target.hostname);
        const cut = () => {
          downstream.destroy();
          upstream.destroy();
        };
        for (const socket of [downstream, upstream]) {
          sockets.add(socket);
          socket.on("error", cut);
          socket.on("close", () => {
            sockets.delete(socket);
            cut();
          });
        }
        downstream.pipe(upstream);
        upstream.pipe(downstream);
      });
      await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
      try {
        const { schema, url } = await freshSchema();
        const viaProxy = new URL(url);
        viaProxy.hostname = "127.0.0.1";
        viaProxy.port = String((proxy.address() as { port: number }).port);
        const app = `tds-test-network-${RUN}`;
        const store = await open(viaProxy.toString(), { poolSize: 2, applicationName: app });
        await store.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
        await store.grantCredits({ orgId: "org_1", amountMicrousd: 1000, nowMs: T0 });
        const before = await store.getBalance("org_1");
        const locker = await rawClient(schemaUrl(schema));
        try {
          await locker.query("BEGIN");
          await locker.query("SELECT * FROM org_balances WHERE org_id = 'org_1' FOR UPDATE");
          const call = admitOne(store, paidAdmission("r1", "org_1", 10));
          const failed = assert.rejects(call, /Connection terminated unexpectedly/);
          await waitFor("the reservation to wait for the row lock", async () =>
            (await admin.query("SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", [app])).rowCount
              ? true
              : undefined,
          );
          for (const socket of sockets) socket.destroy();
          await failed;
          assertPoolIdle(store);
          await locker.query("ROLLBACK");
        } finally {
          await locker.end();
        }
        // The server ends the orphaned session (and its transaction) once it notices the client is gone.
        await waitFor("the orphaned session to end", async () =>
          (await admin.query("SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle'", [app])).rowCount === 0
            ? true
            : undefined,
        );
        assert.deepEqual(await store.getBalance("org_1"), before);
        assert.equal(await store.getReservation("r1"), null);
        assert.deepEqual(await admitOne(store, paidAdmission("r1", "org_1", 10)), { kind: "admitted" });
        await checkBalanceInvariants(store, "org_1");
        assertPoolIdle(store);
        await store.close();
      } finally {
        for (const socket of sockets) socket.destroy();
        await new Promise((resolve) => proxy.close(resolve));
      }
    });

    it("a server that refuses connections gives ECONNREFUSED, which the adapter reads as storage unavailable", async () => {
      const url = new URL(BASE_URL);
      url.port = "1";
      await assert.rejects(openPostgresStore(url.toString()), (err) => {
        assert.equal((err as { code?: string }).code, "ECONNREFUSED");
        assert.equal(postgresFailureKind(err), "unavailable");
        return true;
      });
    });
  });

  describe("PostgreSQL store: migrations", () => {
    it("records each migration once; reopening applies nothing", async () => {
      const { schema, url } = await freshSchema();
      const first = await open(url);
      const files = readPostgresMigrations().map((m) => ({ version: m.version, name: m.name }));
      assert.deepEqual(first.migrations.applied, files);
      assert.deepEqual(first.migrations.current, files);
      await first.close();
      const second = await open(url);
      assert.deepEqual(second.migrations.applied, []);
      assert.deepEqual(second.migrations.current, files);
      await second.close();
      const rows = (
        await admin.query<{ version: number; name: string; applied_at_ms: string }>(
          `SELECT version, name, applied_at_ms FROM ${schema}.schema_migrations ORDER BY version`,
        )
      ).rows;
      assert.deepEqual(
        rows.map((r) => ({ version: r.version, name: r.name })),
        files,
      );
      assert.ok(rows.every((r) => Math.abs(Number(r.applied_at_ms) - Date.now()) < 60_000));
      assert.equal(rows[0]?.name, "initial");
    });

    it("the shipped folder mirrors the SQLite one: same versions and names, consecutive from 001_initial", () => {
      const postgres = readPostgresMigrations();
      assert.equal(postgres[0]?.file, "001_initial.sql");
      assert.deepEqual(
        postgres.map((m) => m.version),
        postgres.map((_, i) => i + 1),
      );
      const sqliteDir = join(POSTGRES_MIGRATIONS_DIR, "..", "sqlite");
      assert.deepEqual(
        postgres.map((m) => m.file),
        readdirSync(sqliteDir)
          .filter((f) => f.endsWith(".sql"))
          .sort(),
      );
    });

    it("010 moves reservations onto their usage records: a pending one stays pending with its request in flight, the books stay exact", async () => {
      const dir = mkdtempSync(join(tmpdir(), "tds-pg-migrations-"));
      tempDirs.push(dir);
      for (const m of readPostgresMigrations().filter((m) => m.version < 10))
        copyFileSync(join(POSTGRES_MIGRATIONS_DIR, m.file), join(dir, m.file));
      const { schema, url } = await freshSchema();
      await (await open(url, { migrationsDir: dir })).close();
      const client = await rawClient(schemaUrl(schema));
      try {
        await client.query(rowsBefore010(String));
      } finally {
        await client.end();
      }
      const store = await open(url);
      assert.deepEqual(store.migrations.applied[0], { version: 10, name: "reservations_on_usage_records" });
      await checkRowsAfter010(store);
      assert.equal((await store.pool.query("SELECT to_regclass('reservations') AS t")).rows[0].t, null, "the table is gone");
      await store.close();
    });

    it("012 allows source 'batch' in usage_records: rows, columns, other constraints and indexes as before", async () => {
      const dir = mkdtempSync(join(tmpdir(), "tds-pg-migrations-"));
      tempDirs.push(dir);
      for (const m of readPostgresMigrations().filter((m) => m.version < 12))
        copyFileSync(join(POSTGRES_MIGRATIONS_DIR, m.file), join(dir, m.file));
      const { schema, url } = await freshSchema();
      await (await open(url, { migrationsDir: dir })).close();
      const shape = async (client: pg.Client) => ({
        rows: (await client.query("SELECT * FROM usage_records ORDER BY request_id")).rows,
        columns: (
          await client.query(
            "SELECT column_name, data_type, collation_name, is_nullable, column_default FROM information_schema.columns " +
              "WHERE table_schema = current_schema() AND table_name = 'usage_records' ORDER BY ordinal_position",
          )
        ).rows,
        constraints: (
          await client.query(
            "SELECT conname, pg_get_constraintdef(oid) AS def, convalidated FROM pg_constraint " +
              "WHERE conrelid = 'usage_records'::regclass ORDER BY conname",
          )
        ).rows,
        indexes: (
          await client.query(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'usage_records' ORDER BY indexname",
          )
        ).rows,
      });
      const client = await rawClient(schemaUrl(schema));
      try {
        await client.query(usageRowsBefore012(String));
        const before = await shape(client);
        await assert.rejects(client.query(usageRowWithSource("req_batch", "batch", String)), /usage_records_source_check/);
        assert.equal(before.rows.length, 3);
        assert.deepEqual(
          before.indexes.map((i) => i.indexname),
          ["usage_records_by_org_outcome_time", "usage_records_by_org_time", "usage_records_in_flight", "usage_records_pkey"],
        );
        copyFileSync(join(POSTGRES_MIGRATIONS_DIR, "012_usage_source_batch.sql"), join(dir, "012_usage_source_batch.sql"));
        const at012 = await open(url, { migrationsDir: dir });
        assert.deepEqual(at012.migrations.applied, [{ version: 12, name: "usage_source_batch" }]);
        await at012.close();
        const sourceCheck = (c: { conname: string }) => c.conname === "usage_records_source_check";
        const after = await shape(client);
        assert.deepEqual(
          { ...after, constraints: after.constraints.filter((c) => !sourceCheck(c)) },
          { ...before, constraints: before.constraints.filter((c) => !sourceCheck(c)) },
        );
        assert.deepEqual(after.constraints.find(sourceCheck), {
          conname: "usage_records_source_check",
          def: "CHECK ((source = ANY (ARRAY['api'::text, 'playground'::text, 'batch'::text])))",
          convalidated: true,
        });
        const store = await open(url);
        assert.deepEqual(store.migrations.applied, [{ version: 13, name: "key_controls" }]);
        await client.query(usageRowWithSource("req_batch", "batch", String));
        assert.equal((await store.getUsage("org_1", "req_batch"))?.source, "batch");
        await assert.rejects(client.query(usageRowWithSource("req_nope", "nope", String)), /usage_records_source_check/);
        assert.equal(await store.getUsage("org_1", "req_nope"), null);
        assert.deepEqual(
          (await store.listUsage("org_1", { limit: 10 })).records.map((r) => [r.requestId, r.source]),
          SOURCES_AFTER_012,
        );
        await store.close();
      } finally {
        await client.end();
      }
    });

    it("013 adds the key settings as NULL to the keys there are, and allows 'key.updated' and 'key.rotated' in admin_audit: rows, ids, columns, other constraints and indexes as before", async () => {
      const dir = mkdtempSync(join(tmpdir(), "tds-pg-migrations-"));
      tempDirs.push(dir);
      for (const m of readPostgresMigrations().filter((m) => m.version < 13))
        copyFileSync(join(POSTGRES_MIGRATIONS_DIR, m.file), join(dir, m.file));
      const { schema, url } = await freshSchema();
      const at012 = await open(url, { migrationsDir: dir });
      assert.deepEqual(at012.migrations.current.at(-1), { version: 12, name: "usage_source_batch" });
      await at012.close();
      const catalog = async (client: pg.Client, table: string) => ({
        columns: (
          await client.query(
            "SELECT column_name, data_type, collation_name, is_nullable, column_default, is_identity, identity_generation " +
              "FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
            [table],
          )
        ).rows,
        constraints: (
          await client.query(
            "SELECT conname, pg_get_constraintdef(oid) AS def, convalidated FROM pg_constraint WHERE conrelid = $1::regclass ORDER BY conname",
            [table],
          )
        ).rows,
        indexes: (
          await client.query(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = $1 ORDER BY indexname",
            [table],
          )
        ).rows,
      });
      const audit = async (client: pg.Client) => ({
        rows: (await client.query("SELECT * FROM admin_audit ORDER BY id")).rows,
        ...(await catalog(client, "admin_audit")),
        next: (await client.query(`SELECT last_value, is_called FROM ${schema}.admin_audit_id_seq`)).rows,
      });
      const keys = async (client: pg.Client) => ({
        rows: (await client.query("SELECT * FROM api_keys ORDER BY id")).rows as Record<string, unknown>[],
        ...(await catalog(client, "api_keys")),
      });
      const client = await rawClient(schemaUrl(schema));
      try {
        await client.query(keyRowsBefore013(String));
        for (const action of ["key.updated", "key.rotated"])
          await assert.rejects(client.query(auditRowWithAction(action)), /admin_audit_action_check/, action);
        const auditBefore = await audit(client);
        const keysBefore = await keys(client);
        assert.deepEqual(
          auditBefore.rows.map((r) => Number(r.id)),
          [1, 2, 3, 4],
        );
        // The refused inserts took ids 5 and 6 from the sequence.
        assert.deepEqual(auditBefore.next, [{ last_value: "6", is_called: true }]);
        assert.equal(keysBefore.rows.length, 2);

        const store = await open(url);
        assert.deepEqual(store.migrations.applied, [{ version: 13, name: "key_controls" }]);
        const actionCheck = (c: { conname: string }) => c.conname === "admin_audit_action_check";
        const auditAfter = await audit(client);
        assert.deepEqual(
          { ...auditAfter, constraints: auditAfter.constraints.filter((c) => !actionCheck(c)) },
          { ...auditBefore, constraints: auditBefore.constraints.filter((c) => !actionCheck(c)) },
        );
        assert.deepEqual(auditAfter.constraints.find(actionCheck), {
          conname: "admin_audit_action_check",
          def:
            "CHECK ((action = ANY (ARRAY['organization.created'::text, 'organization.paused'::text, 'organization.resumed'::text, " +
            "'key.created'::text, 'key.revoked'::text, 'key.updated'::text, 'key.rotated'::text, 'credits.granted'::text])))",
          convalidated: true,
        });
        const keysAfter = await keys(client);
        assert.deepEqual(
          keysAfter.rows,
          keysBefore.rows.map((k) => ({
            ...k,
            expires_at_ms: null,
            models: null,
            requests_per_minute: null,
            budget_microusd: null,
            budget_period: null,
            replaced_by: null,
            retires_at_ms: null,
            lineage_id: null,
            last_used_at_ms: null,
          })),
        );
        assert.deepEqual(
          keysAfter.columns.slice(0, keysBefore.columns.length),
          keysBefore.columns,
          "the columns there were come first, unchanged",
        );
        assert.deepEqual(
          keysAfter.columns.slice(keysBefore.columns.length).map((c) => [c.column_name, c.is_nullable, c.column_default]),
          [
            ["expires_at_ms", "YES", null],
            ["models", "YES", null],
            ["requests_per_minute", "YES", null],
            ["budget_microusd", "YES", null],
            ["budget_period", "YES", null],
            ["replaced_by", "YES", null],
            ["retires_at_ms", "YES", null],
            ["lineage_id", "YES", null],
            ["last_used_at_ms", "YES", null],
          ],
        );
        for (const c of keysBefore.constraints)
          assert.ok(
            keysAfter.constraints.some((a) => JSON.stringify(a) === JSON.stringify(c)),
            c.conname,
          );
        assert.deepEqual(keysAfter.indexes, keysBefore.indexes);
        assert.deepEqual((await client.query("SELECT * FROM key_spend")).rows, []);
        assert.deepEqual(
          (await catalog(client, "usage_records")).columns
            .filter((c) => String(c.column_name).startsWith("key_budget_"))
            .map((c) => [c.column_name, c.data_type, c.collation_name, c.is_nullable, c.column_default]),
          [
            ["key_budget_key_id", "text", "C", "YES", null],
            ["key_budget_period", "text", "C", "YES", null],
          ],
        );

        await checkKeysAfter013(store, 7);
        await client.query(auditRowWithAction("key.rotated"));
        await assert.rejects(client.query(auditRowWithAction("key.nope")), /admin_audit_action_check/);
        assert.deepEqual((await client.query("SELECT id::int, action FROM admin_audit WHERE id > 4 ORDER BY id")).rows, [
          { id: 7, action: "key.updated" },
          { id: 8, action: "key.rotated" },
        ]);
        await store.close();
      } finally {
        await client.end();
      }
    });

    it("003 keeps the rows of a database made by 001 and 002: usage records become final at their creation time", async () => {
      const dir = mkdtempSync(join(tmpdir(), "tds-pg-migrations-"));
      tempDirs.push(dir);
      for (const file of ["001_initial.sql", "002_credits_quotas_idempotency.sql"])
        copyFileSync(join(POSTGRES_MIGRATIONS_DIR, file), join(dir, file));
      const { schema, url } = await freshSchema();
      const old = await open(url, { migrationsDir: dir });
      assert.deepEqual(
        old.migrations.applied.map((m) => m.version),
        [1, 2],
      );
      await old.close();
      const client = await rawClient(schemaUrl(schema));
      try {
        await client.query(`
          INSERT INTO organizations (id, name, paused, created_at_ms) VALUES ('org_1', 'Acme', false, 1);
          INSERT INTO org_balances (org_id, available, reserved, spent, granted) VALUES ('org_1', 700, 250, 50, 1000);
          INSERT INTO reservations (id, org_id, request_id, amount_microusd, status, cost_microusd, created_at_ms, expires_at_ms, resolved_at_ms) VALUES
            ('res_old', 'org_1', 'req_old', 100, 'settled', 50, ${T0}, ${T0 + HOUR}, ${T0 + 1000}),
            ('res_legacy', 'org_1', 'req_legacy', 250, 'pending', NULL, ${T0}, ${T0 + 10}, NULL);
          INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note) VALUES
            ('org_1', 'grant', NULL, 1000, 0, 0, 1000, 1, 'welcome'),
            ('org_1', 'reserve', 'res_old', -100, 100, 0, 0, ${T0}, NULL),
            ('org_1', 'reserve', 'res_legacy', -250, 250, 0, 0, ${T0}, NULL),
            ('org_1', 'settle', 'res_old', 50, -100, 50, 0, ${T0 + 1000}, NULL);
          INSERT INTO usage_records (request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens, output_tokens,
            cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation) VALUES
            ('req_old', 'org_1', 'k1', ${T0 + 5}, 'api', 'jev-1', 'paid', 'succeeded', 200, 120, 7, 50, 12.5, 14.25, NULL, true),
            ('req_err', 'org_1', 'k1', ${T0 + 7}, 'playground', 'jev-1', 'preview', 'model_error', 502, 0, 0, 0, NULL, 3.5, 'model timed out', false);
          INSERT INTO idempotency_keys (org_id, key, request_hash, request_id, state, response_status, response_body, response_request_id, lock_until_ms, expires_at_ms) VALUES
            ('org_1', 'k-old', 'h', 'req_old', 'completed', 200, '{"ok":true}', 'req_old', ${T0 + 60_000}, ${T0 + 24 * HOUR}),
            ('org_1', 'k-running', 'h', 'req_legacy', 'in_progress', NULL, NULL, NULL, ${T0 + 60_000}, ${T0 + 24 * HOUR});
          INSERT INTO preview_counters (scope, day, count) VALUES ('org_1', '2026-01-01', 3), ('*', '2026-01-01', 3);
        `);
      } finally {
        await client.end();
      }
      const store = await open(url);
      assert.deepEqual(store.migrations.applied[0], { version: 3, name: "two_step_bookkeeping" });
      // Records written before 005 name no deployment and count no attempts.
      const before005 = { deployment: null, attempts: 0 };
      const success = usageRecord({
        ...before005,
        requestId: "req_old",
        orgId: "org_1",
        keyId: "k1",
        createdAtMs: T0 + 5,
        completedAtMs: T0 + 5,
        costMicrousd: 50,
        overReservation: true,
      });
      const failure = usageRecord({
        ...before005,
        requestId: "req_err",
        orgId: "org_1",
        keyId: "k1",
        createdAtMs: T0 + 7,
        completedAtMs: T0 + 7,
        source: "playground",
        mode: "preview",
        outcome: "model_error",
        inputTokens: 0,
        outputTokens: 0,
        latencyMs: null,
        gatewayLatencyMs: 3.5,
        errorDetail: "model timed out",
      });
      assert.deepEqual((await store.listUsage("org_1", { limit: 10 })).records, [failure, success]);
      assert.deepEqual(await store.previewUsage("org_1", "2026-01-01"), { org: 3, global: 3 });
      // The old design wrote no record for a request in flight: its pending reservation was expired by migration 010.
      assert.deepEqual(await checkBalanceInvariants(store, "org_1"), { available: 950, reserved: 0, spent: 50, granted: 1000 });
      assert.equal((await store.getReservation("req_old"))?.costMicrousd, 50);
      const idem = (key: string) => ({ key, requestHash: "h", lockUntilMs: T0 + 200, expiresAtMs: T0 + 24 * HOUR });
      assert.deepEqual(
        await store.commitBatch({
          admissions: [
            admission({ requestId: "req_new1", orgId: "org_1", nowMs: T0 + 100, idempotency: idem("k-old") }),
            admission({ requestId: "req_new2", orgId: "org_1", nowMs: T0 + 100, idempotency: idem("k-running") }),
          ],
          completions: [],
        }),
        {
          admissions: [
            { kind: "replay", response: { status: 200, body: '{"ok":true}', requestId: "req_old" } },
            { kind: "idempotency_in_progress" },
          ],
          completions: [],
        },
      );
      assert.deepEqual(await store.sweep({ nowMs: T0 + 10, inFlightBeforeMs: T0 + 10, limit: 10 }), { abandoned: 0 });
      assert.deepEqual(await checkBalanceInvariants(store, "org_1"), { available: 950, reserved: 0, spent: 50, granted: 1000 });
      await store.close();
    });

    it("applies a slow migration exactly once when 4 stores open the same fresh database at once", async () => {
      const dir = mkdtempSync(join(tmpdir(), "tds-pg-migrations-"));
      tempDirs.push(dir);
      for (const file of readdirSync(POSTGRES_MIGRATIONS_DIR)) copyFileSync(join(POSTGRES_MIGRATIONS_DIR, file), join(dir, file));
      // Not idempotent and slow: a second run would fail with "relation slow already exists".
      writeFileSync(
        join(dir, "900_slow.sql"),
        "CREATE TABLE slow AS SELECT g AS x FROM generate_series(1, 100000) AS g;\nSELECT pg_sleep(0.3);\n",
      );
      const { database, url } = await freshDatabase();
      const stores = await Promise.all(Array.from({ length: 4 }, () => open(url, { migrationsDir: dir, poolSize: 2 })));
      const all = [...readPostgresMigrations().map((m) => ({ version: m.version, name: m.name })), { version: 900, name: "slow" }];
      const appliedBy = stores.map((s) => s.migrations.applied.length);
      assert.deepEqual(
        [...appliedBy].sort(),
        [0, 0, 0, all.length],
        `one store applied them all, the others none: ${appliedBy.join(", ")}`,
      );
      for (const s of stores) assert.deepEqual(s.migrations.current, all);
      const check = await rawClient(url);
      try {
        const versions = (await check.query<{ version: number }>("SELECT version FROM schema_migrations ORDER BY version")).rows.map(
          (r) => r.version,
        );
        assert.deepEqual(
          versions,
          all.map((m) => m.version),
        );
        assert.deepEqual((await check.query("SELECT count(*)::int AS n FROM slow")).rows[0], { n: 100000 });
        const locks = await check.query(
          "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = $1)",
          [database],
        );
        assert.equal(locks.rowCount, 0, "the migration lock was released");
      } finally {
        await check.end();
      }
      // All four work on the one schema.
      await stores[0]!.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
      for (const s of stores) assert.equal((await s.findOrganization("Acme"))?.id, "org_1");
      await Promise.all(stores.map((s) => s.close()));
    });

    it("a failing migration names its file, leaves no trace of itself, keeps the ones before it and releases the lock", async () => {
      const dir = mkdtempSync(join(tmpdir(), "tds-pg-migrations-"));
      tempDirs.push(dir);
      writeFileSync(join(dir, "001_ok.sql"), "CREATE TABLE a (x integer);");
      writeFileSync(join(dir, "002_broken.sql"), "CREATE TABLE b (x integer);\nINSERT INTO nowhere VALUES (1);");
      const { database, url } = await freshDatabase();
      await assert.rejects(
        openPostgresStore(url, { migrationsDir: dir }),
        /Migration 002_broken\.sql failed: relation "nowhere" does not exist/,
      );
      const check = await rawClient(url);
      try {
        const tables = (
          await check.query<{ t: string }>("SELECT tablename AS t FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
        ).rows.map((r) => r.t);
        assert.deepEqual(tables, ["a", "schema_migrations"]);
        assert.deepEqual((await check.query("SELECT version, name FROM schema_migrations")).rows, [{ version: 1, name: "ok" }]);
        const locks = await check.query(
          "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = $1)",
          [database],
        );
        assert.equal(locks.rowCount, 0, "the migration lock was released");
        const idle = await check.query("SELECT 1 FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", [database]);
        assert.equal(idle.rowCount, 0, "the migration connection was closed");
      } finally {
        await check.end();
      }
      // Fixed, the next start applies the rest.
      writeFileSync(join(dir, "002_broken.sql"), "CREATE TABLE b (x integer);");
      const store = await open(url, { migrationsDir: dir });
      assert.deepEqual(store.migrations.applied, [{ version: 2, name: "broken" }]);
      await store.close();
    });

    it("refuses a database that has a migration this version does not know", async () => {
      const { schema, url } = await freshSchema();
      await (await open(url)).close();
      await admin.query(`INSERT INTO ${schema}.schema_migrations (version, name, applied_at_ms) VALUES (999, 'from_the_future', 0)`);
      await assert.rejects(
        openPostgresStore(url),
        /migrations this version of the service does not know: 999 \(from_the_future\)\. It was used by a newer version\./,
      );
    });

    it("takes the migration lock of the database: a store opening while another instance holds it waits", async () => {
      const { url } = await freshDatabase();
      const holder = await rawClient(url);
      try {
        await holder.query("SELECT pg_advisory_lock($1)", [MIGRATION_LOCK_KEY.toString()]);
        let done = false;
        const opening = open(url).then((s) => {
          done = true;
          return s;
        });
        await new Promise((r) => setTimeout(r, 300));
        assert.equal(done, false, "still waiting for the lock");
        await holder.query("SELECT pg_advisory_unlock($1)", [MIGRATION_LOCK_KEY.toString()]);
        const store = await opening;
        assert.equal(store.migrations.applied.length, MIGRATION_COUNT);
        await store.close();
      } finally {
        await holder.end();
      }
    });
  });

  describe("PostgreSQL store: concurrent instances", () => {
    it("reservations from several pools on one balance never overdraw it: exactly floor(balance / amount) succeed", async () => {
      const { url } = await freshDatabase();
      const stores = await Promise.all(Array.from({ length: 8 }, () => open(url, { poolSize: 3 })));
      await stores[0]!.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
      await stores[0]!.grantCredits({ orgId: "org_1", amountMicrousd: 10_000, nowMs: T0 });
      // 8 stores × 2 workers × 5 batches of 25 admissions of 7 for 10,000: exactly floor(10000 / 7) = 1428 can succeed.
      const perStore = await Promise.all(
        stores.map(async (store, s) => {
          let admitted = 0;
          await Promise.all(
            Array.from({ length: 2 }, async (_, w) => {
              for (let b = 0; b < 5; b++) {
                const batch = Array.from({ length: 25 }, (_, i) => paidAdmission(`s${s}_w${w}_b${b}_${i}`, "org_1", 7));
                for (const result of (await store.commitBatch({ admissions: batch, completions: [] })).admissions) {
                  if (result.kind === "admitted") admitted++;
                  else
                    assert.ok(
                      result.kind === "insufficient_credits" && result.availableMicrousd >= 0 && result.availableMicrousd < 7,
                      JSON.stringify(result),
                    );
                }
              }
            }),
          );
          return admitted;
        }),
      );
      assert.equal(
        perStore.reduce((a, b) => a + b, 0),
        1428,
        `admitted per store: ${perStore.join(", ")}`,
      );
      assert.ok(perStore.filter((n) => n > 0).length >= 2, `the stores overlapped: ${perStore.join(", ")}`);
      assert.deepEqual(await checkBalanceInvariants(stores[1]!, "org_1"), {
        available: 10_000 - 1428 * 7,
        reserved: 1428 * 7,
        spent: 0,
        granted: 10_000,
      });
      const pending = (
        await stores[2]!.pool.query(
          "SELECT count(*)::int AS n, sum(reserved_microusd)::bigint AS total FROM usage_records WHERE reservation_status = 'pending'",
        )
      ).rows[0];
      assert.deepEqual(pending, { n: 1428, total: 9996 });
      assert.deepEqual((await stores[3]!.pool.query("SELECT outcome, count(*)::int AS n FROM usage_records GROUP BY outcome")).rows, [
        { outcome: "in_flight", n: 1428 },
      ]);
      for (const s of stores) assertPoolIdle(s);
      await Promise.all(stores.map((s) => s.close()));
    });

    it("two sweeps at once complete each abandoned request and expire its reservation exactly once", async () => {
      const { url } = await freshDatabase();
      const [a, b] = await Promise.all([open(url, { poolSize: 3 }), open(url, { poolSize: 3 })]);
      const orgIds = ["org_1", "org_2", "org_3"];
      for (const orgId of orgIds) {
        await a.createOrganization({ id: orgId, name: orgId, nowMs: T0 });
        await a.grantCredits({ orgId, amountMicrousd: 1_000_000, nowMs: T0 });
      }
      const COUNT = 300;
      const requests = Array.from({ length: COUNT }, (_, i) => ({ id: `r${i}`, orgId: orgIds[i % 3]! }));
      for (let i = 0; i < COUNT; i += 50) {
        const batch = requests
          .slice(i, i + 50)
          .map((r, j) => paidAdmission(r.id, r.orgId, 100 + ((i + j) % 7), T0, T0 + 10 + ((i + j) % 5)));
        assert.ok((await a.commitBatch({ admissions: batch, completions: [] })).admissions.every((x) => x.kind === "admitted"));
      }
      const sweep = async (store: PostgresStore) => {
        let abandoned = 0;
        for (;;) {
          const pass = await store.sweep({ nowMs: T0 + 100, inFlightBeforeMs: T0 + 100, limit: 15 });
          if (pass.abandoned === 0) return abandoned;
          abandoned += pass.abandoned;
        }
      };
      const passes = await Promise.all([sweep(a), sweep(b), sweep(a), sweep(b)]);
      assert.equal(
        passes.reduce((sum, n) => sum + n, 0),
        COUNT,
        JSON.stringify(passes),
      );
      const perReservation = (
        await a.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM ledger_entries WHERE kind = 'expire' GROUP BY reservation_id")
      ).rows;
      assert.equal(perReservation.length, COUNT);
      assert.ok(
        perReservation.every((r) => r.n === 1),
        "one expire entry per reservation",
      );
      assert.equal((await a.pool.query("SELECT 1 FROM usage_records WHERE reservation_status <> 'expired'")).rowCount, 0);
      assert.deepEqual(
        (await a.pool.query("SELECT outcome, count(*)::int AS n FROM usage_records GROUP BY outcome ORDER BY outcome")).rows,
        [{ outcome: "gateway_error", n: COUNT }],
      );
      for (const orgId of orgIds) {
        assert.deepEqual(await checkBalanceInvariants(b, orgId), { available: 1_000_000, reserved: 0, spent: 0, granted: 1_000_000 });
      }
      assertPoolIdle(a);
      assertPoolIdle(b);
      await Promise.all([a.close(), b.close()]);
    });

    it("the sweep skips rows another transaction holds instead of waiting for them", async () => {
      const { schema, url } = await freshSchema();
      const store = await open(url);
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
      await store.grantCredits({ orgId: "org_1", amountMicrousd: 10_000, nowMs: T0 });
      const ids = (prefix: string) => Array.from({ length: 10 }, (_, i) => `${prefix}${i}`);
      await store.commitBatch({
        admissions: ids("q").map((id) => paidAdmission(id, "org_1", 100, T0, T0 + 10)),
        completions: [],
      });
      const locker = await rawClient(schemaUrl(schema));
      try {
        await locker.query("BEGIN");
        // As a completion of q2 and q7 does: their usage rows, which hold their reservations.
        await locker.query("SELECT 1 FROM usage_records WHERE request_id IN ('q2', 'q7') FOR UPDATE");
        // Answered while the rows are still locked (they are released only below): it did not wait for them.
        assert.deepEqual(await store.sweep({ nowMs: T0 + 10, inFlightBeforeMs: T0 + 10, limit: 100 }), { abandoned: 8 });
        assert.equal((await store.getReservation("q7"))?.status, "pending");
        await locker.query("COMMIT");
      } finally {
        await locker.end();
      }
      assert.deepEqual(await store.sweep({ nowMs: T0 + 10, inFlightBeforeMs: T0 + 10, limit: 100 }), { abandoned: 2 });
      assert.equal((await store.getUsage("org_1", "q7"))?.outcome, "gateway_error");
      assert.equal((await store.getReservation("q7"))?.status, "expired");
      assert.deepEqual(await checkBalanceInvariants(store, "org_1"), { available: 10_000, reserved: 0, spent: 0, granted: 10_000 });
      await store.close();
    });

    it("completions racing the sweeps of two instances resolve each reservation exactly once", async () => {
      const { url } = await freshDatabase();
      const [a, b] = await Promise.all([open(url, { poolSize: 4 }), open(url, { poolSize: 4 })]);
      await a.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
      await a.createOrganization({ id: "org_2", name: "Beta", nowMs: T0 });
      await a.grantCredits({ orgId: "org_1", amountMicrousd: 1_000_000, nowMs: T0 });
      await a.grantCredits({ orgId: "org_2", amountMicrousd: 1_000_000, nowMs: T0 });
      const COUNT = 120;
      const orgOf = (i: number) => `org_${(i % 2) + 1}`;
      await a.commitBatch({
        admissions: Array.from({ length: COUNT }, (_, i) => paidAdmission(`q${i}`, orgOf(i), 500, T0, T0 + 10)),
        completions: [],
      });
      const complete = async (store: PostgresStore, from: number) => {
        const results: CompleteResult[] = [];
        for (let i = from; i < COUNT; i += 20) {
          const batch = Array.from({ length: 10 }, (_, j) => i + 2 * j).map((k) =>
            completion({ requestId: `q${k}`, orgId: orgOf(k), nowMs: T0 + 5, costMicrousd: 200, reserved: true }),
          );
          results.push(...(await store.commitBatch({ admissions: [], completions: batch })).completions);
        }
        return results;
      };
      const sweep = async (store: PostgresStore) => {
        let abandoned = 0;
        for (let round = 0; round < 30; round++) {
          const pass = await store.sweep({ nowMs: T0 + 10, inFlightBeforeMs: T0 + 10, limit: 3 });
          abandoned += pass.abandoned;
        }
        return abandoned;
      };
      const [doneA, doneB, sweptA, sweptB] = await Promise.all([complete(a, 0), complete(b, 1), sweep(b), sweep(a)]);
      const results = [...doneA, ...doneB];
      assert.equal(results.length, COUNT);
      const completed = results.filter((r) => r.kind === "completed").length;
      assert.equal(results.filter((r) => r.kind === "not_in_flight").length, COUNT - completed);
      const leftover = await a.sweep({ nowMs: T0 + 10, inFlightBeforeMs: T0 + 10, limit: 1000 });
      assert.deepEqual(leftover, { abandoned: 0 }, "every request was completed or swept");
      assert.equal(completed + sweptA + sweptB, COUNT, `completed ${completed}, swept ${sweptA} + ${sweptB}`);
      const entries = (
        await a.pool.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM ledger_entries WHERE kind IN ('settle', 'release', 'expire') GROUP BY reservation_id",
        )
      ).rows;
      assert.equal(entries.length, COUNT);
      assert.ok(
        entries.every((r) => r.n === 1),
        "each reservation resolved once",
      );
      const outcomes = (
        await a.pool.query<{ outcome: string; n: number }>("SELECT outcome, count(*)::int AS n FROM usage_records GROUP BY outcome")
      ).rows;
      assert.deepEqual(
        Object.fromEntries(outcomes.map((r) => [r.outcome, r.n])),
        Object.fromEntries(Object.entries({ succeeded: completed, gateway_error: COUNT - completed }).filter(([, n]) => n > 0)),
      );
      let spent = 0;
      for (const orgId of ["org_1", "org_2"]) {
        const balance = await checkBalanceInvariants(a, orgId);
        assert.equal(balance.reserved, 0);
        spent += balance.spent;
      }
      assert.equal(spent, 200 * completed);
      await Promise.all([a.close(), b.close()]);
    });

    it("concurrent preview requests from several instances never exceed the organization's or the service's limit", async () => {
      const { url } = await freshSchema();
      const stores = await Promise.all(Array.from({ length: 8 }, () => open(url, { poolSize: 2 })));
      const DAY = "2026-01-01";
      const preview = (requestId: string, orgId: string, orgLimit: number, globalLimit: number, day = DAY) =>
        admission({ requestId, orgId, quota: { day, orgLimit, globalLimit } });
      // 8 instances × a batch of 25: 3 organizations, 30 allowed each, 50 for the service: exactly 50 are admitted.
      const results = (
        await Promise.all(
          stores.map(
            async (store, s) =>
              (
                await store.commitBatch({
                  admissions: Array.from({ length: 25 }, (_, i) => preview(`p${s}_${i}`, `org_${(s + i) % 3}`, 30, 50)),
                  completions: [],
                })
              ).admissions,
          ),
        )
      ).flat();
      assert.equal(results.filter((r) => r.kind === "admitted").length, 50);
      assert.equal(results.filter((r) => r.kind === "quota_exhausted" && r.scope === "global").length, 150);
      const usage = await Promise.all([0, 1, 2].map((i) => stores[0]!.previewUsage(`org_${i}`, DAY)));
      assert.ok(
        usage.every((u) => u.global === 50 && u.org <= 30),
        JSON.stringify(usage),
      );
      assert.equal(
        usage.reduce((sum, u) => sum + u.org, 0),
        50,
      );
      assert.deepEqual(
        (await stores[1]!.pool.query("SELECT count(*)::int AS n FROM usage_records")).rows,
        [{ n: 50 }],
        "a usage record per counted request",
      );
      // And an organization limit under contention: 8 instances × 5 requests, 7 allowed.
      const one = (
        await Promise.all(
          stores.map(
            async (store, s) =>
              (
                await store.commitBatch({
                  admissions: Array.from({ length: 5 }, (_, i) => preview(`x${s}_${i}`, "org_x", 7, 1000, "2026-01-02")),
                  completions: [],
                })
              ).admissions,
          ),
        )
      ).flat();
      assert.equal(one.filter((r) => r.kind === "admitted").length, 7);
      assert.deepEqual(await stores[2]!.previewUsage("org_x", "2026-01-02"), { org: 7, global: 7 });
      await Promise.all(stores.map((s) => s.close()));
    });

    it("the first grants to an organization from several instances at once all count", async () => {
      const { url } = await freshSchema();
      const stores = await Promise.all(Array.from({ length: 4 }, () => open(url, { poolSize: 2 })));
      const orgIds = Array.from({ length: 6 }, (_, i) => `org_${i}`);
      for (const id of orgIds) await stores[0]!.createOrganization({ id, name: id, nowMs: T0 });
      const grants = await Promise.allSettled(
        orgIds.flatMap((orgId) =>
          Array.from({ length: 8 }, (_, i) => stores[i % 4]!.grantCredits({ orgId, amountMicrousd: 10, nowMs: T0 })),
        ),
      );
      assert.deepEqual(
        grants.filter((g) => g.status === "rejected").map((g) => String(g.reason)),
        [],
      );
      for (const orgId of orgIds)
        assert.deepEqual(await checkBalanceInvariants(stores[0]!, orgId), { available: 80, reserved: 0, spent: 0, granted: 80 });
      await Promise.all(stores.map((s) => s.close()));
    });

    it("runs its transactions at READ COMMITTED even when the server's default isolation is serializable", async () => {
      const { schema } = await freshSchema();
      const url = `${BASE_URL}${BASE_URL.includes("?") ? "&" : "?"}options=${encodeURIComponent(`-c search_path=${schema} -c default_transaction_isolation=serializable`)}`;
      const store = await open(url, { poolSize: 6 });
      assert.equal(
        (await store.pool.query<{ i: string }>("SELECT current_setting('default_transaction_isolation') AS i")).rows[0]?.i,
        "serializable",
      );
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
      await store.grantCredits({ orgId: "org_1", amountMicrousd: 100, nowMs: T0 });
      // Concurrent writers of one balance row: under SERIALIZABLE most would fail with 40001.
      const results = await Promise.all(Array.from({ length: 30 }, (_, i) => admitOne(store, paidAdmission(`r${i}`, "org_1", 5))));
      assert.equal(results.filter((r) => r.kind === "admitted").length, 20);
      assert.equal(results.filter((r) => r.kind === "insufficient_credits").length, 10);
      await checkBalanceInvariants(store, "org_1");
      await store.close();
    });

    it("concurrent claims of one idempotency key from several instances: exactly one is claimed", async () => {
      const { url } = await freshSchema();
      const stores = await Promise.all(Array.from({ length: 4 }, () => open(url, { poolSize: 4 })));
      const claim = (requestId: string, key: string, nowMs: number) =>
        admission({
          requestId,
          orgId: "org_a",
          nowMs,
          idempotency: { key, requestHash: "h", lockUntilMs: nowMs + 60_000, expiresAtMs: nowMs + HOUR },
        });
      const kinds = (results: AdmitResult[]) => results.map((r) => r.kind).sort();
      const oneAdmitted = (n: number) => ["admitted", ...Array.from({ length: n - 1 }, () => "idempotency_in_progress")];
      // One key at a time: 16 requests from 4 instances.
      for (const key of ["k0", "k1", "k2", "k3", "k4"]) {
        const results = await Promise.all(Array.from({ length: 16 }, (_, i) => admitOne(stores[i % 4]!, claim(`${key}_${i}`, key, T0))));
        assert.deepEqual(kinds(results), oneAdmitted(16), key);
      }
      // Each instance claims the same 10 keys in one batch.
      const keys = Array.from({ length: 10 }, (_, i) => `kb${i}`);
      const batches = await Promise.all(
        stores.map(
          async (store, s) =>
            (await store.commitBatch({ admissions: keys.map((k) => claim(`${k}_${s}`, k, T0)), completions: [] })).admissions,
        ),
      );
      for (const [i, key] of keys.entries()) assert.deepEqual(kinds(batches.map((b) => b[i]!)), oneAdmitted(4), key);
      // The lock passed: again exactly one takes it over.
      const again = await Promise.all(
        Array.from({ length: 16 }, (_, i) => admitOne(stores[i % 4]!, claim(`k0_again_${i}`, "k0", T0 + 60_000))),
      );
      assert.deepEqual(kinds(again), oneAdmitted(16));
      assert.deepEqual((await stores[0]!.pool.query("SELECT count(*)::int AS n FROM usage_records")).rows, [{ n: 5 + 10 + 1 }]);
      await Promise.all(stores.map((s) => s.close()));
    });

    it("instances committing mixed batches of several organizations at once never deadlock and keep the invariants", async () => {
      const { url } = await freshDatabase();
      const stores = await Promise.all(Array.from({ length: 8 }, () => open(url, { poolSize: 3 })));
      const orgIds = Array.from({ length: 6 }, (_, i) => `org_${i}`);
      for (const orgId of orgIds) {
        await stores[0]!.createOrganization({ id: orgId, name: orgId, nowMs: T0 });
        await stores[0]!.grantCredits({ orgId, amountMicrousd: 1_000_000, nowMs: T0 });
      }
      const DAY = "2026-01-01";
      let seed = 42;
      const random = (n: number) => {
        seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
        return seed % n;
      };
      const shuffled = <T>(list: T[]) =>
        list
          .map((x) => [random(1000), x] as const)
          .sort((p, q) => p[0] - q[0])
          .map(([, x]) => x);
      const admittedPreviews = new Map<string, number>();
      let admitted = 0;
      let paidAdmitted = 0;
      let succeeded = 0;
      let failed = 0;
      let settledCost = 0;
      // Each instance: 10 rounds of one batch with 12 admissions (paid and preview, organizations in random order) and the
      // completions of some of its requests in flight (successes, failures, organizations in another order).
      await Promise.all(
        stores.map(async (store, s) => {
          const inFlight: { id: string; orgId: string; paid: boolean }[] = [];
          for (let round = 0; round < 10; round++) {
            const admissions = Array.from({ length: 12 }, (_, i) => {
              const requestId = `s${s}_r${round}_${i}`;
              const orgId = orgIds[random(orgIds.length)]!;
              const idempotency = { key: `key_${requestId}`, requestHash: "h", lockUntilMs: T0 + HOUR, expiresAtMs: T0 + 24 * HOUR };
              // Previews in one round of three only: they all lock the service's counter, which orders their batches.
              return round % 3 === 2 && random(3) === 0
                ? admission({ requestId, orgId, idempotency, quota: { day: DAY, orgLimit: 1000, globalLimit: 100_000 } })
                : admission({ requestId, orgId, idempotency, reservation: { amountMicrousd: 100 + random(400), expiresAtMs: T0 + HOUR } });
            });
            const finishing = shuffled(inFlight.splice(0, random(inFlight.length + 1)));
            const completions = finishing.map((r) => {
              const success = random(3) > 0;
              if (success) succeeded++;
              else failed++;
              const cost = r.paid && success ? random(100) : 0;
              settledCost += cost;
              return completion({
                requestId: r.id,
                orgId: r.orgId,
                outcome: success ? "succeeded" : "model_error",
                httpStatus: success ? 200 : 502,
                costMicrousd: cost,
                reserved: r.paid,
                idempotency: { key: `key_${r.id}`, response: success ? { status: 200, body: "{}", requestId: r.id } : null },
              });
            });
            const result = await store.commitBatch({ admissions: shuffled(admissions), completions });
            assert.deepEqual(
              result.completions,
              completions.map(() => ({ kind: "completed" })),
            );
            assert.deepEqual(
              result.admissions,
              admissions.map(() => ({ kind: "admitted" })),
            );
            for (const a of admissions) {
              inFlight.push({ id: a.requestId, orgId: a.orgId, paid: a.reservation !== null });
              if (a.quota) admittedPreviews.set(a.orgId, (admittedPreviews.get(a.orgId) ?? 0) + 1);
              else paidAdmitted++;
            }
            admitted += admissions.length;
          }
        }),
      );
      const store = stores[0]!;
      let spent = 0;
      for (const orgId of orgIds) {
        const balance = await checkBalanceInvariants(store, orgId);
        spent += balance.spent;
        const pending = (
          await store.pool.query<{ total: number }>(
            "SELECT coalesce(sum(reserved_microusd), 0)::bigint AS total FROM usage_records WHERE org_id = $1 AND reservation_status = 'pending'",
            [orgId],
          )
        ).rows[0]!.total;
        assert.equal(balance.reserved, pending, `reserved = sum of pending reservations for ${orgId}`);
        assert.deepEqual(await store.previewUsage(orgId, DAY), {
          org: admittedPreviews.get(orgId) ?? 0,
          global: [...admittedPreviews.values()].reduce((x, y) => x + y, 0),
        });
      }
      assert.equal(spent, settledCost);
      assert.deepEqual((await store.pool.query("SELECT count(*)::int AS n FROM usage_records")).rows, [{ n: admitted }]);
      const outcomes = (
        await store.pool.query<{ outcome: string; n: number }>("SELECT outcome, count(*)::int AS n FROM usage_records GROUP BY outcome")
      ).rows;
      assert.deepEqual(Object.fromEntries(outcomes.map((r) => [r.outcome, r.n])), {
        in_flight: admitted - succeeded - failed,
        succeeded,
        model_error: failed,
      });
      // One ledger entry per resolved reservation, none for a pending one.
      const reservations = (
        await store.pool.query<{ status: string; entries: number }>(
          "SELECT u.reservation_status AS status, count(e.id)::int AS entries " +
            "FROM usage_records u LEFT JOIN ledger_entries e ON e.reservation_id = u.request_id " +
            "WHERE u.reservation_status IS NOT NULL GROUP BY u.request_id, u.reservation_status",
        )
      ).rows;
      assert.equal(reservations.length, paidAdmitted);
      for (const r of reservations) assert.equal(r.entries, r.status === "pending" ? 0 : 1, JSON.stringify(r));
      for (const s of stores) assertPoolIdle(s);
      await Promise.all(stores.map((s) => s.close()));
    });
  });

  describe("PostgreSQL store: schema and queries", () => {
    it("the schema itself refuses balances, reservations, ledger entries, usage records and idempotency entries that break the invariants", async () => {
      const { schema, url } = await freshSchema();
      const store = await open(url);
      await seedInvariantRows(store);
      const client = await rawClient(schemaUrl(schema));
      try {
        const refused = [
          ...REFUSED_STATEMENTS,
          `INSERT INTO api_keys (id, org_id, hash, created_at_ms) VALUES ('k1', 'org_1', '${hashApiKey("x").toUpperCase()}', 1)`,
          "INSERT INTO usage_records (request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens, output_tokens, cost_microusd, gateway_latency_ms) VALUES ('u', 'org_1', 'k', 1, 'api', 'm', 'paid', 'succeeded', 200, 1, 1, 1, 'NaN')",
        ];
        for (const sql of refused) {
          await assert.rejects(client.query(sql), (err: { code?: string }) => /^23/.test(err.code ?? ""), sql);
        }
      } finally {
        await client.end();
      }
      assert.deepEqual(await store.getBalance("org_1"), SEEDED_BALANCE);
      await store.close();
    });

    it('orders text by code point (COLLATE "C"), like SQLite, whatever the database\'s locale', async () => {
      const store = await open((await freshSchema()).url);
      const names = ["b", "B", "a_b", "ab", "a-b", "é", "z", "Z", "_", "1"];
      // The ids are what is ordered; the names only need to differ (regardless of case: "b" and "B" would clash).
      for (const [i, name] of names.entries()) await store.createOrganization({ id: name, name: `n ${i}`, nowMs: T0 });
      const byCodePoint = [...names].sort((x, y) => (x < y ? -1 : x > y ? 1 : 0));
      assert.deepEqual(
        (await store.listOrganizations()).map((o) => o.id),
        byCodePoint,
      );
      await store.close();
    });

    it("text with U+0000: lookups find nothing, writes fail with StoreInputError", async () => {
      const store = await open((await freshSchema()).url);
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: T0 });
      assert.equal(await store.findOrganization("org\0_1"), null);
      assert.equal(await store.findApiKey("k\0"), null);
      assert.equal(await store.getUsage("org_1", "req\0"), null);
      assert.deepEqual(await store.listUsage("org\0", { limit: 5 }), { records: [], nextCursor: null });
      assert.equal(await store.getReservation("r\0"), null);
      assert.deepEqual(await store.listLedger("org\0"), []);
      assert.deepEqual(await store.getBalance("org\0"), { available: 0, reserved: 0, spent: 0, granted: 0 });
      assert.equal(await store.setOrganizationPaused("org\0", true), false);
      assert.equal(await store.revokeApiKey("k\0", T0), false);
      assert.deepEqual(await store.previewUsage("org\0", "2026-01-01"), { org: 0, global: 0 });
      await assert.rejects(
        store.listUsage("org_1", { limit: 5, cursor: encodeUsageCursor({ createdAtMs: 1, requestId: "a\0b" }) }),
        StoreInputError,
      );
      await assert.rejects(store.createOrganization({ id: "org_2", name: "A\0B", nowMs: T0 }), StoreInputError);
      await assert.rejects(admitOne(store, admission({ requestId: "req_1", orgId: "org_1", keyId: "k\0" })), StoreInputError);
      assert.deepEqual(await admitOne(store, admission({ requestId: "req_2", orgId: "org_1" })), { kind: "admitted" });
      await assert.rejects(
        store.commitBatch({ admissions: [], completions: [completion({ requestId: "req_2", orgId: "org_1", errorDetail: "bad\0" })] }),
        StoreInputError,
      );
      assert.equal((await store.getUsage("org_1", "req_2"))?.outcome, "in_flight");
      await assert.rejects(store.grantCredits({ orgId: "org_1", amountMicrousd: 5, nowMs: T0, note: "n\0" }), StoreInputError);
      assert.equal(await store.countOrganizations(), 1);
      assert.deepEqual(await store.listLedger("org_1"), []);
      assertPoolIdle(store);
      await store.close();
    });

    it("pages usage (an outcome filter through its own index), sweeps and purges through their indexes, without sorting", async () => {
      const { schema, url } = await freshSchema();
      const store = await open(url);
      const client = await rawClient(schemaUrl(schema));
      try {
        await client.query("SET enable_seqscan = off");
        const cursor = encodeUsageCursor({ createdAtMs: 5000, requestId: "req_5" });
        const queries: UsageQuery[] = [
          { limit: 10 },
          { limit: 10, cursor },
          { limit: 10, cursor, fromMs: 0, toMs: 9000 },
          { limit: 10, cursor, fromMs: 0, toMs: 3000 },
          { limit: 10, outcome: "succeeded" },
          { limit: 10, cursor, outcome: "model_error" },
          { limit: 10, cursor, toMs: 9000, outcome: "succeeded" },
          { limit: 10, fromMs: 0, toMs: 9000, outcome: "in_flight" },
          { limit: 10, cursor, fromMs: 0, toMs: 3000, outcome: "gateway_error" },
        ];
        const planOfList = async (query: UsageQuery) => {
          const { sql, params } = postgresUsageListQuery("org", query);
          return (await client.query<{ "QUERY PLAN": string }>(`EXPLAIN ${sql}`, params)).rows.map((r) => r["QUERY PLAN"]).join("\n");
        };
        /** The page's index is sought: by org (and outcome), in the page's order (no sort) unless `sortAllowed`. */
        const assertListPlan = (query: UsageQuery, plan: string, sortAllowed = false) => {
          const where = `${JSON.stringify(query)}\n${plan}`;
          if (query.outcome === undefined) assert.match(plan, /Index Scan using usage_records_by_org_time /, where);
          else {
            assert.match(
              plan,
              /Index Scan (using|on) usage_records_by_org_outcome_time [^\n]*\n\s*Index Cond: \(\(org_id = 'org'::text\) AND \(outcome = '\w+'::text\)/,
              where,
            );
            assert.doesNotMatch(plan, /usage_records_by_org_time /, where);
          }
          assert.doesNotMatch(plan, /Seq Scan|Filter:/, where);
          if (!sortAllowed) assert.doesNotMatch(plan, /Sort/, where);
          if (query.cursor && !(query.toMs !== undefined && query.toMs <= 5000))
            assert.match(plan, /ROW\(created_at_ms, request_id\) < ROW/, where);
        };
        for (const query of queries) assertListPlan(query, await planOfList(query));
        // With rows and statistics too: 6,000 records of three organizations, few of them failures.
        await client.query("SET enable_seqscan = on");
        await client.query(`
          INSERT INTO usage_records (request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens,
            output_tokens, cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms)
          SELECT 'req_' || i, (ARRAY['org', 'org_b', 'org_c'])[1 + i % 3], 'k1', i * 10, 'api', 'm', 'preview',
            CASE WHEN i % 50 = 0 THEN 'model_error' WHEN i % 97 = 0 THEN 'gateway_error' ELSE 'succeeded' END,
            CASE WHEN i % 50 = 0 THEN 502 WHEN i % 97 = 0 THEN 500 ELSE 200 END, 1, 1, 0, 1, 1, NULL, false, i * 10
          FROM generate_series(1, 6000) AS i`);
        await client.query("ANALYZE usage_records");
        // A rare outcome is read through its index (maybe as a bitmap of its few rows, then sorted), never along the
        // organization's other records. (For "succeeded", 97% of the rows, the planner may as well walk the time
        // index and filter: either reads about one page; "in_flight" may take the sweep's index of in-flight rows.)
        const rare = queries.filter((q) => q.outcome === "model_error" || q.outcome === "gateway_error");
        assert.equal(rare.length, 2);
        for (const query of rare) assertListPlan(query, await planOfList(query), true);
        // And the pages of an outcome are still every record once, newest first.
        const outcomeOf = (i: number) => (i % 50 === 0 ? "model_error" : i % 97 === 0 ? "gateway_error" : "succeeded");
        for (const [outcome, window] of [
          ["model_error", {}],
          ["gateway_error", {}],
          ["model_error", { fromMs: 15_000, toMs: 45_000 }],
          ["succeeded", { fromMs: 30_000, toMs: 33_000 }],
        ] as const) {
          const expected: string[] = [];
          for (let i = 6000; i >= 1; i--) {
            const inWindow = !("fromMs" in window) || (i * 10 >= window.fromMs && i * 10 < window.toMs);
            if (i % 3 === 0 && outcomeOf(i) === outcome && inWindow) expected.push(`req_${i}`);
          }
          const got: string[] = [];
          let cursor: string | null = null;
          do {
            const page: { records: { requestId: string }[]; nextCursor: string | null } = await store.listUsage("org", {
              limit: 7,
              outcome,
              ...window,
              ...(cursor ? { cursor } : {}),
            });
            got.push(...page.records.map((r) => r.requestId));
            cursor = page.nextCursor;
          } while (cursor !== null && got.length <= expected.length);
          assert.ok(expected.length >= 10, `${outcome} ${JSON.stringify(window)}`);
          assert.deepEqual(got, expected, `${outcome} ${JSON.stringify(window)}`);
        }
        await client.query("SET enable_seqscan = off");
        // The statements the sweep and the purge send, collected as they run.
        const sent = new Set<string>();
        const query = pg.Client.prototype.query;
        pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
          const text = typeof args[0] === "string" ? args[0] : (args[0] as { text?: unknown } | undefined)?.text;
          if (typeof text === "string") sent.add(text);
          return (query as (...a: unknown[]) => unknown).apply(this, args);
        } as typeof query;
        try {
          await store.sweep({ nowMs: T0, inFlightBeforeMs: T0, limit: 10 });
          await store.purge({ nowMs: T0, keepFromDay: "2026-01-01", limit: 10 });
        } finally {
          pg.Client.prototype.query = query;
        }
        const planOf = async (pattern: RegExp, params: unknown[]) => {
          const found = [...sent].filter((sql) => pattern.test(sql));
          assert.equal(found.length, 1, `one statement matches ${pattern}: ${JSON.stringify([...sent])}`);
          return (await client.query<{ "QUERY PLAN": string }>(`EXPLAIN ${found[0]}`, params)).rows.map((r) => r["QUERY PLAN"]).join("\n");
        };
        const inFlight = await planOf(/FROM usage_records WHERE outcome = 'in_flight' AND created_at_ms </, [1000, 10]);
        assert.match(inFlight, /Index Scan using usage_records_in_flight/, inFlight);
        assert.match(inFlight, /LockRows/, inFlight);
        assert.doesNotMatch(inFlight, /Sort|Seq Scan/, inFlight);
        const keys = await planOf(/^DELETE FROM idempotency_keys WHERE ctid/, [1000, 10]);
        assert.match(keys, /idempotency_keys_by_expiry/, keys);
        const counters = await planOf(/^DELETE FROM preview_counters WHERE ctid/, ["2026-01-01", 10]);
        assert.match(counters, /preview_counters_by_day/, counters);
      } finally {
        await client.end();
      }
      await store.close();
    });
  });

  describe("openStore and tds migrate with PostgreSQL", () => {
    it("openStore opens postgres:// and postgresql:// URLs with this adapter and reports the migrations it applied", async () => {
      const { url } = await freshSchema();
      assert.equal(isPostgresUrl(url), true);
      assert.equal(isPostgresUrl(" postgresql://h/db"), true);
      assert.equal(isPostgresUrl("sqlite:./x.sqlite"), false);
      const store = await openStore(url);
      assert.equal(store.dialect, "postgres");
      assert.equal(migrationReportOf(store)?.applied.length, MIGRATION_COUNT);
      await store.close();
      const again = await openStore(url.replace(/^postgres:/, "postgresql:"));
      assert.deepEqual(migrationReportOf(again)?.applied, []);
      assert.equal(migrationReportOf(again)?.current.length, MIGRATION_COUNT);
      await again.close();
    });

    async function tds(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
      let stdout = "";
      let stderr = "";
      const code = await runCli(args, {
        stdout: { write: (t: string) => (stdout += t) },
        stderr: { write: (t: string) => (stderr += t) },
        env: {},
      });
      return { code, stdout, stderr };
    }

    it("tds migrate applies the pending migrations and says which, in text and JSON", async () => {
      const { url } = await freshSchema();
      const first = await tds(["migrate", "--database", url, "--json"]);
      assert.equal(first.code, 0, first.stderr);
      const files = readPostgresMigrations().map((m) => ({ version: m.version, name: m.name }));
      assert.deepEqual(JSON.parse(first.stdout), {
        dialect: "postgres",
        applied: files,
        schema_version: MIGRATION_COUNT,
        migrations: files,
      });
      const second = await tds(["migrate", "--database", url, "--json"]);
      assert.deepEqual(JSON.parse(second.stdout), { dialect: "postgres", applied: [], schema_version: MIGRATION_COUNT, migrations: files });
      const text = await tds(["migrate", "--database", url]);
      assert.equal(text.code, 0);
      assert.match(text.stdout, /^No pending migrations: the PostgreSQL database is at schema version \d+ \(\d{3}_\w+\)\.\n$/);

      const fresh = await freshSchema();
      const applied = await tds(["--database", fresh.url, "migrate"]);
      assert.equal(applied.code, 0, applied.stderr);
      assert.match(applied.stdout, new RegExp(`^Applied ${MIGRATION_COUNT} migrations to the PostgreSQL database:\\n  001_initial\\n`));
    });

    it("tds migrate works on SQLite too (on an existing file: only tds init creates one)", async () => {
      const dir = mkdtempSync(join(tmpdir(), "tds-migrate-"));
      tempDirs.push(dir);
      const url = `sqlite:${join(dir, "tds.sqlite")}`;
      const missing = await tds(["migrate", "--database", url]);
      assert.equal(missing.code, 1);
      assert.match(missing.stderr, /No database at .*tds init/);
      new Database(join(dir, "tds.sqlite")).close();
      const first = JSON.parse((await tds(["migrate", "--database", url, "--json"])).stdout) as {
        dialect: string;
        applied: unknown[];
        schema_version: number;
      };
      assert.equal(first.dialect, "sqlite");
      assert.equal(first.applied.length, first.schema_version);
      assert.ok(first.schema_version >= 2);
      const second = JSON.parse((await tds(["migrate", "--database", url, "--json"])).stdout) as { applied: unknown[] };
      assert.deepEqual(second.applied, []);
    });

    it("tds migrate against an unreachable server exits 1 with pg's message", async () => {
      const url = new URL(BASE_URL);
      url.port = "1";
      const run = await tds(["migrate", "--database", url.toString()]);
      assert.equal(run.code, 1);
      assert.match(run.stderr, /ECONNREFUSED/);
    });
  });
}
