import assert from "node:assert/strict";
import Database from "better-sqlite3";
import { describe, test } from "node:test";
import { sqlitePathOf } from "../../src/store/open-store.ts";
import { errorBody } from "../support/contract-check.ts";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";

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
