/**
 * The `tds` CLI through a gateway's admin API (--url / TDS_URL): every command runs once on a database and once over
 * HTTP against a gateway of its own, with the same steps, and prints the same (ids and times masked). Plus the HTTP
 * failures, the transport's usage errors, and the audit log: source "cli" with the operator as client on the database,
 * "http" with client "cli:OPERATOR" over the admin API.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { type AddressInfo, createServer } from "node:net";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { auditEntryJson } from "../../src/admin/admin-json.ts";
import { runCli } from "../../src/cli/cli.ts";
import { keyIdOf } from "../../src/domain/api-keys.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";
import { paidSeedRecord, type SeedRecord, seedUsage } from "../support/usage-fixtures.ts";

/** A port nothing listens on (fetch refuses some low ports outright, such as 1). */
async function unusedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

const TOKEN = "adm-Qw3rTy8uI0pAs5dFg7hJk2lZx4cVb6nM";
/** Who runs the CLI here (instead of the OS user), for the audit log. */
const OPERATOR = "ops-alice";
const PROJECT = fileURLToPath(new URL("../../", import.meta.url));

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

type Mode = "db" | "http";

async function cli(args: string[], env: Record<string, string>): Promise<Run> {
  let stdout = "";
  let stderr = "";
  const code = await runCli(args, {
    stdout: { write: (t: string) => (stdout += t) },
    stderr: { write: (t: string) => (stderr += t) },
    env,
    operator: () => OPERATOR,
  });
  return { code, stdout, stderr };
}

function json<T = Record<string, unknown>>(run: Run): T {
  assert.equal(run.code, 0, `exit 0 expected; stderr: ${run.stderr}`);
  return JSON.parse(run.stdout) as T;
}

/**
 * Replaces what differs between two runs of the same steps: organization and key ids (numbered in order of first
 * appearance, so the same organization gets the same label in both), keys, times and days.
 */
class Masker {
  private readonly labels = new Map<string, string>();

  constructor(known: Record<string, string>) {
    for (const [id, label] of Object.entries(known)) this.labels.set(id, label);
  }

  private label(id: string, kind: string): string {
    let label = this.labels.get(id);
    if (!label) {
      label = `<${kind}${[...this.labels.values()].filter((l) => l.startsWith(`<${kind}`)).length + 1}>`;
      this.labels.set(id, label);
    }
    return label;
  }

  mask(text: string): string {
    for (const match of text.matchAll(/org_[a-z0-9]{12}/g)) this.label(match[0], "org");
    for (const match of text.matchAll(/tds_([a-z0-9]{12})_[A-Za-z0-9_-]{43}/g)) this.label(match[1]!, "key");
    let out = text.replace(/tds_[a-z0-9]{12}_[A-Za-z0-9_-]{43}/g, "<raw key>");
    for (const [id, label] of this.labels) out = out.split(id).join(label);
    return out.replace(/\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z/g, "<time>").replace(/\d{4}-\d{2}-\d{2}/g, "<day>");
  }

  /** A key id learnt from JSON output (human output shows the whole key, from which mask() learns it). */
  learn(id: string, kind: string): void {
    this.label(id, kind);
  }
}

const T0 = Date.UTC(2026, 0, 1);
const record = (requestId: string, orgId: string, overrides: Partial<SeedRecord> = {}) => paidSeedRecord(requestId, orgId, T0, overrides);

