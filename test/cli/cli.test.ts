import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import { runCli } from "../../src/cli/cli.ts";
import { apiKeyMatches, keyIdOf } from "../../src/domain/api-keys.ts";
import { usageRecordJson } from "../../src/presentation/usage-json.ts";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { paidSeedRecord, type SeedRecord, seedUsage } from "../support/usage-fixtures.ts";

const PROJECT = fileURLToPath(new URL("../../", import.meta.url));
const BIN = join(PROJECT, "bin", "tds.mjs");
const dir = mkdtempSync(join(tmpdir(), "tds-cli-test-"));
after(() => rmSync(dir, { recursive: true, force: true }));
const DB_FILE = join(dir, "db", "tds.sqlite");

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Everything the CLI printed in this file, to check that no stored hash ever appears. */
const transcript: string[] = [];

function cleanEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) if (!name.startsWith("TDS_") && name !== "NODE_OPTIONS") env[name] = value;
  return { ...env, ...extra };
}

function runProcess(command: string, args: string[], env: Record<string, string>): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: PROJECT, env: cleanEnv(env), stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    child.on("error", reject);
    child.on("close", (code) => {
      transcript.push(stdout, stderr);
      resolve({ code, stdout, stderr });
    });
  });
}

/** `node --import tsx src/cli/main.ts …` against the test database. */
function tds(args: string[], env: Record<string, string> = {}): Promise<Run> {
  return runProcess(process.execPath, ["--import", "tsx", "src/cli/main.ts", ...args], { TDS_DATABASE_URL: `sqlite:${DB_FILE}`, ...env });
}

function json<T = Record<string, unknown>>(run: Run): T {
  assert.equal(run.code, 0, `exit 0 expected; stderr: ${run.stderr}`);
  return JSON.parse(run.stdout) as T;
}

function openDb(): Database.Database {
  return new Database(DB_FILE, { readonly: true, fileMustExist: true });
}

/** The database file and any -wal/-shm/-journal files next to it. */
function databaseBytes(): Buffer {
  const folder = join(dir, "db");
  return Buffer.concat(
    readdirSync(folder)
      .filter((f) => f.startsWith("tds.sqlite"))
      .map((f) => readFileSync(join(folder, f))),
  );
}

const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

