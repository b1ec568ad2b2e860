/**
 * `tds batch` against a real gateway (its batch routes, SQLite, the fake model server). The gateway runs no batch
 * requests itself (runBatches: false): the tests claim and finish them through the store while a command waits.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { EXIT_BATCH_NOT_COMPLETED } from "../../src/cli/batch-commands.ts";
import { PLAIN_PROGRESS_INTERVAL_MS, progressView } from "../../src/cli/batch-progress.ts";
import { runCli } from "../../src/cli/cli.ts";
import type { Batch } from "../../src/contract/batches.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";

const PROJECT = fileURLToPath(new URL("../../", import.meta.url));

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `tds ARGS` in-process; `output` shows stdout and stderr as they are written (to watch a waiting command). */
async function cli(args: string[], env: Record<string, string>, output: Partial<Run> = {}, tty = false): Promise<Run> {
  output.stdout = "";
  output.stderr = "";
  const code = await runCli(args, {
    stdout: { write: (t: string) => (output.stdout += t) },
    stderr: { write: (t: string) => (output.stderr += t), ...(tty ? { isTTY: true } : {}) },
    env,
  });
  return { code, stdout: output.stdout, stderr: output.stderr };
}

async function until<T>(what: string, probe: () => Promise<T | null | undefined | false>, deadlineMs = 60_000): Promise<T> {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

const line = (customId: string, overrides: Record<string, unknown> = {}) =>
  JSON.stringify({ custom_id: customId, ...sampleRequest(), ...overrides });

describe("tds batch", () => {
  let gw: Gateway;
  let dir: string;
  let files = 0;

  /** A new NDJSON file of `lines`. */
  const ndjson = (lines: string[]) => {
    const file = join(dir, `batch-${++files}.ndjson`);
    writeFileSync(file, `${lines.join("\n")}\n`);
    return file;
  };
  /** The environment of a new organization's key (so that each test lists only its own batches). */
  const newOrgEnv = async (name: string) => {
    const org = await gw.newOrg(name);
    return { env: { TDS_URL: gw.url, TDS_API_KEY: org.key }, key: org.key };
  };
  const api = async (key: string, path: string, init: RequestInit = {}) => {
    const res = await fetch(`${gw.url}${path}`, { ...init, headers: { authorization: `Bearer ${key}` } });
    return { status: res.status, text: await res.text() };
  };
  const batchesOf = async (key: string): Promise<Batch[]> => JSON.parse((await api(key, "/v1/batches")).text).data as Batch[];

  let claims = 0;
  /**
   * Claims the open requests (of every batch: a claim takes any) and finishes the batch's at `positions` (all when
   * omitted): 200, except `failing`; the other claims are released, to be claimed again.
   */
  async function finish(batchId: string, positions?: number[], failing: number[] = []): Promise<number> {
    const nowMs = Date.now();
    const instanceId = `test-${++claims}`;
    const claimed = await gw.store.batches.claimRequests({ instanceId, nowMs, leaseUntilMs: nowMs + 600_000, limit: 1000 });
    let finished = 0;
    for (const claim of claimed.filter((c) => c.batchId === batchId)) {
      if (positions !== undefined && !positions.includes(claim.position)) continue;
      const fails = failing.includes(claim.position);
      const done = await gw.store.batches.finishRequest({
        batchId,
        position: claim.position,
        requestId: claim.requestId,
        status: fails ? 502 : 200,
        body: JSON.stringify(fails ? { detail: "The model failed." } : { request_id: claim.requestId, answer: claim.customId }),
        costMicrousd: fails ? 0 : 1500,
        nowMs: Date.now(),
      });
      if (done) finished++;
    }
    await gw.store.batches.releaseClaims(instanceId);
    return finished;
  }

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "tds-batch-cli-"));
    gw = await startGateway({ runBatches: false });
  });
  after(async () => {
    await gw?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("submit prints the batch id; the batch exists with its requests", async () => {
    const { env, key } = await newOrgEnv("submit-org");
    const run = await cli(["batch", "submit", ndjson([line("a"), line("b"), line("c")])], env);
    assert.equal(run.code, 0, run.stderr);
    const id = /Submitted batch (batch_\S+): 3 requests, the configured model, queued\./.exec(run.stdout)?.[1];
    assert.ok(id, run.stdout);
    const got = await api(key, `/v1/batches/${id}`);
    assert.equal(got.status, 200);
    const batch = JSON.parse(got.text) as Batch;
    assert.equal(batch.status, "queued");
    assert.deepEqual(batch.request_counts, { total: 3, succeeded: 0, failed: 0 });

    const json = await cli(["batch", "submit", ndjson([line("x")]), "--model", "fake-large", "--json"], env);
    assert.equal(json.code, 0, json.stderr);
    const submitted = JSON.parse(json.stdout) as Batch;
    assert.equal(submitted.object, "batch");
    assert.equal(submitted.model, "fake-large");
    assert.equal(submitted.request_counts.total, 1);
  });

  it("running the same submit again returns the batch already submitted; another --idempotency-key submits anew", async () => {
    const { env, key } = await newOrgEnv("again-org");
    const file = ndjson([line("a"), line("b")]);
    const first = await cli(["batch", "submit", file, "--json"], env);
    const second = await cli(["batch", "submit", file, "--json"], env);
    assert.equal(first.code, 0, first.stderr);
    assert.equal(second.code, 0, second.stderr);
    const id = (JSON.parse(first.stdout) as Batch).id;
    assert.equal((JSON.parse(second.stdout) as Batch).id, id);
    assert.match(second.stderr, /nothing was submitted again/);
    assert.equal((await batchesOf(key)).length, 1);

    const other = await cli(["batch", "submit", file, "--idempotency-key", "run-2", "--json"], env);
    assert.equal(other.code, 0, other.stderr);
    assert.notEqual((JSON.parse(other.stdout) as Batch).id, id);
    assert.equal((await batchesOf(key)).length, 2);
  });

  it("a refused submission lists each line's errors and exits 1; nothing is submitted", async () => {
    const { env, key } = await newOrgEnv("refused-org");
    const bad = JSON.stringify({ custom_id: "b", ...sampleRequest({ questions: { q: { type: "bogus", instructions: "?" } } }) });
    const run = await cli(["batch", "submit", ndjson([line("a"), bad, line("c", { extra: 1 })])], env);
    assert.equal(run.code, 1);
    assert.equal(run.stdout, "");
    assert.match(run.stderr, /^tds: the gateway refused "[^"]+batch-\d+\.ndjson": /);
    assert.match(run.stderr, /\n {2}line 2: questions\.q/);
    assert.match(run.stderr, /\n {2}line 3: /);
    assert.deepEqual(await batchesOf(key), []);
  });

  it("--wait (not a terminal) prints progress lines, exits 0 when completed, and --out gets the results in input order", async () => {
    const { env, key } = await newOrgEnv("wait-org");
    const out = join(dir, "results.ndjson");
    const output: Partial<Run> = {};
    const running = cli(["batch", "submit", ndjson([line("r0"), line("r1"), line("r2")]), "--wait", "--out", out], env, output);
    const batch = await until("the batch", async () => (await batchesOf(key))[0]);
    // The last request first: the results are in input order whatever the order of their end.
    assert.equal(await finish(batch.id, [2], [2]), 1);
    await until("a progress line with one request done", async () => output.stderr?.includes("1/3 done (33%), 0 succeeded, 1 failed"));
    assert.equal(await finish(batch.id), 2);
    const run = await running;
    assert.equal(run.code, 0, run.stderr);
    assert.ok(!run.stderr.includes("\r"), "no redrawn line when stderr is not a terminal");
    const progress = run.stderr.trimEnd().split("\n");
    assert.match(progress[0]!, new RegExp(`^${batch.id} queued: 0/3 done \\(0%\\), 0 succeeded, 0 failed, cost 0 USD$`));
    assert.equal(progress.at(-1), `${batch.id} completed: 3/3 done (100%), 2 succeeded, 1 failed, cost 0.003 USD`);
    assert.match(run.stdout, new RegExp(`Batch ${batch.id} completed: 3/3 done \\(100%\\), 2 succeeded, 1 failed, cost 0\\.003 USD\\.`));
    assert.match(run.stdout, /Results written to "[^"]+results\.ndjson"\./);

    const written = readFileSync(out, "utf8");
    assert.equal(written, (await api(key, `/v1/batches/${batch.id}/results`)).text);
    const results = written
      .trimEnd()
      .split("\n")
      .map((l) => JSON.parse(l));
    assert.deepEqual(
      results.map((r) => [r.custom_id, r.status]),
      [
        ["r0", 200],
        ["r1", 200],
        ["r2", 502],
      ],
    );
  });

  it("--wait on a terminal redraws one progress line; a cancelled batch exits 3", async () => {
    const { env, key } = await newOrgEnv("cancel-wait-org");
    const output: Partial<Run> = {};
    const running = cli(["batch", "submit", ndjson([line("a"), line("b")]), "--wait"], env, output, true);
    const batch = await until("the batch", async () => (await batchesOf(key))[0]);
    await until("the progress bar", async () => output.stderr?.includes("0/2 done"));
    const cancel = await cli(["batch", "cancel", batch.id], env);
    assert.equal(cancel.code, 0, cancel.stderr);
    assert.equal(cancel.stdout, `Cancelled batch ${batch.id}: 2/2 done (100%), 0 succeeded, 2 failed, cost 0 USD.\n`);
    const run = await running;
    assert.equal(run.code, EXIT_BATCH_NOT_COMPLETED, run.stderr);
    assert.ok(run.stderr.startsWith(`\r\x1b[2K[${".".repeat(24)}] ${batch.id} queued: 0/2 done`), JSON.stringify(run.stderr));
    assert.ok(
      run.stderr.endsWith(`\r\x1b[2K[${"#".repeat(24)}] ${batch.id} cancelled: 2/2 done (100%), 0 succeeded, 2 failed, cost 0 USD\n`),
    );
    assert.match(run.stdout, new RegExp(`Batch ${batch.id} cancelled: `));
  });

  it("list, show, results and cancel", async () => {
    const { env, key } = await newOrgEnv("manage-org");
    const first = JSON.parse((await cli(["batch", "submit", ndjson([line("p"), line("q")]), "--json"], env)).stdout) as Batch;
    assert.equal(await finish(first.id), 2);
    const second = JSON.parse((await cli(["batch", "submit", ndjson([line("z")]), "--json"], env)).stdout) as Batch;

    const list = await cli(["batch", "list"], env);
    assert.equal(list.code, 0, list.stderr);
    const rows = list.stdout.trimEnd().split("\n");
    assert.match(rows[0]!, /^ID +STATUS +CREATED +DONE\/TOTAL +COST USD$/);
    assert.match(rows[1]!, new RegExp(`^${second.id} +queued +\\S+Z +0/1 +0$`));
    assert.match(rows[2]!, new RegExp(`^${first.id} +completed +\\S+Z +2/2 +0\\.003$`));
    const listed = JSON.parse((await cli(["batch", "list", "--json", "--limit", "1"], env)).stdout) as Batch[];
    assert.deepEqual(
      listed.map((b) => b.id),
      [second.id],
    );

    const show = await cli(["batch", "show", first.id], env);
    assert.equal(show.code, 0, show.stderr);
    assert.match(show.stdout, new RegExp(`^id: +${first.id}\n`));
    assert.match(show.stdout, /\nstatus: +completed\n/);
    assert.match(show.stdout, /\nrequests: +2 \(2 done: 2 succeeded, 0 failed\)\n/);
    assert.match(show.stdout, /\ncost_usd: +0\.003\n/);
    assert.equal(JSON.parse((await cli(["batch", "show", first.id, "--json"], env)).stdout).id, first.id);

    const expected = (await api(key, `/v1/batches/${first.id}/results`)).text;
    const results = await cli(["batch", "results", first.id], env);
    assert.equal(results.code, 0, results.stderr);
    assert.equal(results.stdout, expected);
    assert.deepEqual(
      expected
        .trimEnd()
        .split("\n")
        .map((l) => JSON.parse(l).custom_id),
      ["p", "q"],
    );
    const out = join(dir, "manage-results.ndjson");
    const toFile = await cli(["batch", "results", first.id, "--out", out], env);
    assert.equal(toFile.code, 0, toFile.stderr);
    assert.equal(readFileSync(out, "utf8"), expected);
    const early = await cli(["batch", "results", second.id], env);
    assert.equal(early.code, 0, early.stderr);
    assert.match(early.stderr, /is queued: the results of 0 of its 1 requests so far/);

    const cancel = await cli(["batch", "cancel", second.id], env);
    assert.equal(cancel.code, 0, cancel.stderr);
    assert.match(cancel.stdout, /^Cancelled batch /);
    assert.equal((JSON.parse((await api(key, `/v1/batches/${second.id}`)).text) as Batch).status, "cancelled");
    const again = await cli(["batch", "cancel", first.id], env);
    assert.equal(again.stdout, `Batch ${first.id} had already ended: completed.\n`);

    const missing = await cli(["batch", "show", "batch_doesnotexist"], env);
    assert.equal(missing.code, 1);
    assert.match(missing.stderr, /^tds: .+ See: tds batch list\n$/);
  });

  it("without TDS_API_KEY or TDS_URL, or with --database: a clear message and exit 2", async () => {
    const noKey = await cli(["batch", "list"], { TDS_URL: gw.url });
    assert.equal(noKey.code, 2);
    assert.match(noKey.stderr, /^tds: tds batch needs an API key .*: set TDS_API_KEY in the environment/);
    const badKey = await cli(["batch", "list"], { TDS_URL: gw.url, TDS_API_KEY: "secret" });
    assert.equal(badKey.code, 2);
    assert.match(badKey.stderr, /^tds: TDS_API_KEY is not an API key/);
    const noUrl = await cli(["batch", "list"], { TDS_API_KEY: gw.key });
    assert.equal(noUrl.code, 2);
    assert.match(noUrl.stderr, /^tds: tds batch works through a gateway's API: set TDS_URL/);
    const database = await cli(["batch", "list", "--database", "sqlite:x.sqlite"], { TDS_URL: gw.url, TDS_API_KEY: gw.key });
    assert.equal(database.code, 2);
    assert.match(database.stderr, /leave out --database/);
    const outWithoutWait = await cli(["batch", "submit", ndjson([line("a")]), "--out", "x.ndjson"], {
      TDS_URL: gw.url,
      TDS_API_KEY: gw.key,
    });
    assert.equal(outWithoutWait.code, 2);
    assert.match(outWithoutWait.stderr, /--out needs --wait/);
  });

  it("in its own process: submit --wait streams the file, waits and writes the results; the exit code is the command's", async () => {
    const { env, key } = await newOrgEnv("process-org");
    const out = join(dir, "process-results.ndjson");
    let stderr = "";
    const child = spawn(
      process.execPath,
      ["--import", "tsx", "src/cli/main.ts", "batch", "submit", ndjson([line("one"), line("two")]), "--wait", "--out", out],
      { cwd: PROJECT, env: { PATH: process.env.PATH ?? "", ...env }, stdio: ["ignore", "pipe", "pipe"] },
    );
    let stdout = "";
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    const exited = new Promise<number>((resolve, reject) => {
      child.on("error", reject);
      child.on("close", (code) => resolve(code ?? -1));
    });
    let batch: Awaited<ReturnType<typeof batchesOf>>[number];
    try {
      batch = await until("the batch", async () => (await batchesOf(key))[0]);
      await until("the requests finished", async () => (await finish(batch.id)) > 0);
    } catch (err) {
      child.kill("SIGKILL");
      throw err;
    }
    assert.equal(await exited, 0, stderr);
    assert.match(stdout, new RegExp(`^Submitted batch ${batch.id}: 2 requests, the configured model, queued.\n`));
    assert.deepEqual(
      readFileSync(out, "utf8")
        .trimEnd()
        .split("\n")
        .map((l) => JSON.parse(l).custom_id),
      ["one", "two"],
    );
  });

  it("a file larger than the gateway's max_batch_bytes: exit 1 naming the limit, nothing submitted", async () => {
    const small = await startGateway({ runBatches: false, fake: false, env: { TDS_MAX_BATCH_BYTES: "4096" } });
    try {
      const file = ndjson(Array.from({ length: 20 }, (_, i) => line(`c${i}`)));
      const run = await cli(["batch", "submit", file], { TDS_URL: small.url, TDS_API_KEY: small.key });
      assert.equal(run.code, 1);
      assert.match(
        run.stderr,
        /^tds: (".+" is \d+ bytes, more than the gateway's max_batch_bytes \(4096\)|the gateway refused ".+": .*max_batch_bytes)/,
      );
      assert.equal((await small.store.batches.listBatches(small.orgId, { limit: 10 })).batches.length, 0);
    } finally {
      await small.close();
    }
  });

  it("a revoked key: the gateway's refusal, exit 1", async () => {
    const revoked = await gw.newOrg("revoked-org");
    assert.equal(await gw.store.revokeApiKey(revoked.keyId, Date.now()), true);
    const run = await cli(["batch", "list"], { TDS_URL: gw.url, TDS_API_KEY: revoked.key });
    assert.equal(run.code, 1);
    assert.match(
      run.stderr,
      /^tds: the gateway at http:\/\/127\.0\.0\.1:\d+ refused the API key \(.+\); TDS_API_KEY must be an active API key/,
    );
  });
});

describe("batch progress", () => {
  const batch = (status: Batch["status"], succeeded: number, failed: number): Batch => ({
    id: "batch_1",
    object: "batch",
    status,
    model: null,
    created_at: "2026-01-01T00:00:00.000Z",
    started_at: null,
    ended_at: null,
    expires_at: "2026-01-02T00:00:00.000Z",
    request_counts: { total: 3, succeeded, failed },
    cost_microusd: succeeded * 1000,
    cost_usd: String(succeeded / 1000),
  });

  it("not on a terminal: a line when the progress changes, at most every few seconds, a new status and the end at once", () => {
    let written = "";
    let now = 0;
    const view = progressView({ write: (t: string) => (written += t) }, () => now);
    view.update(batch("queued", 0, 0));
    view.update(batch("queued", 0, 0));
    now = 100;
    view.update(batch("running", 1, 0));
    now = 200;
    view.update(batch("running", 2, 0));
    now = 100 + PLAIN_PROGRESS_INTERVAL_MS;
    view.update(batch("running", 2, 0));
    now += 10;
    view.update(batch("running", 2, 1));
    view.finish(batch("completed", 2, 1));
    view.finish(batch("completed", 2, 1));
    assert.deepEqual(written.trimEnd().split("\n"), [
      "batch_1 queued: 0/3 done (0%), 0 succeeded, 0 failed, cost 0 USD",
      "batch_1 running: 1/3 done (33%), 1 succeeded, 0 failed, cost 0.001 USD",
      "batch_1 running: 2/3 done (66%), 2 succeeded, 0 failed, cost 0.002 USD",
      "batch_1 completed: 3/3 done (100%), 2 succeeded, 1 failed, cost 0.002 USD",
    ]);
  });
});
