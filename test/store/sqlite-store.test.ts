import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import { sqlitePathOf } from "../../src/database-url.ts";
import { hashApiKey } from "../../src/domain/api-keys.ts";
import { readMigrations } from "../../src/store/migration-files.ts";
import { openStore } from "../../src/store/open-store.ts";
import { applyMigrations, SQLITE_MIGRATIONS_DIR } from "../../src/store/sqlite/migrations.ts";
import { openSqliteStore, SERVING_SQLITE, type SqliteStore, usageListQuery } from "../../src/store/sqlite/sqlite-store.ts";
import type { UsageQuery } from "../../src/store/store.ts";
import { decodeUsageCursor, encodeUsageCursor } from "../../src/store/usage-cursor.ts";
import { checkRowsAfter010, rowsBefore010 } from "../support/books-before-010.ts";
import { auditRowWithAction, checkKeysAfter013, keyRowsBefore013 } from "../support/keys-before-013.ts";
import { SOURCES_AFTER_012, usageRowsBefore012, usageRowWithSource } from "../support/usage-before-012.ts";
import { finalRecord, seedUsage } from "../support/usage-fixtures.ts";
import { REFUSED_STATEMENTS, SEEDED_BALANCE, seedInvariantRows } from "./refused-statements.ts";
import { admission, checkBalanceInvariants, describeStoreContract, recordUsage, T0, usageRecord } from "./store-contract.ts";

const root = mkdtempSync(join(tmpdir(), "tds-store-test-"));
after(() => rmSync(root, { recursive: true, force: true }));
let fileCount = 0;
const tempFile = (name = "tds") => join(root, `${name}-${++fileCount}.sqlite`);
const tempDir = (name: string) => mkdtempSync(join(root, `${name}-`));

describeStoreContract("sqlite (temp file)", async () => openSqliteStore(tempFile()));
describeStoreContract("sqlite (:memory:)", async () => openSqliteStore(":memory:"));

const MIGRATION_COUNT = readMigrations(SQLITE_MIGRATIONS_DIR).length;
const SQLITE_STORE_MODULE = fileURLToPath(new URL("../../src/store/sqlite/sqlite-store.ts", import.meta.url));

/**
 * Runs `count` processes of `code(i)` that all start their work at the same moment: each says "ready" once it has
 * loaded, and waits for the "go" the parent sends once all have (a moment on the clock would not do: on a busy
 * machine a process may take longer than any margin to load). What a child prints after `READY` comes back as stdout.
 */
async function runTogether(
  count: number,
  code: (worker: number) => string,
): Promise<{ code: number | null; stdout: string; stderr: string }[]> {
  const children = Array.from({ length: count }, (_, worker) => {
    const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", code(worker)], {
      stdio: ["pipe", "pipe", "pipe"],
    });
    child.stdin.on("error", () => {}); // a child that already failed cannot take its go
    let stdout = "";
    let stderr = "";
    const ready = new Promise<void>((resolve) => {
      child.stdout.on("data", (chunk: Buffer) => {
        stdout += chunk.toString();
        if (stdout.startsWith("ready\n")) resolve();
      });
    });
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const done = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) =>
      child.on("close", (exitCode) => resolve({ code: exitCode, stdout: stdout.replace(/^ready\n/, ""), stderr })),
    );
    return { child, ready, done };
  });
  // A child that fails before it is ready ends the wait too (its exit code and stderr tell why).
  await Promise.all(children.map((c) => Promise.race([c.ready, c.done])));
  for (const c of children) c.child.stdin.end("go\n");
  return Promise.all(children.map((c) => c.done));
}

/** In a child of runTogether: say so, then wait for the parent's go. */
const READY = `process.stdout.write("ready\\n"); await new Promise((r) => process.stdin.once("data", r));`;

/** Runs openSqliteStore in `count` separate processes that all start at the same moment. */
async function openInProcesses(count: number, path: string, migrationsDir: string): Promise<{ code: number | null; stderr: string }[]> {
  const code = `
    const { openSqliteStore } = await import(${JSON.stringify(SQLITE_STORE_MODULE)});
    ${READY}
    const store = openSqliteStore(${JSON.stringify(path)}, { migrationsDir: ${JSON.stringify(migrationsDir)} });
    await store.close();
  `;
  return runTogether(count, () => code);
}

const MODULE = (path: string) => JSON.stringify(fileURLToPath(new URL(`../../src/store/${path}`, import.meta.url)));

/**
 * Runs `count` processes that each admit `waves` × 25 paid requests of `amount` from org_1 through the group
 * committer of a serving gateway (SERVING_SQLITE: a busy database fails a batch at once and the committer retries
 * it), all starting at one moment. Returns each process's number of admitted requests.
 */
async function admitInProcesses(count: number, path: string, waves: number, amount: number): Promise<number[]> {
  const code = (worker: number) => `
    const { openSqliteStore, SERVING_SQLITE } = await import(${MODULE("sqlite/sqlite-store.ts")});
    const { GroupCommit } = await import(${MODULE("group-commit.ts")});
    const store = openSqliteStore(${JSON.stringify(path)}, SERVING_SQLITE);
    const books = new GroupCommit(store, { waitMs: 30000 });
    ${READY}
    let admitted = 0;
    for (let wave = 0; wave < ${waves}; wave++) {
      const now = Date.now();
      const results = await Promise.all(Array.from({ length: 25 }, (_, i) => books.admit({
        requestId: "w${worker}_" + wave + "_" + i, orgId: "org_1", keyId: "k", source: "api", model: "m", mode: "paid", nowMs: now,
        idempotency: null, quota: null, reservation: { amountMicrousd: ${amount}, expiresAtMs: now + 3600000 },
      })));
      for (const r of results) {
        if (r.kind === "admitted") admitted++;
        else if (r.kind !== "insufficient_credits" || r.availableMicrousd >= ${amount}) throw new Error("unexpected " + JSON.stringify(r));
      }
      // A pause lets the other processes take the lock in between.
      await new Promise((r) => setTimeout(r, 2));
    }
    // close() runs PRAGMA optimize, which may need the write lock another process holds (see the close test below).
    store.db.pragma("busy_timeout = 5000");
    await store.close();
    process.stdout.write(JSON.stringify({ admitted }));
  `;
  const runs = await runTogether(count, code);
  return runs.map((run) => {
    assert.equal(run.code, 0, run.stderr);
    return (JSON.parse(run.stdout) as { admitted: number }).admitted;
  });
}

