/**
 * /openapi.json as tools see it: Redocly's `recommended` rules find no error and no warning in the document a real
 * gateway (admin API on) serves, every operation has its stable operationId, and building the document leaves the
 * route schemas (the validators) as they were.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const REDOCLY = join(import.meta.dirname, "../../node_modules/@redocly/cli/bin/cli.js");

interface Operation {
  operationId?: string;
  security?: unknown[];
}
interface OpenApiDocument {
  paths: Record<string, Record<string, Operation>>;
}
interface LintProblem {
  ruleId: string;
  severity: "error" | "warn";
  message: string;
  location: { pointer: string }[];
}

/** The operationId of every operation, by "METHOD /path": renaming one breaks generated clients. */
const OPERATION_IDS: Record<string, string> = {
  "POST /v1/systemone": "createDecision",
  "GET /v1/models": "listModels",
  "GET /api/config": "getServiceConfig",
  "GET /v1/organization": "getOrganization",
  "GET /v1/usage": "listUsage",
  "GET /v1/usage/{request_id}": "getUsageRecord",
  "GET /v1/usage/summary": "getUsageSummary",
  "POST /v1/batches": "submitBatch",
  "GET /v1/batches": "listBatches",
  "GET /v1/batches/{id}": "getBatch",
  "GET /v1/batches/{id}/results": "getBatchResults",
  "POST /v1/batches/{id}/cancel": "cancelBatch",
  "GET /admin/v1/organizations": "adminListOrganizations",
  "POST /admin/v1/organizations": "adminCreateOrganization",
  "GET /admin/v1/organizations/{org}": "adminGetOrganization",
  "PATCH /admin/v1/organizations/{org}": "adminUpdateOrganization",
  "POST /admin/v1/organizations/{org}/keys": "adminCreateKey",
  "GET /admin/v1/organizations/{org}/keys": "adminListKeys",
  "GET /admin/v1/keys/{key_id}": "adminGetKey",
  "PATCH /admin/v1/keys/{key_id}": "adminUpdateKey",
  "POST /admin/v1/keys/{key_id}/rotate": "adminRotateKey",
  "DELETE /admin/v1/keys/{key_id}": "adminRevokeKey",
  "POST /admin/v1/organizations/{org}/credits": "adminGrantCredits",
  "GET /admin/v1/organizations/{org}/usage": "adminListUsage",
  "GET /admin/v1/organizations/{org}/usage/{request_id}": "adminGetUsageRecord",
  "GET /admin/v1/usage/summary": "adminGetUsageSummary",
  "GET /admin/v1/audit": "adminListAudit",
};

/** `redocly lint --extends=recommended` on a document (run in its own folder: no project config, no telemetry). */
function lint(doc: unknown, dir: string): Promise<{ errors: number; warnings: number; problems: LintProblem[] }> {
  const file = join(dir, "openapi.json");
  writeFileSync(file, JSON.stringify(doc, null, 2));
  const env = { ...process.env, REDOCLY_TELEMETRY: "off", REDOCLY_SUPPRESS_NOTIFICATIONS: "true", NO_COLOR: "1" };
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      [REDOCLY, "lint", "--extends=recommended", "--format=json", file],
      { cwd: dir, env, maxBuffer: 64 << 20, timeout: 120_000 },
      (error, stdout, stderr) => {
        try {
          const report = JSON.parse(stdout) as { totals: { errors: number; warnings: number }; problems: LintProblem[] };
          resolve({ ...report.totals, problems: report.problems });
        } catch {
          reject(new Error(`redocly lint gave no report (${error?.message ?? "no error"}): ${stderr}`));
        }
      },
    );
  });
}

const describeProblems = (problems: LintProblem[]) =>
  problems.map((p) => `${p.severity} ${p.ruleId} at ${p.location.map((l) => l.pointer).join(", ")}: ${p.message}`).join("\n");

function operations(doc: OpenApiDocument): [string, Operation][] {
  return Object.entries(doc.paths).flatMap(([path, item]) =>
    Object.entries(item).map(([method, op]) => [`${method.toUpperCase()} ${path}`, op] as [string, Operation]),
  );
}

describe("/openapi.json under Redocly's recommended rules", () => {
  let gw: Gateway;
  let dir: string;
  let doc: OpenApiDocument;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "tds-openapi-lint-"));
    gw = await startGateway({ env: { TDS_ADMIN_TOKEN: "lint-test-admin-token-0123456789abcdef" } });
    const res = await fetch(`${gw.url}/openapi.json`);
    assert.equal(res.status, 200);
    doc = (await res.json()) as OpenApiDocument;
  });
  after(async () => {
    await gw?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("no errors and no warnings", async () => {
    const report = await lint(doc, dir);
    assert.equal(report.problems.length, 0, describeProblems(report.problems));
    assert.equal(report.errors, 0);
    assert.equal(report.warnings, 0);
  });

  test("the linter finds what a document without an operationId or a public operation's security: [] lacks", async () => {
    const broken = structuredClone(doc);
    delete broken.paths["/v1/models"]!.get!.operationId;
    delete broken.paths["/api/config"]!.get!.security;
    const report = await lint(broken, dir);
    const found = report.problems.map((p) => `${p.ruleId} ${p.location[0]?.pointer}`).sort();
    assert.deepEqual(found, ["operation-operationId #/paths/~1v1~1models/get/operationId", "security-defined #/paths/~1api~1config/get"]);
  });

  test("every operation has its stable, unique camelCase operationId; /api/config says it needs no key", () => {
    const ids = Object.fromEntries(operations(doc).map(([name, op]) => [name, op.operationId]));
    assert.deepEqual(ids, OPERATION_IDS);
    const values = Object.values(ids);
    assert.equal(new Set(values).size, values.length, "operationIds are unique");
    for (const id of values) assert.match(id ?? "", /^[a-z][A-Za-z0-9]*$/);
    assert.deepEqual(doc.paths["/api/config"]!.get!.security, []);
    for (const [name, op] of operations(doc)) if (name !== "GET /api/config") assert.ok(op.security?.length, name);
  });

  test("a body is required where the route needs one: a key's rotation may be sent without one", () => {
    const required = (path: string, method: string) =>
      (doc.paths[path]![method] as { requestBody?: { required?: boolean } }).requestBody?.required;
    assert.equal(required("/admin/v1/keys/{key_id}/rotate", "post"), false);
    assert.equal(required("/admin/v1/keys/{key_id}", "patch"), true);
    assert.equal(required("/v1/systemone", "post"), true);
  });

  test("building the document leaves the validators as they were: the question variants still decide", async () => {
    const questions = {
      pick: { type: "choice", criteria: { yes: "Yes", no: "No" } },
      level: { type: "score", criteria: ["low", "high"] },
      flag: { type: "noul" },
    };
    const ok = await gw.decide({ state: "a state", questions });
    assert.equal(ok.status, 200);
    const answers = ((await ok.json()) as { answers: Record<string, { type: string }> }).answers;
    assert.deepEqual(Object.fromEntries(Object.entries(answers).map(([name, a]) => [name, a.type])), {
      pick: "choice",
      level: "score",
      flag: "noul",
    });
    for (const question of [{ type: "rank", criteria: ["a"] }, { type: "noul", criteria: ["a"] }, ["choice"]]) {
      const bad = await gw.decide({ state: "a state", questions: { q: question } });
      assert.equal(bad.status, 422, JSON.stringify(question));
      const { errors } = (await bad.json()) as { errors: { field: string }[] };
      assert.ok(
        errors.some((e) => e.field.startsWith("questions.q")),
        JSON.stringify(errors),
      );
    }
  });
});
