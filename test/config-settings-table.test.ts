/**
 * The settings table (src/settings/settings-table.ts) is the one description of every setting: .env.example and the
 * README's settings table are written from it (`npm run settings:docs`) and fail here when they drift; the config
 * file's keys are the table's; one parser per setting checks a value the same way from either source.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import type { TSchema } from "@sinclair/typebox";
import { ConfigError, loadConfig } from "../src/config.ts";
import { ConfigFile } from "../src/contract/config.ts";
import { readSettings } from "../src/settings/read-settings.ts";
import type { Setting } from "../src/settings/setting.ts";
import { README_TABLE_END, README_TABLE_START, renderEnvExample, renderReadmeTable } from "../src/settings/settings-docs.ts";
import { SETTINGS } from "../src/settings/settings-table.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
const ROWS = Object.entries(SETTINGS) as Array<[string, Setting]>;
const FIX = "run `npm run settings:docs` after changing src/settings/settings-table.ts";

const dir = mkdtempSync(join(tmpdir(), "tds-settings-table-"));
after(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;
function withFile(content: unknown, env: Record<string, string> = {}) {
  const path = join(dir, `config-${++files}.json`);
  writeFileSync(path, JSON.stringify(content), { mode: 0o600 });
  return () => loadConfig({ TDS_CONFIG: path, ...env });
}
function problemsOf(load: () => unknown): string[] {
  try {
    load();
  } catch (err) {
    assert.ok(err instanceof ConfigError, String(err));
    return err.problems;
  }
  assert.fail("the configuration was accepted");
}

/** Every `NAME=value` line of .env.example. */
function envExampleLines(): Map<string, string> {
  const lines = new Map<string, string>();
  for (const line of readFileSync(join(root, ".env.example"), "utf8").split("\n")) {
    const match = /^#\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(line);
    if (match) lines.set(match[1]!, match[2]!);
  }
  return lines;
}

/** The README's table between its markers: variable or file key → default cell. */
function readmeTable(): string {
  const readme = readFileSync(join(root, "README.md"), "utf8");
  const start = readme.indexOf(README_TABLE_START);
  const end = readme.indexOf(README_TABLE_END);
  assert.ok(start >= 0 && end > start, `README.md has no settings table between "${README_TABLE_START}" and "${README_TABLE_END}"`);
  assert.equal(readme.indexOf(README_TABLE_START, start + 1), -1, "README.md has two settings tables");
  return readme.slice(start + README_TABLE_START.length, end).trim();
}

/** The dotted paths of the config file schema's properties, down to the values (arrays and records are leaves). */
function schemaPaths(schema: TSchema, prefix = ""): string[] {
  const properties = (schema as { properties?: Record<string, TSchema> }).properties;
  if (!properties) return [prefix];
  return Object.entries(properties).flatMap(([key, child]) => schemaPaths(child, prefix ? `${prefix}.${key}` : key));
}