/** Opens a store and collects the SQL of every statement its connection prepares (they are all prepared on opening). */
function openCollectingSql(path: string): { store: SqliteStore; prepared: string[] } {
  const prepared: string[] = [];
  const original = Database.prototype.prepare;
  Database.prototype.prepare = function (this: Database.Database, source: string) {
    prepared.push(source);
    return original.call(this, source);
  } as typeof original;
  try {
    return { store: openSqliteStore(path), prepared };
  } finally {
    Database.prototype.prepare = original;
  }
}

function queryPlan(store: SqliteStore, sql: string, ...params: unknown[]): string {
  return (store.db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...params) as { detail: string }[]).map((p) => p.detail).join("\n");
}

const HOUR = 3_600_000;

/** Rows as the service wrote them before migration 003 (the usage table had no completed_at_ms). */
const OLD_ROWS = `
  INSERT INTO organizations (id, name, paused, created_at_ms) VALUES ('org_1', 'Acme', 0, 1);
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
    ('req_old', 'org_1', 'k1', ${T0 + 5}, 'api', 'jev-1', 'paid', 'succeeded', 200, 120, 7, 50, 12.5, 14.25, NULL, 1),
    ('req_err', 'org_1', 'k1', ${T0 + 7}, 'playground', 'jev-1', 'preview', 'model_error', 502, 0, 0, 0, NULL, 3.5, 'model timed out', 0);
  INSERT INTO idempotency_keys (org_id, key, request_hash, request_id, state, response_status, response_body, response_request_id, lock_until_ms, expires_at_ms) VALUES
    ('org_1', 'k-old', 'h', 'req_old', 'completed', 200, '{"ok":true}', 'req_old', ${T0 + 60_000}, ${T0 + 86_400_000}),
    ('org_1', 'k-running', 'h', 'req_legacy', 'in_progress', NULL, NULL, NULL, ${T0 + 60_000}, ${T0 + 86_400_000});
  INSERT INTO preview_counters (scope, day, count) VALUES ('org_1', '2026-01-01', 3), ('*', '2026-01-01', 3);
`;
// Records written before 005 name no deployment and count no attempts.
const OLD_SUCCESS = usageRecord({
  requestId: "req_old",
  orgId: "org_1",
  keyId: "k1",
  createdAtMs: T0 + 5,
  completedAtMs: T0 + 5,
  costMicrousd: 50,
  overReservation: true,
  deployment: null,
  attempts: 0,
});
const OLD_FAILURE = usageRecord({
  deployment: null,
  attempts: 0,
  requestId: "req_err",
  orgId: "org_1",
  keyId: "k1",
  createdAtMs: T0 + 7,
  completedAtMs: T0 + 7,
  source: "playground",
  mode: "preview",
  outcome: "model_error",
  httpStatus: 502,
  inputTokens: 0,
  outputTokens: 0,
  latencyMs: null,
  gatewayLatencyMs: 3.5,
  errorDetail: "model timed out",
});