describe("tds CLI", () => {
  const state: { acmeId?: string; keyId?: string; rawKey?: string } = {};

  it("prints usage for --help and help (exit 0), and on stderr with exit 2 when called with nothing", async () => {
    const help = await tds(["--help"]);
    assert.equal(help.code, 0);
    assert.match(help.stdout, /^Usage: tds <group> <command>/);
    for (const line of [
      "tds org create NAME",
      "tds org list",
      "tds org pause ORG",
      "tds org resume ORG",
      "tds key create --org ORG [--name NAME]",
      "tds key list --org ORG",
      "tds key revoke KEY_ID",
      "--json",
      "--database URL",
    ]) {
      assert.ok(help.stdout.includes(line), `usage mentions ${line}`);
    }
    assert.equal((await tds(["help"])).stdout, help.stdout);
    const keyHelp = await tds(["key", "create", "--help"]);
    assert.equal(keyHelp.code, 0);
    assert.match(keyHelp.stdout, /Usage: tds key create --org ORG \[--name NAME\]/);
    const none = await tds([]);
    assert.equal(none.code, 2);
    assert.equal(none.stdout, "");
    assert.match(none.stderr, /Usage: tds/);
  });

  it("exits 2 with usage on stderr for bad usage", async () => {
    const cases: string[][] = [
      ["bogus"],
      ["org"],
      ["org", "destroy"],
      ["org", "create"],
      ["org", "create", "a", "b"],
      ["org", "list", "--bogus"],
      ["key", "create"],
      ["key", "create", "--org"],
      ["key", "revoke"],
      ["org", "create", "   "],
    ];
    const runs = await Promise.all(cases.map((args) => tds(args)));
    for (const [i, args] of cases.entries()) {
      const run = runs[i]!;
      assert.equal(run.code, 2, `tds ${args.join(" ")}: ${run.stderr}`);
      assert.equal(run.stdout, "", `tds ${args.join(" ")} prints nothing on stdout`);
      assert.match(run.stderr, /Usage: tds/, `tds ${args.join(" ")}`);
    }
  });

  it("never creates the database: a command on a missing one exits 1 naming it; tds init creates it", async () => {
    const missing = await tds(["org", "list"]);
    assert.equal(missing.code, 1);
    assert.match(
      missing.stderr,
      new RegExp(`^tds: No database at ${DB_FILE} \\(TDS_DATABASE_URL\\); the CLI never creates one\\..*tds init`),
    );
    assert.deepEqual(
      readdirSync(dir).filter((f) => f === "db"),
      [],
      "nothing was created",
    );
    const init = json<{ created: boolean; database: string; schema_version: number }>(await tds(["init", "--json"]));
    assert.deepEqual({ created: init.created, database: init.database }, { created: true, database: `SQLite database ${DB_FILE}` });
    assert.ok(init.schema_version >= 6);
    assert.equal(json<{ created: boolean }>(await tds(["init", "--json"])).created, false, "idempotent");
  });

  it("creates organizations and prints each as one JSON document", async () => {
    const acme = json(await tds(["org", "create", "Acme Ltd", "--json"]));
    assert.deepEqual(Object.keys(acme), ["id", "name", "paused", "created_at"]);
    assert.match(acme.id as string, /^org_[a-z0-9]{12}$/);
    assert.equal(acme.name, "Acme Ltd");
    assert.equal(acme.paused, false);
    assert.match(acme.created_at as string, ISO);
    assert.ok(Math.abs(Date.parse(acme.created_at as string) - Date.now()) < 60_000);
    state.acmeId = acme.id as string;

    const human = await tds(["org", "create", "Zürich ☕ 組織"]);
    assert.equal(human.code, 0, human.stderr);
    assert.match(human.stdout, /Created organization org_[a-z0-9]{12} \("Zürich ☕ 組織"\)/);

    const db = openDb();
    try {
      assert.deepEqual(db.prepare("SELECT name FROM organizations ORDER BY created_at_ms").pluck().all(), ["Acme Ltd", "Zürich ☕ 組織"]);
    } finally {
      db.close();
    }
  });

  it("refuses a duplicate organization name with exit 1", async () => {
    const run = await tds(["org", "create", "Acme Ltd", "--json"]);
    assert.equal(run.code, 1);
    assert.equal(run.stdout, "");
    assert.match(run.stderr, /already exists/);
  });

  it("lists organizations as a JSON array and as a table", async () => {
    const list = json<Record<string, unknown>[]>(await tds(["org", "list", "--json"]));
    assert.deepEqual(
      list.map((o) => o.name),
      ["Acme Ltd", "Zürich ☕ 組織"],
    );
    assert.deepEqual(list[0], { id: state.acmeId, name: "Acme Ltd", paused: false, created_at: list[0]?.created_at });
    const table = await tds(["org", "list"]);
    assert.equal(table.code, 0);
    assert.match(table.stdout, /^ID\s+NAME\s+STATUS\s+CREATED\n/);
    assert.ok(table.stdout.includes(state.acmeId!));
    assert.ok(table.stdout.includes("Zürich ☕ 組織"));
  });

  it("creates a key shown once: it verifies against the stored hash, which is all that is stored", async () => {
    const created = json(await tds(["key", "create", "--org", "Acme Ltd", "--name", "ci", "--json"]));
    assert.deepEqual(Object.keys(created), [
      "id",
      "org_id",
      "name",
      "key",
      "created_at",
      "expires_at",
      "models",
      "requests_per_minute",
      "budget",
    ]);
    assert.deepEqual(created, {
      id: created.id,
      org_id: state.acmeId,
      name: "ci",
      key: created.key,
      created_at: created.created_at,
      expires_at: null,
      models: null,
      requests_per_minute: null,
      budget: null,
    });
    assert.match(created.created_at as string, ISO);
    const raw = created.key as string;
    assert.equal(keyIdOf(raw), created.id);
    state.keyId = created.id as string;
    state.rawKey = raw;

    const db = openDb();
    let row: Record<string, unknown>;
    try {
      row = db.prepare("SELECT * FROM api_keys WHERE id = ?").get(created.id) as Record<string, unknown>;
    } finally {
      db.close();
    }
    assert.equal(row.org_id, state.acmeId);
    assert.equal(row.name, "ci");
    assert.equal(row.revoked_at_ms, null);
    assert.deepEqual(
      {
        expires_at_ms: row.expires_at_ms,
        models: row.models,
        requests_per_minute: row.requests_per_minute,
        budget_microusd: row.budget_microusd,
        budget_period: row.budget_period,
        replaced_by: row.replaced_by,
        retires_at_ms: row.retires_at_ms,
        last_used_at_ms: row.last_used_at_ms,
      },
      {
        expires_at_ms: null,
        models: null,
        requests_per_minute: null,
        budget_microusd: null,
        budget_period: null,
        replaced_by: null,
        retires_at_ms: null,
        last_used_at_ms: null,
      },
      "no settings of its own",
    );
    assert.ok(apiKeyMatches(raw, row.hash as string), "the raw key matches the stored hash");
    assert.ok(!apiKeyMatches(`${raw.slice(0, -1)}${raw.endsWith("A") ? "B" : "A"}`, row.hash as string));

    const bytes = databaseBytes();
    assert.ok(bytes.includes(Buffer.from(row.hash as string)), "the hash is in the database file (the right file is read)");
    assert.ok(!bytes.includes(Buffer.from(raw)), "the raw key is not in the database");
    // tds_<12-char id>_<secret>: the secret itself may contain "_", so cut at the fixed offset.
    assert.ok(!bytes.includes(Buffer.from(raw.slice("tds_".length + 12 + 1))), "nor its secret part");
  });

  it("prints a created key once, with a warning, in human output", async () => {
    const run = await tds(["key", "create", "--org", state.acmeId!]);
    assert.equal(run.code, 0, run.stderr);
    const keys = run.stdout.match(/tds_[a-z0-9]{12}_[A-Za-z0-9_-]{43}/g) ?? [];
    assert.equal(keys.length, 1, "the key appears exactly once");
    assert.match(run.stdout, /cannot be shown again/);
    assert.ok(!databaseBytes().includes(Buffer.from(keys[0]!)));
  });

  it("lists keys without hashes or raw keys", async () => {
    const list = json<Record<string, unknown>[]>(await tds(["key", "list", "--org", "Acme Ltd", "--json"]));
    assert.equal(list.length, 2);
    const noSettings = {
      expires_at: null,
      models: null,
      requests_per_minute: null,
      budget: null,
      replaced_by: null,
      retires_at: null,
      last_used_at: null,
    };
    assert.deepEqual(Object.keys(list[0]!), ["id", "org_id", "name", "created_at", "revoked_at", ...Object.keys(noSettings)]);
    assert.deepEqual(list[0], {
      id: state.keyId,
      org_id: state.acmeId,
      name: "ci",
      created_at: list[0]?.created_at,
      revoked_at: null,
      ...noSettings,
    });
    assert.deepEqual(list[1], {
      id: list[1]?.id,
      org_id: state.acmeId,
      name: null,
      created_at: list[1]?.created_at,
      revoked_at: null,
      ...noSettings,
    });
    const table = await tds(["key", "list", "--org", state.acmeId!]);
    assert.equal(table.code, 0);
    assert.match(table.stdout, /^ID\s+NAME\s+STATUS\s+CREATED\s+LAST USED\s+LIMITS\s+REVOKED \/ REPLACED\n/);
    assert.ok(table.stdout.includes(state.keyId!));
    assert.ok(!table.stdout.includes(state.rawKey!));
  });

  it("exits 1 with a message on stderr for an unknown organization or key", async () => {
    const cases: string[][] = [
      ["key", "create", "--org", "No Such Org", "--json"],
      ["key", "list", "--org", "org_000000000000"],
      ["org", "pause", "nobody"],
      ["org", "resume", "nobody", "--json"],
      ["key", "revoke", "zzzzzzzzzzzz"],
      ["key", "revoke", `tds_zzzzzzzzzzzz_${"A".repeat(43)}`],
    ];
    const runs = await Promise.all(cases.map((args) => tds(args)));
    for (const [i, args] of cases.entries()) {
      const run = runs[i]!;
      assert.equal(run.code, 1, `tds ${args.join(" ")}: ${run.stderr}`);
      assert.equal(run.stdout, "");
      assert.match(run.stderr, /^tds: /);
      assert.doesNotMatch(run.stderr, /Usage:/);
    }
  });

  it("pauses and resumes an organization", async () => {
    const paused = json(await tds(["org", "pause", "Acme Ltd", "--json"]));
    assert.equal(paused.paused, true);
    const db = openDb();
    try {
      assert.equal(db.prepare("SELECT paused FROM organizations WHERE id = ?").pluck().get(state.acmeId), 1);
    } finally {
      db.close();
    }
    const again = await tds(["org", "pause", state.acmeId!]);
    assert.equal(again.code, 0);
    assert.match(again.stdout, /already paused/);
    const list = json<Record<string, unknown>[]>(await tds(["org", "list", "--json"]));
    assert.equal(list.find((o) => o.id === state.acmeId)?.paused, true);
    const resumed = json(await tds(["org", "resume", state.acmeId!, "--json"]));
    assert.equal(resumed.paused, false);
  });

  it("revokes a key; revoking it again says so", async () => {
    const revoked = json(await tds(["key", "revoke", state.keyId!, "--json"]));
    assert.equal(revoked.id, state.keyId);
    assert.match(revoked.revoked_at as string, ISO);
    const db = openDb();
    try {
      assert.equal(typeof db.prepare("SELECT revoked_at_ms FROM api_keys WHERE id = ?").pluck().get(state.keyId), "number");
    } finally {
      db.close();
    }
    const again = await tds(["key", "revoke", state.keyId!]);
    assert.equal(again.code, 0);
    assert.match(again.stdout, /already revoked/);
    const list = json<Record<string, unknown>[]>(await tds(["key", "list", "--org", "Acme Ltd", "--json"]));
    assert.equal(list.find((k) => k.id === state.keyId)?.revoked_at, revoked.revoked_at);
  });

  it("--database overrides TDS_DATABASE_URL; a bad URL exits 1", async () => {
    const other = join(dir, "other", "x.sqlite");
    assert.equal((await tds(["--database", `sqlite:${other}`, "init"], { TDS_DATABASE_URL: "mysql://nowhere/db" })).code, 0);
    const created = json(
      await tds(["--database", `sqlite:${other}`, "org", "create", "Elsewhere", "--json"], { TDS_DATABASE_URL: "mysql://nowhere/db" }),
    );
    assert.equal(created.name, "Elsewhere");
    const list = json<unknown[]>(await tds(["org", "list", "--json", `--database=${other}`]));
    assert.equal(list.length, 1);
    const bad = await tds(["org", "list"], { TDS_DATABASE_URL: "mysql://nowhere/db" });
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /accepted forms/);
    const pg = await tds(["org", "list"], { TDS_DATABASE_URL: "postgres://127.0.0.1:1/tds" });
    assert.equal(pg.code, 1, "an unreachable PostgreSQL is an error, reported on stderr");
    assert.match(pg.stderr, /ECONNREFUSED|connect/);
  });

  it("runs through the bin/tds.mjs launcher", async () => {
    assert.ok((statSync(BIN).mode & 0o111) !== 0, "bin/tds.mjs is executable");
    const run = await runProcess(BIN, ["org", "list", "--json"], { TDS_DATABASE_URL: `sqlite:${DB_FILE}` });
    const list = JSON.parse(run.stdout) as { name: string }[];
    assert.equal(run.code, 0, run.stderr);
    assert.deepEqual(
      list.map((o) => o.name),
      ["Acme Ltd", "Zürich ☕ 組織"],
    );
    const bad = await runProcess(BIN, ["org", "pause", "nobody"], { TDS_DATABASE_URL: `sqlite:${DB_FILE}` });
    assert.equal(bad.code, 1);
  });

  it("never printed a stored hash", () => {
    const db = openDb();
    let hashes: string[];
    try {
      hashes = db.prepare("SELECT hash FROM api_keys").pluck().all() as string[];
    } finally {
      db.close();
    }
    assert.ok(hashes.length >= 2);
    const printed = transcript.join("\n");
    for (const hash of hashes) assert.ok(!printed.includes(hash));
  });
});

