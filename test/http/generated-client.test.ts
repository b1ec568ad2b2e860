/**
 * A client generated from the live /openapi.json by mainstream tools: openapi-typescript turns the document into
 * types, openapi-fetch makes calls with them. The client type-checks with the project's TypeScript (strict), a
 * misspelled body field does not, and run against a real gateway it gets a decision and finds its usage record.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import openapiTS, { astToString } from "openapi-typescript";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const PROJECT = join(import.meta.dirname, "../..");
const TSC = join(PROJECT, "node_modules/typescript/bin/tsc");

const TSCONFIG = {
  compilerOptions: {
    strict: true,
    target: "es2022",
    module: "esnext",
    moduleResolution: "bundler",
    allowImportingTsExtensions: true,
    noEmit: true,
    skipLibCheck: true,
    types: ["node"],
  },
};

/** Asks for one decision with every question type, reads each typed answer, then fetches the request's usage record. */
const CLIENT = `import createClient from "openapi-fetch";
import type { components, paths } from "./schema.ts";

const [baseUrl, key] = process.argv.slice(2) as [string, string];
const client = createClient<paths>({ baseUrl, headers: { Authorization: \`Bearer \${key}\` } });

const decision = await client.POST("/v1/systemone", {
  body: {
    state: { ticket: "I was charged twice. Please refund me." },
    questions: {
      topic: { type: "choice", criteria: { billing: "Payments", shipping: "Delivery" } },
      mood: { type: "score", criteria: ["calm", "annoyed", "angry"] },
      refund: { type: "noul", instructions: "Do they want a refund?" },
    },
  },
});
if (decision.error) throw new Error(\`decision: \${decision.response.status} \${decision.error.detail}\`);

const summary: Record<string, string | number> = {};
for (const [name, answer] of Object.entries(decision.data.answers)) {
  const typed: components["schemas"]["ChoiceAnswer" | "ScoreAnswer" | "NoulAnswer"] = answer;
  if (typed.type === "choice") summary[name] = typed.choice;
  else if (typed.type === "score") summary[name] = typed.score;
  else summary[name] = typed.noul;
}

const usage = await client.GET("/v1/usage/{request_id}", {
  params: { path: { request_id: decision.data.request_id } },
});
if (usage.error) throw new Error(\`usage: \${usage.response.status} \${usage.error.detail}\`);

console.log(
  JSON.stringify({
    status: decision.response.status,
    request_id: decision.data.request_id,
    model: decision.data.model,
    summary,
    usage: { request_id: usage.data.request_id, outcome: usage.data.outcome, http_status: usage.data.http_status },
  }),
);
`;

/** A body with a misspelled field: the generated types must refuse it. */
const WRONG = `import createClient from "openapi-fetch";
import type { paths } from "./schema.ts";

const client = createClient<paths>({ baseUrl: "http://127.0.0.1:1" });
await client.POST("/v1/systemone", {
  body: { state: "x", questons: { q: { type: "noul" } } },
});
`;

function run(args: string[], cwd: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, args, { cwd, maxBuffer: 16 << 20, timeout: 180_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? (typeof error.code === "number" ? error.code : 1) : 0, stdout, stderr });
    });
  });
}

describe("a client generated with openapi-typescript + openapi-fetch", () => {
  let gw: Gateway;
  let dir: string;
  before(async () => {
    gw = await startGateway();
    dir = mkdtempSync(join(tmpdir(), "tds-generated-client-"));
    symlinkSync(join(PROJECT, "node_modules"), join(dir, "node_modules"), "dir");
    writeFileSync(join(dir, "package.json"), JSON.stringify({ type: "module", private: true }));
    const ast = await openapiTS(new URL(`${gw.url}/openapi.json`));
    writeFileSync(join(dir, "schema.ts"), astToString(ast));
    writeFileSync(join(dir, "client.ts"), CLIENT);
    writeFileSync(join(dir, "wrong.ts"), WRONG);
    writeFileSync(join(dir, "tsconfig.json"), JSON.stringify({ ...TSCONFIG, files: ["schema.ts", "client.ts"] }));
    writeFileSync(join(dir, "tsconfig.wrong.json"), JSON.stringify({ ...TSCONFIG, files: ["schema.ts", "wrong.ts"] }));
  });
  after(async () => {
    await gw?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test("a client on the generated types type-checks (strict)", async () => {
    const checked = await run([TSC, "--noEmit", "-p", "tsconfig.json"], dir);
    assert.equal(checked.code, 0, checked.stdout + checked.stderr);
  });

  test("a misspelled body field fails the type-check", async () => {
    const checked = await run([TSC, "--noEmit", "-p", "tsconfig.wrong.json"], dir);
    assert.notEqual(checked.code, 0);
    assert.match(checked.stdout, /wrong\.ts\(\d+,\d+\): error TS\d+: .*questons/);
  });

  test("run against the gateway, it gets a decision and finds the request's usage record", async () => {
    const ran = await run(["--import", "tsx", "client.ts", gw.url, gw.key], dir);
    assert.equal(ran.code, 0, ran.stderr);
    const out = JSON.parse(ran.stdout.trim().split("\n").at(-1)!) as {
      status: number;
      request_id: string;
      model: string;
      summary: Record<string, string | number>;
      usage: { request_id: string; outcome: string; http_status: number };
    };
    assert.equal(out.status, 200);
    assert.equal(out.model, "fake-small");
    assert.deepEqual(Object.keys(out.summary).sort(), ["mood", "refund", "topic"]);
    assert.ok(["billing", "shipping"].includes(out.summary.topic as string), String(out.summary.topic));
    const mood = out.summary.mood as number;
    assert.ok(typeof mood === "number" && mood >= 0 && mood <= 2, `a score over three levels: ${mood}`);
    assert.equal(typeof out.summary.refund, "number");
    assert.deepEqual(out.usage, { request_id: out.request_id, outcome: "succeeded", http_status: 200 });
    const received = gw.fake!.received.at(-1)!;
    assert.deepEqual(Object.keys(received.questions as object).sort(), ["mood", "refund", "topic"]);
  });
});
