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
    const gw = await startGateway({ env: { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1", TDS_RESERVE_TOKENS: "1000" } });
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

describe("another process holds the SQLite write lock for 5 s", { timeout: 60_000 }, () => {
  test("health, readiness and metrics answer within 50 ms throughout; decisions wait without blocking and get 503 after the storage wait; then recover", async () => {
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
    // A second process: BEGIN IMMEDIATE, a write, then 5 s before COMMIT (as `tds credits grant` or a backup tool could).
    const LOCK_MS = 5000;
    const holder = spawn(
      process.execPath,
      [
        "-e",
        `const D = require("better-sqlite3"); const db = new D(${JSON.stringify(file)}); db.exec("BEGIN IMMEDIATE");
         db.prepare("UPDATE organizations SET paused = 0").run(); process.stdout.write("locked\\n");
         setTimeout(() => { db.exec("COMMIT"); db.close(); process.exit(0); }, ${LOCK_MS});`,
      ],
      { cwd: process.cwd(), stdio: ["ignore", "pipe", "inherit"] },
    );
    try {
      assert.equal((await decide(0)).status, 200, "warm");
      await new Promise<void>((resolve) => holder.stdout!.once("data", () => resolve()));
      const lockedAt = performance.now();
      const decisions = Array.from({ length: 4 }, (_, i) =>
        decide(i + 1).then(async (res) => ({ status: res.status, body: await res.text(), ms: performance.now() - lockedAt })),
      );
      const samples: { path: string; ms: number; status: number }[] = [];
      while (performance.now() - lockedAt < LOCK_MS - 300) {
        for (const path of ["/healthz", "/readyz", "/metrics"]) {
          const started = performance.now();
          const res = await fetch(`${gw.url}${path}`);
          await res.text();
          samples.push({ path, ms: performance.now() - started, status: res.status });
        }
        await new Promise((r) => setTimeout(r, 50));
      }
      const slow = samples.filter((s) => s.ms >= 50 || s.status !== 200);
      assert.ok(samples.length >= 60, `sampled throughout: ${samples.length}`);
      assert.deepEqual(slow, [], "every health, readiness and metrics answer within 50 ms while the lock is held");
      for (const d of await Promise.all(decisions)) {
        assert.equal(d.status, 503, d.body);
        assert.match(d.body, /Storage is temporarily unavailable/);
        assert.ok(d.ms >= 1900 && d.ms < LOCK_MS, `503 after the 2 s storage wait, while the lock is still held: ${d.ms} ms`);
      }
      await new Promise<void>((resolve) => (holder.exitCode !== null ? resolve() : holder.once("exit", () => resolve())));
      assert.equal((await decide(9)).status, 200, "recovers once the lock is released");
    } finally {
      holder.kill();
      await gw.stop();
      await fake.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
