import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import Database from "better-sqlite3";
import { sqlitePathOf } from "../../src/database-url.ts";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { errorBody } from "../support/contract-check.ts";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { startGatewayProcess } from "../support/gateway-process.ts";

describe("storage unavailable", () => {
  test("a database locked by another writer gives 503 with a retryable detail, and nothing is charged or recorded", async () => {
    const gw = await startGateway({ env: { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1" } });
    const path = sqlitePathOf(gw.config.databaseUrl)!;
    const intruder = new Database(path);
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 10_000, nowMs: Date.now() });
      intruder.pragma("busy_timeout = 0");
      intruder.exec("BEGIN IMMEDIATE");
      const res = await gw.decide(sampleRequest());
      const body = await errorBody(res, 503);
      assert.match(body.detail, /Storage is temporarily unavailable/);
      intruder.exec("ROLLBACK");
      assert.equal(gw.fake!.calls.decide, 0, "no model call without a reservation");
      assert.deepEqual(await gw.store.getBalance(gw.orgId), { available: 10_000, reserved: 0, spent: 0, granted: 10_000 });
      assert.equal((await gw.store.listUsage(gw.orgId, { limit: 10 })).records.length, 0);
      assert.equal((await gw.decide(sampleRequest())).status, 200, "recovers as soon as the lock is gone");
    } finally {
      intruder.close();
      await gw.close();
    }
  });
});

describe("another process holds the SQLite write lock", { timeout: 60_000 }, () => {
  test("health, readiness and metrics answer while decisions wait on the lock; the decisions get 503 after the storage wait; then recover", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-lock-"));
    const file = join(dir, "tds.sqlite");
    const fake = await startFakeModelServer();
    const setup = openSqliteStore(file);
    const org = await setup.createOrganization({ id: newOrganizationId(), name: "locked", nowMs: Date.now() });
    const key = generateApiKey();
    await setup.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: Date.now() });
    await setup.close();
    const gw = await startGatewayProcess({ TDS_DATABASE_URL: `sqlite:${file}`, TDS_MODEL_SERVICE_URL: fake.url });
    const decide = (i: number) =>
      fetch(`${gw.url}/v1/systemone`, {
        method: "POST",
        headers: { authorization: `Bearer ${key.raw}`, "content-type": "application/json" },
        body: JSON.stringify(sampleRequest({ state: { i } })),
      });
    const warm = await decide(0);
    if (warm.status !== 200) {
      await gw.stop();
      await fake.close();
      assert.fail(`warm: ${warm.status} ${await warm.text()}`);
    }
    // A second process, started once the warm-up request is answered: BEGIN IMMEDIATE, a write, then no COMMIT until
    // the test says so (as `tds credits grant` or a backup tool could hold it), so the lock outlasts the storage wait
    // however slowly this machine runs.
    const holder = spawn(
      process.execPath,
      [
        "-e",
        `const D = require("better-sqlite3"); const db = new D(${JSON.stringify(file)}); db.exec("BEGIN IMMEDIATE");
         db.prepare("UPDATE organizations SET paused = 0").run(); process.stdout.write("locked\\n");
         process.stdin.once("data", () => { db.exec("COMMIT"); db.close(); process.exit(0); });`,
      ],
      { cwd: process.cwd(), stdio: ["pipe", "pipe", "inherit"] },
    );
    try {
      await new Promise<void>((resolve) => holder.stdout!.once("data", () => resolve()));
      const lockedAt = performance.now();
      let answered = 0;
      const decisions = Array.from({ length: 4 }, (_, i) =>
        decide(i + 1).then(async (res) => {
          answered++;
          return { status: res.status, body: await res.text(), ms: performance.now() - lockedAt };
        }),
      );
      const allAnswered = Promise.all(decisions);
      // Rounds of the three probes at once until every decision has its answer; each sample notes whether a
      // decision had been answered yet. Were the storage wait to block the event loop, no probe would be answered
      // before the decisions are.
      const samples: { path: string; status: number; whileWaiting: boolean }[] = [];
      let done = false;
      const markDone = () => {
        done = true;
      };
      allAnswered.then(markDone, markDone);
      while (!done) {
        await Promise.all(
          ["/healthz", "/readyz", "/metrics"].map(async (path) => {
            const res = await fetch(`${gw.url}${path}`);
            await res.text();
            samples.push({ path, status: res.status, whileWaiting: answered === 0 });
          }),
        );
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.deepEqual(
        samples.filter((s) => s.status !== 200),
        [],
        "every health, readiness and metrics request answered 200 while the lock was held",
      );
      for (const path of ["/healthz", "/readyz", "/metrics"])
        assert.ok(
          samples.some((s) => s.path === path && s.whileWaiting),
          `${path} answered while the decisions waited for the database`,
        );
      for (const d of await allAnswered) {
        assert.equal(d.status, 503, d.body);
        assert.match(d.body, /Storage is temporarily unavailable/);
        // A lower bound only (a timer never fires early); the lock was still held when they were answered.
        assert.ok(d.ms >= 1900, `503 after the 2 s storage wait, not before: ${d.ms} ms`);
      }
      holder.stdin!.end("commit\n");
      await new Promise<void>((resolve) => (holder.exitCode !== null ? resolve() : holder.once("exit", () => resolve())));
      assert.equal(holder.exitCode, 0, "the holder committed");
      assert.equal((await decide(9)).status, 200, "recovers once the lock is released");
    } finally {
      holder.kill();
      await gw.stop();
      await fake.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