describe("tds over HTTP (--url, TDS_URL) prints what tds on the database prints", () => {
  const gateways = {} as Record<Mode, Gateway>;
  const maskers = {} as Record<Mode, Masker>;
  const envs = {} as Record<Mode, Record<string, string>>;
  const state = {} as Record<Mode, { acme: string; rawKey: string; keyId: string }>;

  before(async () => {
    const [db, http] = await Promise.all([
      startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: TOKEN } }),
      startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: TOKEN } }),
    ]);
    gateways.db = db;
    gateways.http = http;
    // The database mode's preview limit comes from the configuration; the harness's gateways run with this one.
    envs.db = { TDS_DATABASE_URL: db.config.databaseUrl, TDS_PREVIEW_REQUEST_LIMIT: String(db.config.limits.previewRequestLimit) };
    envs.http = { TDS_URL: http.url, TDS_ADMIN_TOKEN: TOKEN };
    for (const mode of ["db", "http"] as const) {
      maskers[mode] = new Masker({ [gateways[mode].orgId]: "<test-org>", [gateways[mode].keyId]: "<test-key>" });
    }
  });
  after(async () => {
    await Promise.all(Object.values(gateways).map((gw) => gw.close()));
  });

  /** Runs the same command in both modes; returns both runs after checking that they print the same, masked. */
  async function both(args: string[] | ((mode: Mode) => string[])): Promise<Record<Mode, Run>> {
    const argsOf = (mode: Mode) => (typeof args === "function" ? args(mode) : args);
    const runs = { db: await cli(argsOf("db"), envs.db), http: await cli(argsOf("http"), envs.http) };
    const label = `tds ${argsOf("http").join(" ")}`;
    assert.equal(runs.http.code, runs.db.code, `${label}: the same exit code (stderr: ${runs.db.stderr} / ${runs.http.stderr})`);
    assert.equal(maskers.http.mask(runs.http.stdout), maskers.db.mask(runs.db.stdout), `${label}: the same stdout`);
    assert.equal(maskers.http.mask(runs.http.stderr), maskers.db.mask(runs.db.stderr), `${label}: the same stderr`);
    return runs;
  }

  it("creates, lists and shows organizations", async () => {
    const created = await both(["org", "create", "Acme Ltd", "--json"]);
    for (const mode of ["db", "http"] as const) {
      const org = json(created[mode]);
      assert.deepEqual(Object.keys(org), ["id", "name", "paused", "created_at"]);
      state[mode] = { acme: org.id as string, rawKey: "", keyId: "" };
    }
    const human = await both(["org", "create", "Zürich ☕ 組織"]);
    assert.match(human.http.stdout, /^Created organization org_[a-z0-9]{12} \("Zürich ☕ 組織"\)\./);
    const taken = await both(["org", "create", "Acme Ltd"]);
    assert.equal(taken.http.code, 1);
    assert.equal(taken.http.stderr, 'tds: An organization named "Acme Ltd" already exists.\n');

    const list = await both(["org", "list", "--json"]);
    assert.deepEqual(
      json<{ name: string }[]>(list.http).map((o) => o.name),
      ["test-org", "Acme Ltd", "Zürich ☕ 組織"],
    );
    await both(["org", "list"]);

    const shown = await both(["org", "show", "Acme Ltd", "--json"]);
    const status = json(shown.http);
    assert.deepEqual(Object.keys(status), ["id", "name", "paused", "created_at", "balance", "preview", "keys"]);
    assert.deepEqual(status.keys, { active: 0, revoked: 0 });
    const text = await both((mode) => ["org", "show", state[mode].acme]);
    assert.match(text.http.stdout, /^Organization org_[a-z0-9]{12} \("Acme Ltd"\): active, created /);
    assert.match(text.http.stdout, /^Credits \(USD\): available 0, reserved 0, spent 0, granted 0$/m);
    assert.match(text.http.stdout, /^Preview today \(\d{4}-\d{2}-\d{2}\): 0 of \d+ requests used/m);
    assert.match(text.http.stdout, /^API keys: 0 active, 0 revoked$/m);
  });

  it("creates and lists keys; a paused organization's new key comes with a note", async () => {
    const created = await both(["key", "create", "--org", "Acme Ltd", "--name", "ci", "--json"]);
    for (const mode of ["db", "http"] as const) {
      const key = json(created[mode]);
      assert.deepEqual(key, {
        id: key.id,
        org_id: state[mode].acme,
        name: "ci",
        key: key.key,
        created_at: key.created_at,
        expires_at: null,
        models: null,
        requests_per_minute: null,
        budget: null,
      });
      assert.equal(keyIdOf(key.key as string), key.id);
      maskers[mode].learn(key.id as string, "key");
      state[mode].rawKey = key.key as string;
      state[mode].keyId = key.id as string;
    }
    const human = await both(["key", "create", "--org", "Acme Ltd"]);
    assert.match(human.http.stdout, /cannot be shown again/);
    await both(["key", "list", "--org", "Acme Ltd", "--json"]);
    const table = await both((mode) => ["key", "list", "--org", state[mode].acme]);
    assert.match(table.http.stdout, /^ID\s+NAME\s+STATUS\s+CREATED\s+LAST USED\s+LIMITS\s+REVOKED \/ REPLACED\n/);
    assert.match(table.http.stdout, /^[a-z0-9]{12}\s+ci\s+active\s+\S+\s+never\s+no limits of its own\n/m);

    await both(["org", "pause", "Acme Ltd"]);
    const again = await both(["org", "pause", "Acme Ltd", "--json"]);
    assert.equal(json(again.http).paused, true);
    await both(["org", "pause", "Acme Ltd"]);
    const paused = await both(["key", "create", "--org", "Acme Ltd", "--name", "while paused"]);
    assert.match(paused.http.stderr, /^Note: organization .* is paused/);
    await both(["org", "show", "Acme Ltd"]);
    await both(["org", "resume", "Acme Ltd", "--json"]);
    await both(["org", "resume", "Acme Ltd"]);
    await both(["org", "list"]);
  });

  it("grants credits, once per idempotency key, and shows them", async () => {
    await both(["credits", "show", "--org", "Acme Ltd", "--json"]);
    const granted = await both(["credits", "grant", "--org", "Acme Ltd", "--usd", "12.50", "--note", "invoice 7", "--json"]);
    assert.equal(json(granted.http).granted_usd, "12.5");
    await both(["credits", "grant", "--org", "Acme Ltd", "--usd", "0.000001"]);

    const first = await both(["credits", "grant", "--org", "Acme Ltd", "--usd", "5", "--idempotency-key", "invoice-8"]);
    assert.match(first.http.stdout, /^Granted 5 USD to organization/);
    const replay = await both(["credits", "grant", "--org", "Acme Ltd", "--usd", "5", "--idempotency-key", "invoice-8"]);
    assert.match(
      replay.http.stdout,
      /^Already granted with this idempotency key; nothing granted again\.\nAvailable after that grant: 17\.500001 USD/,
    );
    const replayJson = await both(["credits", "grant", "--org", "Acme Ltd", "--usd", "5", "--idempotency-key", "invoice-8", "--json"]);
    assert.equal(json(replayJson.http).granted_usd, "17.500001");
    assert.match(replayJson.http.stderr, /^Already granted with this idempotency key/);
    const reused = await both(["credits", "grant", "--org", "Acme Ltd", "--usd", "6", "--idempotency-key", "invoice-8"]);
    assert.equal(reused.http.code, 1);
    assert.match(reused.http.stderr, /already used with a different grant/);

    const shown = await both(["credits", "show", "--org", "Acme Ltd"]);
    assert.match(shown.http.stdout, /granted\s+17\.500001\s+17500001\n/);
    for (const mode of ["db", "http"] as const) {
      const ledger = await gateways[mode].store.listLedger(state[mode].acme);
      assert.deepEqual(
        ledger.map((e) => e.grantedDelta),
        [12_500_000, 1, 5_000_000],
        `${mode}: the keyed grant is in the ledger once`,
      );
    }
  });

  it("lists usage records and finds one by request id", async () => {
    const none = await both(["usage", "--org", "Acme Ltd"]);
    assert.match(none.http.stdout, /has no usage records\.\n$/);
    for (const mode of ["db", "http"] as const) {
      const org = state[mode].acme;
      const { store } = gateways[mode];
      await seedUsage(store, [record("req_a", org, { createdAtMs: T0 + 1000 })]);
      await seedUsage(store, [
        record("req_b", org, {
          createdAtMs: T0 + 2000,
          outcome: "model_error",
          httpStatus: 502,
          costMicrousd: 0,
          latencyMs: null,
          errorDetail: "model timed out",
        }),
      ]);
      await seedUsage(store, [record("req_c", org, { createdAtMs: T0 + 3000, costMicrousd: 2_000_000, overReservation: true })]);
    }
    const all = await both(["usage", "--org", "Acme Ltd", "--json"]);
    assert.deepEqual(
      json<{ request_id: string }[]>(all.http).map((r) => r.request_id),
      ["req_c", "req_b", "req_a"],
    );
    await both(["usage", "--org", "Acme Ltd", "--limit", "2"]);
    await both(["usage", "--org", "Acme Ltd", "--outcome", "model_error", "--json"]);
    await both(["usage", "--org", "Acme Ltd", "--outcome", "reservation_expired"]);
    const one = await both(["usage", "--org", "Acme Ltd", "--request-id", "req_b", "--json"]);
    assert.equal(json(one.http).error, "model timed out");
    await both(["usage", "--org", "Acme Ltd", "--request-id", "req_b"]);
    const missing = await both(["usage", "--org", "Acme Ltd", "--request-id", "req_missing"]);
    assert.equal(missing.http.code, 1);
    assert.match(missing.http.stderr, /^tds: No usage record with request id "req_missing" in organization/);
  });

  it("revokes keys by id or by the whole key", async () => {
    const revoked = await both((mode) => ["key", "revoke", state[mode].keyId, "--json"]);
    assert.ok(typeof json(revoked.http).revoked_at === "string");
    const again = await both((mode) => ["key", "revoke", state[mode].keyId]);
    assert.match(again.http.stdout, /^API key .* was already revoked at /);
    const whole = await both((mode) => ["key", "revoke", state[mode].rawKey]);
    assert.match(whole.http.stdout, /already revoked/);
    const fresh = await both(["key", "create", "--org", "Acme Ltd", "--json"]);
    const raws = { db: json(fresh.db).key as string, http: json(fresh.http).key as string };
    const byKey = await both((mode) => ["key", "revoke", raws[mode]]);
    assert.match(
      byKey.http.stdout,
      /^Revoked API key [a-z0-9]{12} of organization org_[a-z0-9]{12} \("Acme Ltd"\); requests with it now get 401\.\n$/,
    );
    await both(["key", "list", "--org", "Acme Ltd"]);
    await both(["org", "show", "Acme Ltd", "--json"]);
  });

  it("exits 1 with the same message for an unknown organization or key", async () => {
    const cases: string[][] = [
      ["org", "show", "Nobody"],
      ["org", "pause", "Nobody", "--json"],
      ["key", "create", "--org", "Nobody"],
      ["key", "list", "--org", "org_000000000000"],
      ["credits", "grant", "--org", "Nobody", "--usd", "1"],
      ["credits", "show", "--org", "Nobody"],
      ["usage", "--org", "Nobody"],
      ["usage", "--org", "Nobody", "--request-id", "req_a"],
      ["audit", "--org", "Nobody"],
      ["key", "revoke", "zzzzzzzzzzzz"],
    ];
    for (const args of cases) {
      const runs = await both(args);
      assert.equal(runs.http.code, 1, `tds ${args.join(" ")}`);
      assert.equal(runs.http.stdout, "");
    }
    const org = await both(["org", "show", "Nobody"]);
    assert.equal(org.http.stderr, 'tds: No organization with id or name "Nobody". See: tds org list\n');
    const key = await both(["key", "revoke", "zzzzzzzzzzzz"]);
    assert.equal(key.http.stderr, 'tds: No API key with id "zzzzzzzzzzzz". See: tds key list --org ORG\n');
  });

  it("exits 2 for bad usage in both modes", async () => {
    for (const args of [
      ["org", "create", "   "],
      ["org", "create", "org_abcdefabcdef"],
      ["key", "create", "--org", "Acme Ltd", "--name", "a\u0007b"],
      ["credits", "grant", "--org", "Acme Ltd", "--usd", "0"],
      ["credits", "grant", "--org", "Acme Ltd", "--usd", "1", "--idempotency-key", "has space"],
      ["audit", "--limit", "0"],
    ]) {
      const runs = await both(args);
      assert.equal(runs.http.code, 2, `tds ${args.join(" ")}`);
    }
  });

  it("records every change in the audit log with the operator: source cli on the database, http with client cli:NAME over the admin API", async () => {
    const audits = { db: await gateways.db.store.listAudit({ limit: 200 }), http: await gateways.http.store.listAudit({ limit: 200 }) };
    const names = new Map(
      [...(await gateways.db.store.listOrganizations()), ...(await gateways.http.store.listOrganizations())].map((o) => [o.id, o.name]),
    );
    const actions = (mode: Mode) => audits[mode].entries.map((e) => e.action);
    assert.deepEqual(actions("http"), actions("db"));
    assert.deepEqual(
      new Set(actions("http")),
      new Set(["organization.created", "key.created", "organization.paused", "organization.resumed", "credits.granted", "key.revoked"]),
    );
    assert.equal(actions("http").filter((a) => a === "credits.granted").length, 3, "the replayed grant is not recorded again");
    for (const e of audits.db.entries) assert.deepEqual([e.source, e.client, e.remoteAddress], ["cli", OPERATOR, null]);
    for (const e of audits.http.entries) assert.deepEqual([e.source, e.client, e.remoteAddress], ["http", `cli:${OPERATOR}`, "127.0.0.1"]);

    for (const mode of ["db", "http"] as const) {
      const run = await cli(["audit", "--limit", "200", "--json"], envs[mode]);
      assert.deepEqual(
        json(run),
        audits[mode].entries.map((e) => auditEntryJson({ ...e, orgName: names.get(e.orgId) ?? null })),
      );
      const table = await cli(["audit", "--org", "Acme Ltd", "--limit", "3"], envs[mode]);
      assert.equal(table.code, 0, table.stderr);
      const lines = table.stdout.trimEnd().split("\n");
      assert.match(lines[0]!, /^TIME\s+ACTION\s+ORGANIZATION\s+TARGET\s+SOURCE\s+CLIENT\s+DETAILS$/);
      assert.equal(lines.length, 4);
      assert.match(
        lines[1]!,
        mode === "db"
          ? /^\S+Z\s+key\.revoked\s+Acme Ltd\s+[a-z0-9]{12}\s+cli\s+ops-alice$/
          : /^\S+Z\s+key\.revoked\s+Acme Ltd\s+[a-z0-9]{12}\s+http\s+cli:ops-alice$/,
      );
      assert.match(table.stderr, /^Showing the newest 3; more with --limit N/);
    }
    const grants = await cli(["audit", "--org", "Acme Ltd", "--limit", "200"], envs.http);
    assert.match(
      grants.stdout,
      /credits\.granted\s+Acme Ltd\s+org_[a-z0-9]{12}\s+http\s+cli:ops-alice\s+amount_usd=12\.5 note="invoice 7"\n/,
    );
    assert.match(grants.stdout, /organization\.created\s+Acme Ltd\s+org_[a-z0-9]{12}\s+http\s+cli:ops-alice\s+name="Acme Ltd"\n/);
  });
});

