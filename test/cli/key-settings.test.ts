/**
 * `tds key create|update|rotate|list` with a key's own limits, on both back-ends: the database (SQLite) and a real
 * gateway's admin API (--url). The same steps give the same results; bad values are usage errors (exit 2).
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { runCli } from "../../src/cli/cli.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const ADMIN_TOKEN = "adm-cli-keysettings-8Hn2Qw5Ze1Rt7Yu3Io9Pa";

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}
interface Json {
  [key: string]: any;
}

async function cli(args: string[], env: Record<string, string>): Promise<Run> {
  let stdout = "";
  let stderr = "";
  const code = await runCli(args, {
    stdout: { write: (t: string) => (stdout += t) },
    stderr: { write: (t: string) => (stderr += t) },
    env,
    operator: () => "tester",
  });
  return { code, stdout, stderr };
}

function json(run: Run): Json {
  assert.equal(run.code, 0, `exit 0 expected; stderr: ${run.stderr}`);
  return JSON.parse(run.stdout) as Json;
}

describe("tds key with settings", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({ env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN, TDS_REQUESTS_PER_MINUTE: "500" } });
  });
  after(async () => gw?.close());

  for (const mode of ["database", "http"] as const) {
    test(`create, list, update and rotate (${mode})`, async () => {
      const env: Record<string, string> =
        mode === "database"
          ? { TDS_DATABASE_URL: gw.config.databaseUrl, TDS_REQUESTS_PER_MINUTE: "500", TDS_MODEL_SERVICE_URL: gw.fake!.url }
          : { TDS_URL: gw.url, TDS_ADMIN_TOKEN: ADMIN_TOKEN };
      // The configuration the gateway runs with: a model service lists the models, so any name is taken.
      const tds = (...args: string[]) => cli(args, env);
      const org = json(await tds("org", "create", `cli-keys-${mode}`, "--json"));
      const expires = new Date(Date.now() + 7 * 86_400_000).toISOString();

      const created = json(
        await tds(
          "key",
          "create",
          "--org",
          org.id,
          "--name",
          "ci",
          "--expires",
          expires,
          "--models",
          "a, b",
          "--rpm",
          "50",
          "--budget-usd",
          "2.5",
          "--budget-period",
          "day",
          "--json",
        ),
      );
      assert.match(created.key, /^tds_/);
      assert.deepEqual(
        [created.name, created.expires_at, created.models, created.requests_per_minute, created.budget],
        ["ci", expires, ["a", "b"], 50, { usd: "2.5", period: "day" }],
      );
      const stored = (await gw.store.findApiKey(created.id))?.key;
      assert.deepEqual(stored?.budget, { limitMicrousd: 2_500_000, period: "day" });

      const text = await tds("key", "create", "--org", org.id, "--rpm", "7");
      assert.equal(text.code, 0, text.stderr);
      assert.match(text.stdout, /7\/min/);
      assert.match(text.stdout, /Copy this key now/);

      const updated = json(await tds("key", "update", created.id, "--no-name", "--all-models", "--rpm", "9", "--no-budget", "--json"));
      assert.deepEqual(
        [updated.name, updated.models, updated.requests_per_minute, updated.budget, updated.expires_at],
        [null, null, 9, null, expires],
      );

      const tooLong = await tds("key", "rotate", created.id, "--grace-seconds", "2592001");
      assert.deepEqual([tooLong.code, tooLong.stdout], [2, ""], "refused before either back-end is asked");
      assert.match(tooLong.stderr, /--grace-seconds must be a whole number of seconds from 0 to 2592000 \(30 days\)/);
      const rotated = json(await tds("key", "rotate", created.id, "--grace-seconds", "60", "--json"));
      assert.equal(rotated.replaces, created.id);
      assert.equal(rotated.requests_per_minute, 9);
      assert.equal(Date.parse(rotated.old_key_retires_at) - Date.parse(rotated.created_at), 60_000);
      const works = await fetch(`${gw.url}/v1/organization`, { headers: { authorization: `Bearer ${rotated.key}` } });
      assert.equal(works.status, 200);

      await gw.store.recordKeyUse([{ keyId: rotated.id, atMs: Date.parse("2026-01-02T03:04:05.000Z") }]);
      const listed = json(await tds("key", "list", "--org", org.id, "--json")) as unknown as Json[];
      const old = listed.find((k) => k.id === created.id);
      assert.equal(old?.replaced_by, rotated.id);
      assert.equal(listed.find((k) => k.id === rotated.id)?.last_used_at, "2026-01-02T03:04:05.000Z");
      const table = await tds("key", "list", "--org", org.id);
      assert.equal(table.code, 0, table.stderr);
      assert.match(table.stdout, /LAST USED/);
      assert.match(table.stdout, /2026-01-02T03:04:05/);
      assert.match(table.stdout, new RegExp(`rotated .*|by ${rotated.id}`));
      assert.match(table.stdout, /9\/min/);

      const again = await tds("key", "rotate", created.id);
      assert.equal(again.code, 1, again.stderr);
      assert.match(again.stderr, /already rotated/);
      assert.ok(!`${table.stdout}${again.stderr}`.includes(rotated.key), "the key is printed once");
    });

    test(`bad values are refused before anything changes (${mode})`, async () => {
      const env: Record<string, string> =
        mode === "database"
          ? { TDS_DATABASE_URL: gw.config.databaseUrl, TDS_REQUESTS_PER_MINUTE: "500", TDS_MODEL_SERVICE_URL: gw.fake!.url }
          : { TDS_URL: gw.url, TDS_ADMIN_TOKEN: ADMIN_TOKEN };
      const tds = (...args: string[]) => cli(args, env);
      const org = json(await tds("org", "create", `cli-bad-${mode}`, "--json"));
      for (const [args, message] of [
        [["--rpm", "ten"], /--rpm must be a whole number/],
        [["--budget-usd", "5"], /--budget-period/],
        [["--budget-usd", "5", "--budget-period", "week"], /day or month/],
        [["--budget-usd", "5.1234567", "--budget-period", "day"], /budget\.usd/],
        [["--expires", "2001-01-01T00:00:00Z"], /expires_at: must be in the future/],
        [["--rpm", "501"], /at most 500, the organization's requests_per_minute/],
      ] as const) {
        const run = await tds("key", "create", "--org", org.id, ...args);
        assert.equal(run.code, 2, `${args.join(" ")}: ${run.stderr}`);
        assert.match(run.stderr, message, args.join(" "));
      }
      if (mode === "database") {
        // No model service: the configuration names the models (the default one), and checks the names given.
        const named = await cli(["key", "create", "--org", org.id, "--models", "nope"], { TDS_DATABASE_URL: gw.config.databaseUrl });
        assert.equal(named.code, 2, named.stderr);
        assert.match(named.stderr, /unknown model "nope"/);
      }
      assert.deepEqual(json(await tds("key", "list", "--org", org.id, "--json")), [], "no key made");
      const k = json(await tds("key", "create", "--org", org.id, "--json"));
      const both = await tds("key", "update", k.id, "--rpm", "5", "--no-rpm");
      assert.equal(both.code, 2);
      assert.match(both.stderr, /do not go together/);
      const nothing = await tds("key", "update", k.id);
      assert.equal(nothing.code, 2);
      assert.equal((await tds("key", "update", "nosuchkey", "--rpm", "5")).code, 1);
      assert.equal((await tds("key", "rotate", "nosuchkey")).code, 1);
    });
  }
});