describe("the settings table", () => {
  test(".env.example is the one the table writes", () => {
    assert.equal(
      readFileSync(join(root, ".env.example"), "utf8"),
      renderEnvExample(),
      `.env.example drifted from the settings table: ${FIX}`,
    );
  });

  test("the README's settings table is the one the table writes", () => {
    assert.equal(readmeTable(), renderReadmeTable(), `README.md's settings table drifted from the settings table: ${FIX}`);
  });

  test(".env.example lists every variable of the table once, at its default, and no other", () => {
    const lines = envExampleLines();
    const expected = ROWS.flatMap(([, row]) => (row.env === null ? [] : [row.env, ...(row.secretFile ? [`${row.env}_FILE`] : [])]));
    assert.deepEqual([...lines.keys()].sort(), expected.sort());
    for (const [key, row] of ROWS) {
      if (row.env === null || row.parse === undefined || row.default === null || row.default === undefined) continue;
      const shown = row.parse.fromText(lines.get(row.env)!);
      assert.ok("value" in shown, `${row.env}=${lines.get(row.env)} does not parse`);
      assert.deepEqual(shown.value, row.default, `${key}: .env.example shows ${lines.get(row.env)}, the default is ${String(row.default)}`);
    }
  });

  test("without any setting, every value is the table's default", () => {
    const problems: string[] = [];
    const { values, sources } = readSettings({}, {}, problems);
    assert.deepEqual(problems, []);
    for (const [key, row] of ROWS) {
      if (row.parse === undefined) continue;
      assert.deepEqual(values[key as keyof typeof values], row.default, key);
      assert.equal(sources[key as keyof typeof sources], null, key);
    }
  });

  test("the config file's keys are the table's (models, model_services and model_service's shape aside)", () => {
    const structured = /^(models|model_services)$/;
    const schemaKeys = schemaPaths(ConfigFile).filter((p) => !structured.test(p));
    const tableKeys = ROWS.flatMap(([, row]) => (row.file !== null && !structured.test(row.file) ? [row.file] : []));
    assert.deepEqual(schemaKeys.sort(), tableKeys.sort());
  });

  test("one parser per setting: the file takes the same range as the variable, and its messages name the file key", () => {
    for (const [key, row] of ROWS) {
      if (row.env === null || row.file === null || row.parse === undefined || typeof row.default !== "number") continue;
      for (const given of ["0", "1", "63", "64", "65535", "65536", "99999999999", "-1"]) {
        const fromText = row.parse.fromText(given);
        const fromFile = row.parse.fromFile(Number(given));
        assert.equal(
          "value" in fromText,
          "value" in fromFile,
          `${key}: ${given} is ${"value" in fromText ? "taken" : "refused"} from ${row.env} only`,
        );
      }
    }
    assert.deepEqual(problemsOf(withFile({ limits: { max_request_bytes: 10, max_questions: 33 } })), [
      "limits.max_request_bytes must be a whole number from 64 to 67108864 (got 10)",
      "limits.max_questions must be a whole number from 1 to 32 (got 33)",
    ]);
    assert.deepEqual(problemsOf(withFile({ service_mode: "free", log_format: "xml" })), [
      'service_mode must be "preview" or "paid" (got "free")',
      'log_format must be "pretty" or "json" (got "xml")',
    ]);
    assert.deepEqual(problemsOf(withFile({ model_timeout_ms: 90_000 }, { TDS_RESERVATION_TTL_SECONDS: "60" })), [
      "TDS_MODEL_TIMEOUT_MS (90000) must be shorter than TDS_RESERVATION_TTL_SECONDS (60 s), so a model call ends before its reservation expires",
    ]);
  });

  test("the metrics token may come from the config file's metrics_token, checked like the variable and kept secret", () => {
    const token = "m3tr1cs-Qx7Lp2Vz9Kd4Rt8Wn1Hc6Bs5Fg0J";
    const config = withFile({ metrics_token: token })();
    assert.equal(config.metricsToken, token);
    assert.deepEqual(config.configFile?.secrets, ["metrics_token"]);
    assert.equal(withFile({ metrics_token: "x".repeat(10) }, { TDS_METRICS_TOKEN: token })().metricsToken, token, "the variable wins");
    const [problem] = problemsOf(withFile({ metrics_token: "short" }));
    assert.match(problem!, /^metrics_token must be at least 32 characters \(got 5\); generate one with: openssl rand -hex 32$/);
  });

  test("the batch settings: defaults, the environment, the config file's batches.*, and bad values refused by name", () => {
    assert.deepEqual(loadConfig({}).batches, {
      maxRequests: 50_000,
      maxBytes: 209_715_200,
      concurrency: 16,
      globalConcurrency: 32,
      completionWindowMs: 24 * 3_600_000,
      retentionDays: 7,
      priceFactor: "1",
      priceFactorMillionths: 1_000_000n,
    });
    assert.deepEqual(
      loadConfig({
        TDS_MAX_BATCH_REQUESTS: "1000000",
        TDS_MAX_BATCH_BYTES: "4294967296",
        TDS_BATCH_CONCURRENCY: "1",
        TDS_BATCH_GLOBAL_CONCURRENCY: "4096",
        TDS_BATCH_COMPLETION_WINDOW_HOURS: "168",
        TDS_BATCH_RETENTION_DAYS: "3650",
        TDS_BATCH_PRICE_FACTOR: "0.250",
      }).batches,
      {
        maxRequests: 1_000_000,
        maxBytes: 4_294_967_296,
        concurrency: 1,
        globalConcurrency: 4096,
        completionWindowMs: 168 * 3_600_000,
        retentionDays: 3650,
        priceFactor: "0.25",
        priceFactorMillionths: 250_000n,
      },
    );
    const fromFile = withFile(
      {
        batches: {
          max_requests: 10,
          max_bytes: 1024,
          concurrency: 1024,
          global_concurrency: 1,
          completion_window_hours: 1,
          retention_days: 1,
          price_factor: "0.000001",
        },
      },
      { TDS_BATCH_CONCURRENCY: "3" },
    )();
    assert.deepEqual(fromFile.batches, {
      maxRequests: 10,
      maxBytes: 1024,
      concurrency: 3,
      globalConcurrency: 1,
      completionWindowMs: 3_600_000,
      retentionDays: 1,
      priceFactor: "0.000001",
      priceFactorMillionths: 1n,
    });
    assert.equal(loadConfig({ TDS_BATCH_PRICE_FACTOR: "0" }).batches.priceFactorMillionths, 0n);
    assert.equal(loadConfig({ TDS_BATCH_PRICE_FACTOR: "100.000000" }).batches.priceFactor, "100");

    assert.deepEqual(
      problemsOf(() =>
        loadConfig({
          TDS_MAX_BATCH_REQUESTS: "1000001",
          TDS_MAX_BATCH_BYTES: "1023",
          TDS_BATCH_CONCURRENCY: "0",
          TDS_BATCH_GLOBAL_CONCURRENCY: "4097",
          TDS_BATCH_COMPLETION_WINDOW_HOURS: "169",
          TDS_BATCH_RETENTION_DAYS: "3651",
          TDS_BATCH_PRICE_FACTOR: "100.000001",
        }),
      ),
      [
        'TDS_MAX_BATCH_REQUESTS must be a whole number from 1 to 1000000 (got "1000001")',
        'TDS_MAX_BATCH_BYTES must be a whole number from 1024 to 4294967296 (got "1023")',
        'TDS_BATCH_CONCURRENCY must be a whole number from 1 to 1024 (got "0")',
        'TDS_BATCH_GLOBAL_CONCURRENCY must be a whole number from 1 to 4096 (got "4097")',
        'TDS_BATCH_COMPLETION_WINDOW_HOURS must be a whole number from 1 to 168 (got "169")',
        'TDS_BATCH_RETENTION_DAYS must be a whole number from 1 to 3650 (got "3651")',
        'TDS_BATCH_PRICE_FACTOR must be a decimal number from 0 to 100 with at most 6 decimal places, such as "0.5" (got "100.000001")',
      ],
    );
    for (const given of ["-0.5", ".5", "1.", "0.1234567", "1e-3", "0x1", "01", "half", "1,5", "1000"]) {
      assert.deepEqual(
        problemsOf(() => loadConfig({ TDS_BATCH_PRICE_FACTOR: given })),
        [
          `TDS_BATCH_PRICE_FACTOR must be a decimal number from 0 to 100 with at most 6 decimal places, such as "0.5" (got ${JSON.stringify(given)})`,
        ],
      );
    }
    assert.deepEqual(problemsOf(withFile({ batches: { retention_days: 0, price_factor: "2.5.1" } })), [
      "batches.retention_days must be a whole number from 1 to 3650 (got 0)",
      'batches.price_factor must be a decimal number from 0 to 100 with at most 6 decimal places, such as "0.5" (got "2.5.1")',
    ]);
    const [wrongType] = problemsOf(withFile({ batches: { price_factor: 0.5 } }));
    assert.match(wrongType!, /^TDS_CONFIG .*price_factor/);
    assert.match(problemsOf(withFile({ batches: { max_request: 5 } }))[0]!, /^TDS_CONFIG /, "an unknown key under batches is refused");
  });

  test("a variable that does not parse falls back to the file, then the default, and every problem is one line", () => {
    const problems = problemsOf(withFile({ port: 9000 }, { PORT: "http", TDS_MAX_CONNECTIONS: "0" }));
    assert.deepEqual(problems, [
      'PORT must be a whole number from 0 to 65535 (got "http")',
      'TDS_MAX_CONNECTIONS must be a whole number from 1 to 1000000 (got "0")',
    ]);
    for (const p of problems) assert.doesNotMatch(p, /\n/);
  });
});