describe("SQLite store", () => {
  it("sets WAL, busy_timeout, foreign keys and synchronous=NORMAL", async () => {
    const store = openSqliteStore(tempFile());
    try {
      assert.equal(store.dialect, "sqlite");
      assert.equal(store.db.pragma("journal_mode", { simple: true }), "wal");
      assert.equal(store.db.pragma("busy_timeout", { simple: true }), 5000);
      assert.equal(store.db.pragma("foreign_keys", { simple: true }), 1);
      assert.equal(store.db.pragma("synchronous", { simple: true }), 1);
    } finally {
      await store.close();
    }
  });

  it("creates missing parent folders", async () => {
    const path = join(tempDir("nested"), "a", "b", "c", "tds.sqlite");
    const store = openSqliteStore(path);
    await store.close();
    assert.ok(existsSync(path));
  });

  it("records each migration once in schema_migrations", async () => {
    const store = openSqliteStore(tempFile());
    try {
      const rows = store.db.prepare("SELECT version, name, applied_at_ms FROM schema_migrations ORDER BY version").all() as {
        version: number;
        name: string;
        applied_at_ms: number;
      }[];
      assert.deepEqual(
        rows.map((r) => [r.version, r.name]),
        readMigrations(SQLITE_MIGRATIONS_DIR).map((m) => [m.version, m.name]),
      );
      assert.equal(rows[0]?.version, 1);
      assert.equal(rows[0]?.name, "initial");
      assert.ok(rows.every((r) => Math.abs(r.applied_at_ms - Date.now()) < 60_000));
    } finally {
      await store.close();
    }
  });

  it("applies migrations once when two stores open the same file, and both see each other's writes", async () => {
    const path = tempFile();
    const a = openSqliteStore(path);
    const b = openSqliteStore(path);
    try {
      const count = b.db.prepare("SELECT count(*) AS n, count(DISTINCT version) AS d FROM schema_migrations").get() as {
        n: number;
        d: number;
      };
      assert.deepEqual(count, { n: MIGRATION_COUNT, d: MIGRATION_COUNT });
      const org = await a.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
      assert.deepEqual(await b.findOrganization("Acme"), org);
      await b.setOrganizationPaused("org_1", true);
      assert.equal((await a.findOrganization("org_1"))?.paused, true);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("applies a slow migration exactly once when several processes open a new file at the same moment", async () => {
    const dir = tempDir("migrations-slow");
    for (const file of readdirSync(SQLITE_MIGRATIONS_DIR)) copyFileSync(join(SQLITE_MIGRATIONS_DIR, file), join(dir, file));
    // Not idempotent and slow (~0.1 s): a second run would fail with "table slow already exists".
    writeFileSync(
      join(dir, "900_slow.sql"),
      "CREATE TABLE slow AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) SELECT x FROM c;\n",
    );
    const path = tempFile("race");
    const results = await openInProcesses(4, path, dir);
    for (const r of results) assert.equal(r.code, 0, r.stderr);
    const db = new Database(path, { readonly: true });
    try {
      const versions = (db.prepare("SELECT version FROM schema_migrations ORDER BY version").all() as { version: number }[]).map(
        (r) => r.version,
      );
      assert.deepEqual(versions, [...readMigrations(SQLITE_MIGRATIONS_DIR).map((m) => m.version), 900]);
      assert.deepEqual(db.prepare("SELECT count(*) AS n FROM slow").get(), { n: 300000 });
    } finally {
      db.close();
    }
  });

  it("processes admitting from one balance at the same moment never overdraw it", async () => {
    const path = tempFile("admit-race");
    const setup = openSqliteStore(path);
    await setup.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
    await setup.grantCredits({ orgId: "org_1", amountMicrousd: 10_000, nowMs: 2 });
    await setup.close();
    // 4 × 24 batches of 25 admissions of 7 for 10,000: exactly floor(10000 / 7) = 1428 can succeed.
    const perProcess = await admitInProcesses(4, path, 24, 7);
    assert.equal(
      perProcess.reduce((a, b) => a + b, 0),
      1428,
      `admitted per process: ${perProcess.join(", ")}`,
    );
    assert.ok(perProcess.filter((n) => n > 0).length >= 2, `the processes overlapped: ${perProcess.join(", ")}`);
    const store = openSqliteStore(path);
    try {
      assert.deepEqual(await checkBalanceInvariants(store, "org_1"), {
        available: 10_000 - 1428 * 7,
        reserved: 1428 * 7,
        spent: 0,
        granted: 10_000,
      });
      assert.deepEqual(
        store.db
          .prepare("SELECT count(*) AS n, sum(reserved_microusd) AS total FROM usage_records WHERE reservation_status = 'pending'")
          .get(),
        { n: 1428, total: 9996 },
      );
      assert.deepEqual(
        store.db.prepare("SELECT count(*) AS n FROM usage_records WHERE outcome = 'in_flight'").get(),
        { n: 1428 },
        "a usage record for each admission, none for the others",
      );
      const order = store.db.prepare("SELECT request_id FROM usage_records ORDER BY rowid").pluck().all() as string[];
      const switches = order.filter((id, i) => i > 0 && id.split("_")[0] !== order[i - 1]!.split("_")[0]).length;
      assert.ok(switches > 3, `the processes took turns, not one after another (${switches} switches)`);
    } finally {
      await store.close();
    }
  });

  it("with SERVING_SQLITE, commitBatch fails at once with SQLITE_BUSY while another connection writes; sweep, grant and purge wait for it", async () => {
    const path = tempFile("busy");
    const store = openSqliteStore(path, SERVING_SQLITE);
    const other = new Database(path);
    try {
      assert.equal(store.db.pragma("busy_timeout", { simple: true }), 0);
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
      await store.grantCredits({ orgId: "org_1", amountMicrousd: 1000, nowMs: 2 });
      const paid = admission({ requestId: "req_1", orgId: "org_1", reservation: { amountMicrousd: 100, expiresAtMs: T0 + 1000 } });
      other.exec("BEGIN IMMEDIATE");
      // At once: no busy handler sleeps (busy_timeout 0, above), and the lock is still held (released only below).
      await assert.rejects(
        store.commitBatch({ admissions: [paid], completions: [] }),
        (err: { code?: string }) => err.code === "SQLITE_BUSY",
      );
      let settled = false;
      const waiting = Promise.all([
        store.sweep({ nowMs: T0, inFlightBeforeMs: T0, limit: 10 }),
        store.grantCredits({ orgId: "org_1", amountMicrousd: 5, nowMs: 3 }),
        store.purge({ nowMs: T0, keepFromDay: "2026-01-01", limit: 10 }),
      ]).then((results) => {
        settled = true;
        return results;
      });
      await new Promise((resolve) => setTimeout(resolve, 200));
      assert.equal(settled, false, "still waiting, without blocking the event loop");
      other.exec("COMMIT");
      assert.deepEqual(await waiting, [
        { abandoned: 0 },
        { available: 1005, reserved: 0, spent: 0, granted: 1005 },
        { idempotencyKeys: 0, previewCounters: 0 },
      ]);
      assert.deepEqual(await store.commitBatch({ admissions: [paid], completions: [] }), {
        admissions: [{ kind: "admitted" }],
        completions: [],
      });
    } finally {
      if (other.inTransaction) other.exec("ROLLBACK");
      other.close();
      await store.close();
    }
  });
  it("a serving store closes while another connection holds the write lock", async () => {
    const path = tempFile("close-busy");
    const store = openSqliteStore(path, SERVING_SQLITE);
    await store.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
    const other = new Database(path);
    try {
      other.exec("BEGIN IMMEDIATE");
      await store.close();
      assert.equal(store.db.open, false);
    } finally {
      other.exec("ROLLBACK");
      other.close();
    }
  });

  it("keeps data when reopened", async () => {
    const path = tempFile();
    const first = openSqliteStore(path);
    const org = await first.createOrganization({ id: "org_1", name: "Zürich ☕", nowMs: 10 });
    const key = await first.createApiKey({ id: "k1", orgId: "org_1", name: "ci", hash: hashApiKey("raw"), nowMs: 11 });
    const record = usageRecord({ requestId: "req_1", orgId: "org_1", keyId: "k1", costMicrousd: 60 });
    const inFlight = usageRecord({ requestId: "req_2", orgId: "org_1", keyId: "k1", outcome: "in_flight" });
    await recordUsage(first, [record, inFlight]);
    await first.revokeApiKey("k1", 12);
    await first.close();

    const second = openSqliteStore(path);
    try {
      assert.deepEqual(await second.findOrganization("Zürich ☕"), org);
      assert.deepEqual(await second.findApiKey("k1"), { key: { ...key, revokedAtMs: 12 }, org });
      assert.deepEqual(await second.getUsage("org_1", "req_1"), record);
      assert.deepEqual(await second.getUsage("org_1", "req_2"), inFlight);
      assert.deepEqual(await checkBalanceInvariants(second, "org_1"), { available: 0, reserved: 0, spent: 60, granted: 60 });
      const count = second.db.prepare("SELECT count(*) AS n FROM schema_migrations").get() as { n: number };
      assert.equal(count.n, MIGRATION_COUNT, "reopening applies nothing again");
    } finally {
      await second.close();
    }
  });
  it("refuses to store a raw key or anything else that is not a sha256 hex hash", async () => {
    const store = openSqliteStore(tempFile());
    try {
      await store.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
      const raw = `tds_abcdefghijkl_${"A".repeat(43)}`;
      for (const hash of [raw, hashApiKey("x").toUpperCase(), "abc", ""]) {
        await assert.rejects(store.createApiKey({ id: "k1", orgId: "org_1", name: null, hash, nowMs: 2 }));
      }
      await store.createApiKey({ id: "k1", orgId: "org_1", name: null, hash: hashApiKey(raw), nowMs: 2 });
    } finally {
      await store.close();
    }
  });

  it("pages usage with an index seek, not a scan of earlier pages; an outcome filter seeks its own index", async () => {
    const store = openSqliteStore(":memory:");
    try {
      const cursor = encodeUsageCursor({ createdAtMs: 5000, requestId: "req_5" });
      const queries: UsageQuery[] = [
        { limit: 10 },
        { limit: 10, cursor },
        { limit: 10, cursor, fromMs: 0 },
        { limit: 10, cursor, fromMs: 0, toMs: 9000 },
        { limit: 10, cursor, fromMs: 0, toMs: 3000 },
        { limit: 10, outcome: "succeeded" },
        { limit: 10, cursor, outcome: "model_error" },
        { limit: 10, cursor, toMs: 9000, outcome: "succeeded" },
        { limit: 10, fromMs: 0, toMs: 9000, outcome: "in_flight" },
        { limit: 10, cursor, fromMs: 0, toMs: 3000, outcome: "gateway_error" },
      ];
      for (const query of queries) {
        const { sql, params } = usageListQuery("org", query);
        const plan = (store.db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...params) as { detail: string }[]).map((p) => p.detail).join("\n");
        const seek =
          query.outcome === undefined
            ? /SEARCH usage_records USING INDEX usage_records_by_org_time \(org_id=\?/
            : /SEARCH usage_records USING INDEX usage_records_by_org_outcome_time \(org_id=\? AND outcome=\?/;
        assert.match(plan, seek, JSON.stringify(query));
        assert.doesNotMatch(plan, /TEMP B-TREE/);
        if (query.cursor && !(query.toMs !== undefined && query.toMs <= 5000))
          assert.match(plan, /\(created_at_ms,request_id\)<\(\?,\?\)/, JSON.stringify(query));
        if (query.fromMs !== undefined) assert.match(plan, /created_at_ms>\?/, JSON.stringify(query));
      }
    } finally {
      await store.close();
    }
  });

  it("pages an outcome through its index: every record once, newest first, ties broken by request id", async () => {
    const store = openSqliteStore(":memory:");
    try {
      const outcomes = [
        "succeeded",
        "succeeded",
        "succeeded",
        "model_error",
        "succeeded",
        "context_rejected",
        "succeeded",
        "gateway_error",
      ] as const;
      // 400 records of two organizations; every 4 share a creation time.
      const records = Array.from({ length: 400 }, (_, i) =>
        finalRecord({
          requestId: `req_${String(i).padStart(3, "0")}`,
          orgId: i % 5 === 0 ? "org_other" : "org",
          createdAtMs: T0 + Math.floor(i / 4) * 10,
          outcome: outcomes[i % outcomes.length]!,
        }),
      );
      await seedUsage(store, records);
      const expected = (outcome: string, fromMs = 0, toMs = Number.MAX_SAFE_INTEGER) =>
        records
          .filter((r) => r.orgId === "org" && r.outcome === outcome && r.createdAtMs >= fromMs && r.createdAtMs < toMs)
          .sort((a, b) => b.createdAtMs - a.createdAtMs || (a.requestId < b.requestId ? 1 : -1))
          .map((r) => r.requestId);
      const pageAll = async (query: Omit<UsageQuery, "cursor">) => {
        const got: string[] = [];
        let cursor: string | undefined;
        for (let pages = 0; pages < 500; pages++) {
          const page = await store.listUsage("org", { ...query, ...(cursor ? { cursor } : {}) });
          got.push(...page.records.map((r) => r.requestId));
          if (!page.nextCursor) return got;
          cursor = page.nextCursor;
        }
        throw new Error("too many pages");
      };
      for (const outcome of ["succeeded", "model_error", "context_rejected", "gateway_error", "reservation_expired"] as const) {
        assert.deepEqual(await pageAll({ limit: 3, outcome }), expected(outcome), outcome);
        assert.deepEqual(
          await pageAll({ limit: 7, outcome, fromMs: T0 + 200, toMs: T0 + 700 }),
          expected(outcome, T0 + 200, T0 + 700),
          `${outcome} in a window`,
        );
      }
      assert.ok(expected("succeeded").length > 100);
    } finally {
      await store.close();
    }
  });

  it("the sweep and the purge seek their indexes", async () => {
    const { store, prepared } = openCollectingSql(":memory:");
    try {
      const only = (pattern: RegExp) => {
        const found = prepared.filter((sql) => pattern.test(sql));
        assert.equal(found.length, 1, `one statement matches ${pattern}: ${JSON.stringify(found)}`);
        return found[0]!;
      };
      const inFlight = queryPlan(store, only(/FROM usage_records WHERE outcome = 'in_flight' AND created_at_ms </), 1000, 10);
      assert.match(inFlight, /SEARCH usage_records USING INDEX usage_records_in_flight \(created_at_ms<\?\)/, inFlight);
      assert.doesNotMatch(inFlight, /TEMP B-TREE/, inFlight);
      const keys = queryPlan(store, only(/^DELETE FROM idempotency_keys WHERE rowid IN/), 1000, 10);
      assert.match(keys, /SEARCH idempotency_keys USING COVERING INDEX idempotency_keys_by_expiry \(expires_at_ms<\?\)/, keys);
      const counters = queryPlan(store, only(/^DELETE FROM preview_counters WHERE rowid IN/), "2026-01-01", 10);
      assert.match(counters, /SEARCH preview_counters USING COVERING INDEX preview_counters_by_day \(day<\?\)/, counters);
    } finally {
      await store.close();
    }
  });
  it("the administration pages, the usage totals and the admin purge seek their indexes", async () => {
    const { store, prepared } = openCollectingSql(":memory:");
    try {
      const planOf = (pattern: RegExp, ...params: unknown[]) => {
        const found = prepared.filter((sql) => pattern.test(sql));
        assert.equal(found.length, 1, `one statement matches ${pattern}: ${JSON.stringify(found)}`);
        return queryPlan(store, found[0]!, ...params);
      };
      const expect = (plan: string, index: RegExp, allowed = /(?!)/) => {
        assert.match(plan, index, plan);
        assert.doesNotMatch(plan.replace(allowed, ""), /TEMP B-TREE|SCAN/, plan);
      };
      expect(
        planOf(/^DELETE FROM admin_idempotency WHERE key IN/, 1000, 10),
        /SEARCH admin_idempotency USING INDEX admin_idempotency_by_expiry \(expires_at_ms<\?\)/,
      );
      expect(
        planOf(/FROM admin_audit WHERE org_id = \? AND id < \?/, "org_1", 5, 10),
        /SEARCH admin_audit USING INDEX admin_audit_by_org \(org_id=\? AND id<\?\)/,
      );
      expect(
        planOf(/FROM admin_audit WHERE org_id = \? ORDER/, "org_1", 10),
        /SEARCH admin_audit USING INDEX admin_audit_by_org \(org_id=\?\)/,
      );
      expect(planOf(/FROM admin_audit WHERE id < \?/, 5, 10), /SEARCH admin_audit USING INTEGER PRIMARY KEY \(rowid<\?\)/);
      expect(
        planOf(/FROM organizations WHERE \(created_at_ms, id\) >/, 1, "org_1", 10),
        /SEARCH organizations USING INDEX organizations_by_creation/,
      );
      // The totals read only the window's rows of the daily roll-up (never usage records): every organization's days
      // are one range of its primary key, one organization's days a range of its index; the organizations are grouped
      // (then named) and sorted in temporary trees.
      const grouped = /USE TEMP B-TREE FOR (GROUP|ORDER) BY|SCAN g\b/g;
      const byDay = /SEARCH d USING PRIMARY KEY \(day_start_ms>\? AND day_start_ms<\?\)/;
      const byOrgDay = /SEARCH d USING INDEX usage_daily_by_org \(org_id=\? AND day_start_ms>\? AND day_start_ms<\?\)/;
      const names = /SEARCH o USING INDEX sqlite_autoindex_organizations_1 \(id=\?\) LEFT-JOIN/;
      expect(planOf(/day_start_ms < \? GROUP BY d.day_start_ms/, 1, 2), byDay);
      expect(planOf(/AND d.org_id = \? GROUP BY d.day_start_ms/, 1, 2, "org_1"), byOrgDay);
      for (const plan of [
        planOf(/day_start_ms < \? GROUP BY d.org_id/, 1, 2),
        planOf(/AND d.org_id = \? GROUP BY d.org_id/, 1, 2, "org_1"),
      ]) {
        expect(plan, names, grouped);
        assert.match(plan, /SEARCH d USING (PRIMARY KEY|INDEX usage_daily_by_org)/, plan);
      }
      assert.doesNotMatch(prepared.filter((sql) => /GROUP BY/.test(sql)).join("\n"), /usage_records/, "no totals read usage records");
    } finally {
      await store.close();
    }
  });

  it("the schema itself refuses balances, reservations, ledger entries, usage records and idempotency entries that break the invariants", async () => {
    const store = openSqliteStore(":memory:");
    try {
      await seedInvariantRows(store);
      for (const sql of REFUSED_STATEMENTS) assert.throws(() => store.db.exec(sql), /constraint failed/, sql);
      assert.deepEqual(await store.getBalance("org_1"), SEEDED_BALANCE);
    } finally {
      await store.close();
    }
  });
  it("in-memory stores are separate", async () => {
    const a = openSqliteStore(":memory:");
    const b = openSqliteStore(":memory:");
    await a.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
    assert.equal(await b.countOrganizations(), 0);
    await a.close();
    await b.close();
  });
});

describe("SQLite migrations", () => {
  function migrationDir(files: Record<string, string>): string {
    const dir = tempDir("migrations");
    for (const [name, sql] of Object.entries(files)) writeFileSync(join(dir, name), sql);
    return dir;
  }

  it("applies pending migrations in version order, once", () => {
    const dir = migrationDir({
      "010_third.sql": "INSERT INTO log VALUES ('010');",
      "001_first.sql": "CREATE TABLE log (v TEXT);",
      "002_second.sql": "INSERT INTO log VALUES ('002');",
      "README.md": "not a migration",
    });
    const db = new Database(":memory:");
    try {
      assert.deepEqual(applyMigrations(db, readMigrations(dir)), [1, 2, 10]);
      assert.deepEqual(applyMigrations(db, readMigrations(dir)), []);
      assert.deepEqual(db.prepare("SELECT v FROM log").pluck().all(), ["002", "010"]);
      writeFileSync(join(dir, "011_fourth.sql"), "INSERT INTO log VALUES ('011');");
      assert.deepEqual(applyMigrations(db, readMigrations(dir)), [11]);
      assert.deepEqual(db.prepare("SELECT version, name FROM schema_migrations ORDER BY version").all(), [
        { version: 1, name: "first" },
        { version: 2, name: "second" },
        { version: 10, name: "third" },
        { version: 11, name: "fourth" },
      ]);
    } finally {
      db.close();
    }
  });

  it("rolls back the whole run when a migration fails, naming the file", () => {
    const dir = migrationDir({
      "001_ok.sql": "CREATE TABLE a (x INTEGER);",
      "002_broken.sql": "CREATE TABLE b (x INTEGER); INSERT INTO nowhere VALUES (1);",
    });
    const db = new Database(":memory:");
    try {
      assert.throws(() => applyMigrations(db, readMigrations(dir)), /002_broken\.sql/);
      assert.equal(db.inTransaction, false);
      const tables = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").pluck().all();
      assert.deepEqual(tables, []);
    } finally {
      db.close();
    }
  });

  it("refuses a database that has a migration this version does not know", () => {
    const db = new Database(":memory:");
    try {
      applyMigrations(db, readMigrations(migrationDir({ "001_a.sql": "SELECT 1;", "002_b.sql": "SELECT 1;" })));
      assert.throws(() => applyMigrations(db, readMigrations(migrationDir({ "001_a.sql": "SELECT 1;" }))), /newer version/);
    } finally {
      db.close();
    }
  });

  it("refuses badly named or duplicate-version migration files", () => {
    assert.throws(() => readMigrations(migrationDir({ "1_short.sql": "" })), /NNN_name\.sql/);
    assert.throws(() => readMigrations(migrationDir({ "001-a.sql": "" })), /NNN_name\.sql/);
    assert.throws(() => readMigrations(migrationDir({ "001_a.sql": "", "0001_b.sql": "" })), /same version 1/);
  });

  it("the shipped folder starts at 001_initial and has its migrations in order", () => {
    const migrations = readMigrations(SQLITE_MIGRATIONS_DIR);
    assert.equal(migrations[0]?.file, "001_initial.sql");
    assert.deepEqual(
      migrations.map((m) => m.version),
      migrations.map((_, i) => i + 1),
      "versions are consecutive",
    );
    assert.deepEqual(
      migrations.map((m) => m.name),
      [
        "initial",
        "credits_quotas_idempotency",
        "two_step_bookkeeping",
        "usage_by_outcome",
        "usage_deployment",
        "administration",
        "usage_daily",
        "instance_leases",
        "organization_name_keys",
        "reservations_on_usage_records",
        "batches",
        "usage_source_batch",
        "key_controls",
      ],
    );
  });

  it("003 keeps the rows of a database made by 001 and 002: usage records become final at their creation time", async () => {
    const dir = tempDir("migrations-002");
    for (const file of ["001_initial.sql", "002_credits_quotas_idempotency.sql"])
      copyFileSync(join(SQLITE_MIGRATIONS_DIR, file), join(dir, file));
    const path = tempFile("from-002");
    const old = new Database(path);
    try {
      assert.deepEqual(applyMigrations(old, readMigrations(dir)), [1, 2]);
      old.exec(OLD_ROWS);
    } finally {
      old.close();
    }
    const store = openSqliteStore(path);
    try {
      assert.deepEqual(
        store.db.prepare("SELECT version FROM schema_migrations ORDER BY version").pluck().all(),
        readMigrations(SQLITE_MIGRATIONS_DIR).map((m) => m.version),
      );
      assert.deepEqual(await store.getUsage("org_1", "req_old"), OLD_SUCCESS);
      assert.deepEqual(await store.getUsage("org_1", "req_err"), OLD_FAILURE);
      assert.deepEqual((await store.listUsage("org_1", { limit: 10 })).records, [OLD_FAILURE, OLD_SUCCESS]);
      assert.deepEqual(await store.previewUsage("org_1", "2026-01-01"), { org: 3, global: 3 });
      // The old design wrote no record for a request in flight: its pending reservation was expired by migration 010.
      assert.deepEqual(await checkBalanceInvariants(store, "org_1"), { available: 950, reserved: 0, spent: 50, granted: 1000 });
      assert.deepEqual(await store.getReservation("req_old"), {
        id: "req_old",
        orgId: "org_1",
        requestId: "req_old",
        amountMicrousd: 100,
        status: "settled",
        costMicrousd: 50,
        createdAtMs: T0 + 5,
        expiresAtMs: T0 + HOUR,
        resolvedAtMs: T0 + 5,
      });
      const idem = (key: string) => ({ key, requestHash: "h", lockUntilMs: T0 + 200, expiresAtMs: T0 + 86_400_000 });
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
      const indexes = store.db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%' ORDER BY name")
        .pluck()
        .all();
      for (const name of ["idempotency_keys_by_expiry", "preview_counters_by_day", "usage_records_by_org_time", "usage_records_in_flight"])
        assert.ok(indexes.includes(name), name);
    } finally {
      await store.close();
    }
  });

  it("010 moves reservations onto their usage records: a pending one stays pending with its request in flight, the books stay exact", async () => {
    const dir = tempDir("migrations-009");
    for (const m of readMigrations(SQLITE_MIGRATIONS_DIR).filter((m) => m.version < 10))
      copyFileSync(join(SQLITE_MIGRATIONS_DIR, m.file), join(dir, m.file));
    const path = tempFile("from-009");
    const old = new Database(path);
    try {
      applyMigrations(old, readMigrations(dir));
      old.exec(rowsBefore010((b) => (b ? "1" : "0")));
    } finally {
      old.close();
    }
    const store = openSqliteStore(path);
    try {
      await checkRowsAfter010(store);
    } finally {
      await store.close();
    }
  });

  it("012 rebuilds usage_records to allow source 'batch': rows, columns, constraints and indexes as before", async () => {
    const dir = tempDir("migrations-011");
    for (const m of readMigrations(SQLITE_MIGRATIONS_DIR).filter((m) => m.version < 12))
      copyFileSync(join(SQLITE_MIGRATIONS_DIR, m.file), join(dir, m.file));
    const path = tempFile("from-011");
    const bool = (b: boolean) => (b ? "1" : "0");
    const shape = (db: Database.Database) => ({
      rows: db.prepare("SELECT * FROM usage_records ORDER BY request_id").all(),
      columns: db.prepare("SELECT * FROM pragma_table_xinfo('usage_records')").all(),
      indexes: db.prepare("SELECT name, sql FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'usage_records' ORDER BY name").all(),
      indexColumns: db
        .prepare(
          "SELECT l.name, l.\"unique\", l.partial, c.seqno, c.name AS column, c.desc FROM pragma_index_list('usage_records') l, " +
            "pragma_index_xinfo(l.name) c ORDER BY l.name, c.seqno",
        )
        .all(),
      dependents: db.prepare("SELECT type, name FROM sqlite_schema WHERE type IN ('trigger', 'view') ORDER BY name").all(),
      // The table's definition without comments and white space, and with the one change 012 makes.
      definition: (db.prepare("SELECT sql FROM sqlite_schema WHERE name = 'usage_records'").pluck().get() as string)
        .replace(/--[^\n]*/g, "")
        .replace(/\s+/g, "")
        .replace("('api','playground','batch')", "('api','playground')"),
    });
    const old = new Database(path);
    let before: ReturnType<typeof shape>;
    try {
      assert.deepEqual(applyMigrations(old, readMigrations(dir)).at(-1), 11);
      old.exec(usageRowsBefore012(bool));
      before = shape(old);
      assert.throws(() => old.exec(usageRowWithSource("req_batch", "batch", bool)), /CHECK constraint failed/);
    } finally {
      old.close();
    }
    assert.equal(before.rows.length, 3);
    assert.deepEqual(
      before.indexes.map((i) => (i as { name: string }).name),
      ["sqlite_autoindex_usage_records_1", "usage_records_by_org_outcome_time", "usage_records_by_org_time", "usage_records_in_flight"],
    );
    copyFileSync(join(SQLITE_MIGRATIONS_DIR, "012_usage_source_batch.sql"), join(dir, "012_usage_source_batch.sql"));
    const at012 = new Database(path);
    try {
      assert.deepEqual(applyMigrations(at012, readMigrations(dir)), [12]);
      assert.deepEqual(shape(at012), before);
      assert.deepEqual(at012.prepare("PRAGMA foreign_key_check").all(), []);
      assert.equal(at012.prepare("PRAGMA integrity_check").pluck().get(), "ok");
    } finally {
      at012.close();
    }
    const store = openSqliteStore(path);
    try {
      assert.equal(store.db.prepare("SELECT max(version) FROM schema_migrations").pluck().get(), 13);
      store.db.exec(usageRowWithSource("req_batch", "batch", bool));
      assert.equal((await store.getUsage("org_1", "req_batch"))?.source, "batch");
      assert.throws(() => store.db.exec(usageRowWithSource("req_nope", "nope", bool)), /CHECK constraint failed/);
      assert.equal(await store.getUsage("org_1", "req_nope"), null);
      assert.deepEqual(
        (await store.listUsage("org_1", { limit: 10 })).records.map((r) => [r.requestId, r.source]),
        SOURCES_AFTER_012,
      );
    } finally {
      await store.close();
    }
  });

  it("013 adds the key settings as NULL to the keys there are, and rebuilds admin_audit to allow 'key.updated' and 'key.rotated': rows, ids, columns and index as before", async () => {
    const dir = tempDir("migrations-012");
    for (const m of readMigrations(SQLITE_MIGRATIONS_DIR).filter((m) => m.version < 13))
      copyFileSync(join(SQLITE_MIGRATIONS_DIR, m.file), join(dir, m.file));
    const path = tempFile("from-012");
    const bool = (b: boolean) => (b ? "1" : "0");
    const audit = (db: Database.Database) => ({
      rows: db.prepare("SELECT * FROM admin_audit ORDER BY id").all(),
      columns: db.prepare("SELECT * FROM pragma_table_xinfo('admin_audit')").all(),
      indexes: db.prepare("SELECT name, sql FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'admin_audit' ORDER BY name").all(),
      next: db.prepare("SELECT seq FROM sqlite_sequence WHERE name = 'admin_audit'").pluck().get(),
      // The table's definition without comments and white space, and with the one change 013 makes.
      definition: (db.prepare("SELECT sql FROM sqlite_schema WHERE name = 'admin_audit'").pluck().get() as string)
        .replace(/--[^\n]*/g, "")
        .replace(/\s+/g, "")
        .replace('"admin_audit"', "admin_audit")
        .replace("'key.updated','key.rotated',", ""),
    });
    const keys = (db: Database.Database) => db.prepare("SELECT * FROM api_keys ORDER BY id").all() as Record<string, unknown>[];
    const old = new Database(path);
    let auditBefore: ReturnType<typeof audit>;
    let keysBefore: Record<string, unknown>[];
    try {
      assert.deepEqual(applyMigrations(old, readMigrations(dir)).at(-1), 12);
      old.exec(keyRowsBefore013(bool));
      auditBefore = audit(old);
      keysBefore = keys(old);
      for (const action of ["key.updated", "key.rotated"])
        assert.throws(() => old.exec(auditRowWithAction(action)), /CHECK constraint failed/, action);
    } finally {
      old.close();
    }
    assert.deepEqual(
      auditBefore.rows.map((r) => (r as { id: number }).id),
      [1, 2, 3, 4],
    );
    assert.equal(auditBefore.next, 4);
    assert.equal(keysBefore.length, 2);
    const store = openSqliteStore(path);
    try {
      assert.deepEqual(store.db.prepare("SELECT version, name FROM schema_migrations WHERE version >= 12 ORDER BY version").all(), [
        { version: 12, name: "usage_source_batch" },
        { version: 13, name: "key_controls" },
      ]);
      assert.deepEqual(audit(store.db), auditBefore);
      const settingsColumns = {
        expires_at_ms: null,
        models: null,
        requests_per_minute: null,
        budget_microusd: null,
        budget_period: null,
        replaced_by: null,
        retires_at_ms: null,
        lineage_id: null,
        last_used_at_ms: null,
      };
      assert.deepEqual(
        keys(store.db),
        keysBefore.map((k) => ({ ...k, ...settingsColumns })),
      );
      assert.deepEqual(store.db.prepare("SELECT * FROM key_spend").all(), []);
      assert.deepEqual(
        store.db
          .prepare(
            "SELECT name, type, \"notnull\", dflt_value FROM pragma_table_xinfo('usage_records') WHERE name LIKE 'key_budget_%' ORDER BY cid",
          )
          .all(),
        [
          { name: "key_budget_key_id", type: "TEXT", notnull: 0, dflt_value: null },
          { name: "key_budget_period", type: "TEXT", notnull: 0, dflt_value: null },
        ],
      );
      assert.deepEqual(store.db.prepare("PRAGMA foreign_key_check").all(), []);
      assert.equal(store.db.prepare("PRAGMA integrity_check").pluck().get(), "ok");
      await checkKeysAfter013(store);
      store.db.exec(auditRowWithAction("key.rotated"));
      assert.throws(() => store.db.exec(auditRowWithAction("key.nope")), /CHECK constraint failed/);
      assert.deepEqual(store.db.prepare("SELECT id, action FROM admin_audit WHERE id > 4 ORDER BY id").all(), [
        { id: 5, action: "key.updated" },
        { id: 6, action: "key.rotated" },
      ]);
    } finally {
      await store.close();
    }
  });
});

describe("usage cursor", () => {
  it("round-trips any request id", () => {
    for (const requestId of ["req_1", "a:b:c", "請求 ✓", "__proto__"]) {
      const text = encodeUsageCursor({ createdAtMs: 1_767_225_600_123, requestId });
      assert.match(text, /^[A-Za-z0-9_-]+$/);
      assert.deepEqual(decodeUsageCursor(text), { createdAtMs: 1_767_225_600_123, requestId });
    }
  });
});

describe("openStore", () => {
  it("maps database URLs to SQLite paths", () => {
    assert.equal(sqlitePathOf("sqlite:./data/tds.sqlite"), "./data/tds.sqlite");
    assert.equal(sqlitePathOf("sqlite:data/x.db"), "data/x.db");
    assert.equal(sqlitePathOf("sqlite:/var/lib/tds/tds.sqlite"), "/var/lib/tds/tds.sqlite");
    assert.equal(sqlitePathOf("sqlite:///var/lib/tds.sqlite"), "/var/lib/tds.sqlite");
    assert.equal(sqlitePathOf("sqlite::memory:"), ":memory:");
    assert.equal(sqlitePathOf("file:./x.sqlite"), "./x.sqlite");
    assert.equal(sqlitePathOf("file:///tmp/a%20b.sqlite"), "/tmp/a b.sqlite");
    assert.equal(sqlitePathOf("./data/tds.sqlite"), "./data/tds.sqlite");
    assert.equal(sqlitePathOf("/abs/tds.db"), "/abs/tds.db");
    assert.equal(sqlitePathOf("mysql://host/db"), null);
    assert.equal(sqlitePathOf("http://host/x.sqlite"), null);
    assert.equal(sqlitePathOf("tds.json"), null);
    assert.throws(() => sqlitePathOf("sqlite:"), /no path/);
  });

  it("opens a SQLite file relative to the current directory, with migrations applied", async () => {
    const dir = tempDir("open");
    const store = await openStore(`sqlite:${join(dir, "sub", "tds.sqlite")}`);
    assert.equal(store.dialect, "sqlite");
    assert.equal(await store.countOrganizations(), 0);
    await store.close();
    assert.ok(existsSync(join(dir, "sub", "tds.sqlite")));
    const again = await openStore(join(dir, "sub", "tds.sqlite"));
    await again.close();
    const memory = await openStore("sqlite::memory:");
    await memory.createOrganization({ id: "o", name: "n", nowMs: 0 });
    await memory.close();
    mkdirSync(join(dir, "f"));
    const viaFile = await openStore(`file:${join(dir, "f", "x.db")}`);
    await viaFile.close();
    assert.ok(existsSync(join(dir, "f", "x.db")));
  });

  it("names the accepted forms for a URL it does not know", async () => {
    await assert.rejects(openStore("mysql://localhost/tds"), /accepted forms: sqlite:PATH/);
    await assert.rejects(openStore("tds.json"), /accepted forms/);
  });
});