describe("tds over HTTP: failures and usage errors", () => {
  let gw: Gateway;
  let off: Gateway;
  before(async () => {
    [gw, off] = await Promise.all([startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: TOKEN } }), startGateway({ fake: false })]);
  });
  after(async () => {
    await Promise.all([gw.close(), off.close()]);
  });

  it("a refused admin token, a gateway without the admin API and an unreachable gateway exit 1 with a clear message", async () => {
    const wrong = await cli(["org", "list"], { TDS_URL: gw.url, TDS_ADMIN_TOKEN: `${TOKEN}x` });
    assert.equal(wrong.code, 1);
    assert.equal(wrong.stdout, "");
    assert.equal(
      wrong.stderr,
      `tds: the gateway at ${gw.url} refused the admin token (Invalid admin token.); TDS_ADMIN_TOKEN must be the server's admin token\n`,
    );
    const apiKey = await cli(["org", "list"], { TDS_URL: gw.url, TDS_ADMIN_TOKEN: gw.key });
    assert.equal(apiKey.code, 1);
    assert.match(apiKey.stderr, /API keys are not accepted by the admin API/);

    const disabled = await cli(["org", "show", "test-org"], { TDS_URL: off.url, TDS_ADMIN_TOKEN: TOKEN });
    assert.equal(disabled.code, 1);
    assert.equal(disabled.stderr, `tds: the gateway at ${off.url} has no admin API enabled (set TDS_ADMIN_TOKEN on the server)\n`);

    const closed = `http://127.0.0.1:${await unusedPort()}`;
    const unreachable = await cli(["--url", closed, "org", "list"], { TDS_ADMIN_TOKEN: TOKEN });
    assert.equal(unreachable.code, 1);
    assert.equal(unreachable.stdout, "");
    assert.match(unreachable.stderr, new RegExp(`^tds: cannot reach the gateway at ${closed}: .*ECONNREFUSED`));
  });

  it("--url takes the gateway's URL; --database wins over TDS_URL", async () => {
    const viaFlag = json<{ name: string }[]>(await cli(["--url", `${gw.url}/`, "org", "list", "--json"], { TDS_ADMIN_TOKEN: TOKEN }));
    assert.deepEqual(
      viaFlag.map((o) => o.name),
      ["test-org"],
    );
    const after = json<{ name: string }[]>(
      await cli(["org", "list", "--json", `--url=${gw.url}`], { TDS_ADMIN_TOKEN: TOKEN, TDS_DATABASE_URL: "mysql://nowhere/db" }),
    );
    assert.deepEqual(after, viaFlag);
    const database = json<{ name: string }[]>(
      await cli(["--database", gw.config.databaseUrl, "org", "list", "--json"], { TDS_URL: "http://127.0.0.1:1", TDS_ADMIN_TOKEN: TOKEN }),
    );
    assert.deepEqual(database, viaFlag);
  });

  it("exits 2 for --url without TDS_ADMIN_TOKEN, --url with --database, a bad URL, and tds migrate over HTTP", async () => {
    const cases: Array<[string[], Record<string, string>, RegExp]> = [
      [["--url", gw.url, "org", "list"], {}, /TDS_ADMIN_TOKEN/],
      [
        ["org", "list"],
        { TDS_URL: gw.url },
        /^tds: TDS_URL works through the gateway's admin API, which needs its admin token: set TDS_ADMIN_TOKEN/,
      ],
      [
        ["--url", gw.url, "--database", gw.config.databaseUrl, "org", "list"],
        { TDS_ADMIN_TOKEN: TOKEN },
        /--url and --database do not go together/,
      ],
      [["--url", "ftp://example.com", "org", "list"], { TDS_ADMIN_TOKEN: TOKEN }, /--url must be an http:\/\/ or https:\/\/ URL/],
      [["--url", "not a url", "org", "list"], { TDS_ADMIN_TOKEN: TOKEN }, /--url must be the gateway's URL/],
      [["--url", `http://admin:${TOKEN}@127.0.0.1:1`, "org", "list"], { TDS_ADMIN_TOKEN: TOKEN }, /must not contain credentials/],
      [
        ["migrate", "--url", gw.url],
        { TDS_ADMIN_TOKEN: TOKEN },
        /^tds: "tds migrate" works on the database only, not through the admin API \(--url\); leave out --url/,
      ],
      [["migrate"], { TDS_URL: gw.url, TDS_ADMIN_TOKEN: TOKEN }, /unset TDS_URL or pass --database URL/],
    ];
    for (const [args, env, message] of cases) {
      const run = await cli(args, env);
      assert.equal(run.code, 2, `tds ${args.join(" ")}: ${run.stderr}`);
      assert.equal(run.stdout, "");
      assert.match(run.stderr, message);
      assert.match(run.stderr, /Usage: tds/);
    }
    const migrated = await cli(["migrate", "--database", gw.config.databaseUrl], { TDS_URL: gw.url, TDS_ADMIN_TOKEN: TOKEN });
    assert.equal(migrated.code, 0, migrated.stderr);
    assert.match(migrated.stdout, /^No pending migrations/);
  });

  it("mentions --url and TDS_ADMIN_TOKEN in the help, and tds audit and tds org show", async () => {
    const help = await cli(["--help"], {});
    for (const text of [
      "--url URL",
      "TDS_URL",
      "TDS_ADMIN_TOKEN",
      "tds audit [--org ORG] [--limit N]",
      "tds org show ORG",
      "[--idempotency-key KEY]",
    ]) {
      assert.ok(help.stdout.includes(text), `the help mentions ${text}`);
    }
  });

  it("runs through main.ts over HTTP and exits once done", async () => {
    const run = await new Promise<Run>((resolve, reject) => {
      const env: NodeJS.ProcessEnv = {};
      for (const [name, value] of Object.entries(process.env)) if (!name.startsWith("TDS_") && name !== "NODE_OPTIONS") env[name] = value;
      const child = spawn(process.execPath, ["--import", "tsx", "src/cli/main.ts", "org", "list", "--json"], {
        cwd: PROJECT,
        env: { ...env, TDS_URL: gw.url, TDS_ADMIN_TOKEN: TOKEN },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stdout = "";
      let stderr = "";
      child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
      child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
      child.on("error", reject);
      child.on("close", (code) => resolve({ code: code ?? -1, stdout, stderr }));
    });
    assert.deepEqual(
      json<{ name: string }[]>(run).map((o) => o.name),
      ["test-org"],
    );
  });
});