describe("tds credits and tds usage", () => {
  // In-process runs (runCli) on a database of their own, plus two spawned runs through main.ts.
  const CREDITS_DB = join(dir, "credits", "tds.sqlite");
  const ids: { acme?: string; other?: string } = {};

  async function run(args: string[]): Promise<Run> {
    let stdout = "";
    let stderr = "";
    const code = await runCli(args, {
      stdout: { write: (text: string) => (stdout += text) },
      stderr: { write: (text: string) => (stderr += text) },
      env: { TDS_DATABASE_URL: `sqlite:${CREDITS_DB}` },
      nowMs: () => T0 + 60_000,
    });
    transcript.push(stdout, stderr);
    return { code, stdout, stderr };
  }
  before(async () => assert.equal((await run(["init"])).code, 0));

  const T0 = Date.UTC(2026, 0, 1);
  const record = (requestId: string, orgId: string, overrides: Partial<SeedRecord> = {}) => paidSeedRecord(requestId, orgId, T0, overrides);

  it("grants credits given in USD and shows the balance in USD and microUSD", async () => {
    ids.acme = json(await run(["org", "create", "Acme", "--json"])).id as string;
    ids.other = json(await run(["org", "create", "Other", "--json"])).id as string;
    const zero = json(await run(["credits", "show", "--org", "Acme", "--json"]));
    assert.deepEqual(zero, {
      org_id: ids.acme,
      available_microusd: 0,
      available_usd: "0",
      reserved_microusd: 0,
      reserved_usd: "0",
      spent_microusd: 0,
      spent_usd: "0",
      granted_microusd: 0,
      granted_usd: "0",
    });
    const granted = json(await run(["credits", "grant", "--org", "Acme", "--usd", "12.50", "--note", "invoice 7", "--json"]));
    assert.deepEqual(Object.keys(granted), Object.keys(zero), "grant prints the balance, same shape as show");
    assert.deepEqual(
      [granted.available_microusd, granted.available_usd, granted.granted_microusd, granted.granted_usd],
      [12_500_000, "12.5", 12_500_000, "12.5"],
    );
    const human = await run(["credits", "grant", "--org", ids.acme!, "--usd", "0.000001"]);
    assert.equal(human.code, 0, human.stderr);
    assert.match(human.stdout, /Granted 0\.000001 USD to organization org_[a-z0-9]{12} \("Acme"\)/);
    const shown = json(await run(["credits", "show", "--org", ids.acme!, "--json"]));
    assert.deepEqual(
      [shown.available_microusd, shown.available_usd, shown.reserved_usd, shown.spent_usd, shown.granted_usd],
      [12_500_001, "12.500001", "0", "0", "12.500001"],
    );
    const table = await run(["credits", "show", "--org", "Acme"]);
    assert.equal(table.code, 0);
    assert.match(table.stdout, /available\s+12\.500001\s+12500001\n/);
    assert.match(table.stdout, /granted\s+12\.500001\s+12500001\n/);

    const store = openSqliteStore(CREDITS_DB);
    try {
      const ledger = await store.listLedger(ids.acme);
      assert.deepEqual(
        ledger.map((e) => [e.kind, e.availableDelta, e.grantedDelta, e.note, e.createdAtMs]),
        [
          ["grant", 12_500_000, 12_500_000, "invoice 7", T0 + 60_000],
          ["grant", 1, 1, null, T0 + 60_000],
        ],
      );
      assert.deepEqual(await store.getBalance(ids.other), { available: 0, reserved: 0, spent: 0, granted: 0 });
    } finally {
      await store.close();
    }
  });

  it("exits 2 with usage on stderr for bad credits or usage arguments, 1 for an unknown organization", async () => {
    const usage: string[][] = [
      ["credits", "grant", "--org", "Acme"],
      ["credits", "grant", "--org", "Acme", "--usd", "0"],
      ["credits", "grant", "--org", "Acme", "--usd", "-1"],
      ["credits", "grant", "--org", "Acme", "--usd", "1.0000001"],
      ["credits", "grant", "--org", "Acme", "--usd", "1e3"],
      ["credits", "grant", "--usd", "5"],
      ["credits", "show"],
      ["credits", "show", "--org", "Acme", "extra"],
      ["usage"],
      ["usage", "--org", "Acme", "--limit", "0"],
      ["usage", "--org", "Acme", "--limit", "abc"],
      ["usage", "--org", "Acme", "--outcome", "exploded"],
      ["usage", "--org", "Acme", "--request-id", "req_a", "--limit", "5"],
      ["usage", "--org", "Acme", "--bogus"],
    ];
    for (const args of usage) {
      const r = await run(args);
      assert.equal(r.code, 2, `tds ${args.join(" ")}: ${r.stderr}`);
      assert.equal(r.stdout, "");
      assert.match(r.stderr, /Usage: tds (credits|usage)/, `tds ${args.join(" ")}`);
    }
    const unknown: string[][] = [
      ["credits", "grant", "--org", "Nobody", "--usd", "1", "--json"],
      ["credits", "show", "--org", "Nobody"],
      ["usage", "--org", "Nobody", "--json"],
    ];
    for (const args of unknown) {
      const r = await run(args);
      assert.equal(r.code, 1, `tds ${args.join(" ")}: ${r.stderr}`);
      assert.equal(r.stdout, "");
      assert.match(r.stderr, /^tds: No organization/);
    }
    const store = openSqliteStore(CREDITS_DB);
    try {
      assert.equal((await store.getBalance(ids.acme!)).granted, 12_500_001, "nothing was granted by the refused commands");
    } finally {
      await store.close();
    }
  });

  it("lists usage records newest first, filtered and limited, and shows one by request id", async () => {
    const store = openSqliteStore(CREDITS_DB);
    try {
      await seedUsage(store, [record("req_a", ids.acme!, { createdAtMs: T0 + 1000 })]);
      await seedUsage(store, [
        record("req_b", ids.acme!, {
          createdAtMs: T0 + 2000,
          source: "playground",
          outcome: "model_error",
          httpStatus: 502,
          inputTokens: 0,
          outputTokens: 0,
          costMicrousd: 0,
          latencyMs: null,
          errorDetail: "model timed out",
        }),
      ]);
      await seedUsage(store, [record("req_c", ids.acme!, { createdAtMs: T0 + 3000, costMicrousd: 2_000_000, overReservation: true })]);
      await seedUsage(store, [record("req_other", ids.other!, { createdAtMs: T0 + 4000 })]);
    } finally {
      await store.close();
    }

    const all = json<Record<string, unknown>[]>(await run(["usage", "--org", "Acme", "--json"]));
    assert.deepEqual(
      all.map((r) => r.request_id),
      ["req_c", "req_b", "req_a"],
    );
    assert.deepEqual(all[1], {
      request_id: "req_b",
      created_at: "2026-01-01T00:00:02.000Z",
      completed_at: "2026-01-01T00:00:02.000Z",
      key_id: "key_1",
      source: "playground",
      model: "jev-1",
      service_mode: "paid",
      outcome: "model_error",
      http_status: 502,
      input_tokens: 0,
      output_tokens: 0,
      cost_microusd: 0,
      cost_usd: "0",
      latency_ms: null,
      gateway_latency_ms: 14.25,
      over_reservation: false,
      error: "model timed out",
      deployment: null,
      attempts: 0,
    });
    assert.deepEqual([all[0]?.cost_microusd, all[0]?.cost_usd, all[0]?.over_reservation], [2_000_000, "2", true]);
    assert.equal(
      JSON.stringify(all[0]),
      JSON.stringify(
        usageRecordJson({
          ...record("req_c", ids.acme!, { createdAtMs: T0 + 3000, costMicrousd: 2_000_000, overReservation: true }),
          completedAtMs: T0 + 3000,
          deployment: null,
          attempts: 0,
        }),
      ),
      "exactly usageRecordJson, key order included",
    );

    const limited = json<Record<string, unknown>[]>(await run(["usage", "--org", ids.acme!, "--limit", "2", "--json"]));
    assert.deepEqual(
      limited.map((r) => r.request_id),
      ["req_c", "req_b"],
    );
    const failed = json<Record<string, unknown>[]>(await run(["usage", "--org", "Acme", "--outcome", "model_error", "--json"]));
    assert.deepEqual(
      failed.map((r) => r.request_id),
      ["req_b"],
    );
    assert.deepEqual(json<unknown[]>(await run(["usage", "--org", "Acme", "--outcome", "reservation_expired", "--json"])), []);

    const one = json(await run(["usage", "--org", "Acme", "--request-id", "req_b", "--json"]));
    assert.deepEqual(one, all[1]);
    const elsewhere = await run(["usage", "--org", "Acme", "--request-id", "req_other", "--json"]);
    assert.equal(elsewhere.code, 1, "another organization's record is not found");
    assert.equal(elsewhere.stdout, "");
    assert.match(elsewhere.stderr, /^tds: No usage record with request id "req_other" in organization/);
    assert.equal((await run(["usage", "--org", "Acme", "--request-id", "req_missing"])).code, 1);

    const table = await run(["usage", "--org", "Acme", "--limit", "2"]);
    assert.equal(table.code, 0, table.stderr);
    assert.match(table.stdout, /^CREATED\s+REQUEST ID\s+OUTCOME\s+STATUS/);
    assert.match(table.stdout, /2026-01-01T00:00:03\.000Z\s+req_c\s+succeeded\*\s+200\s+jev-1\s+paid\s+api\s+120\s+7\s+2\s/);
    assert.ok(!table.stdout.includes("req_a"));
    assert.match(table.stderr, /more with --limit/);
    const detail = await run(["usage", "--org", "Acme", "--request-id", "req_b"]);
    assert.match(detail.stdout, /^request_id:\s+req_b$/m);
    assert.match(detail.stdout, /^error:\s+model timed out$/m);
    const none = await run(["usage", "--org", "Other", "--outcome", "model_error"]);
    assert.match(none.stdout, /has no usage records with outcome model_error/);
  });

  it("runs credits and usage through main.ts, and lists them in the help", async () => {
    const env = { TDS_DATABASE_URL: `sqlite:${CREDITS_DB}` };
    const [shown, listed, help] = await Promise.all([
      tds(["credits", "show", "--org", "Acme", "--json"], env),
      tds(["--json", "usage", "--org", ids.acme!, "--limit", "1"], env),
      run(["--help"]),
    ]);
    assert.equal(json(shown).available_usd, "12.500001");
    assert.deepEqual(
      json<Record<string, unknown>[]>(listed).map((r) => r.request_id),
      ["req_c"],
    );
    for (const line of [
      "tds credits grant --org ORG --usd USD",
      "tds credits show --org ORG",
      "tds usage --org ORG [--request-id ID] [--limit N] [--outcome O]",
    ]) {
      assert.ok(help.stdout.includes(line), `usage mentions ${line}`);
    }
    const usageHelp = await run(["help", "usage"]);
    assert.match(usageHelp.stdout, /^Usage: tds usage --org ORG/);
  });
});
