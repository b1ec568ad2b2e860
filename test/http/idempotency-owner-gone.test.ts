/**
 * An Idempotency-Key held by a request of another gateway process, through a real listening gateway on SQLite and
 * PostgreSQL: while that process's lease runs, a retry gets 409 saying another process runs it, with Retry-After until
 * the lease ends; once the lease has ended (the process is gone), the retry completes the dead request itself
 * (gateway_error, nothing charged, its reservation released) and runs. The other process is written straight into the
 * store: a lease and an admission under its instance id. PostgreSQL: TDS_SKIP_POSTGRES=1 skips it.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { AdmitCommand } from "../../src/domain/bookkeeping.ts";
import { ORPHANED_DETAIL } from "../../src/store/bookkeeping/programs.ts";
import { assertLedgerMatches } from "../support/books.ts";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { assertRollUpExact } from "../support/roll-up.ts";

const PAID = { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1" };
const GRANT = 10_000_000;
const DAY_MS = 86_400_000;

for (const dialect of ["sqlite", "postgres"] as const) {
  describe(`${dialect}: a retry of a key held by another gateway process`, {
    skip: dialect === "postgres" && process.env.TDS_SKIP_POSTGRES === "1" ? "TDS_SKIP_POSTGRES=1" : false,
  }, () => {
    test("409 with Retry-After while its lease runs; once it ended, the dead request is completed and the retry runs", async () => {
      const db = dialect === "postgres" ? await createTestDatabase("tds_owner_gone") : null;
      const gw = await startGateway({ env: { ...PAID, ...(db ? { TDS_DATABASE_URL: db.url } : {}) } });
      try {
        const now = Date.now();
        await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: GRANT, nowMs: now });
        const held = (requestId: string, instanceId: string, key: string): AdmitCommand => ({
          requestId,
          orgId: gw.orgId,
          keyId: gw.keyId,
          source: "api",
          model: "fake-small",
          mode: "paid",
          nowMs: now,
          instanceId,
          idempotency: { key, requestHash: "not-compared-while-in-progress", lockUntilMs: now + 120_000, expiresAtMs: now + DAY_MS },
          quota: null,
          reservation: { amountMicrousd: 1000, expiresAtMs: now + 120_000 },
        });
        await gw.store.renewLease({ instanceId: "gw_alive", startedAtMs: now, leaseUntilMs: now + 15_000, nowMs: now });
        await gw.store.renewLease({ instanceId: "gw_dead", startedAtMs: now - 60_000, leaseUntilMs: now - 1, nowMs: now });
        const admitted = await gw.store.commitBatch({
          admissions: [held("req_alive", "gw_alive", "k-alive"), held("req_dead", "gw_dead", "k-dead")],
          completions: [],
        });
        assert.deepEqual(admitted.admissions, [{ kind: "admitted" }, { kind: "admitted" }]);

        const running = await gw.decide(sampleRequest(), { "idempotency-key": "k-alive" });
        assert.equal(running.status, 409);
        assert.match(((await running.json()) as { detail: string }).detail, /still being processed by another gateway process/);
        const retryAfterMs = Number(running.headers.get("retry-after-ms"));
        assert.ok(retryAfterMs >= 1000 && retryAfterMs <= 15_000, `Retry-After until the lease ends: ${retryAfterMs} ms`);
        assert.equal(running.headers.get("retry-after"), String(Math.ceil(retryAfterMs / 1000)));

        const retry = await gw.decide(sampleRequest(), { "idempotency-key": "k-dead" });
        assert.equal(retry.status, 200, await retry.clone().text());
        assert.equal(retry.headers.get("idempotent-replayed"), null);
        const dead = await gw.store.getUsage(gw.orgId, "req_dead");
        assert.deepEqual([dead?.outcome, dead?.httpStatus, dead?.errorDetail], ["gateway_error", null, ORPHANED_DETAIL]);
        assert.equal((await gw.store.getReservation("req_dead"))?.status, "released");
        assert.equal((await gw.store.getUsage(gw.orgId, "req_alive"))?.outcome, "in_flight", "a live lease's request is left alone");

        const balance = await assertLedgerMatches(gw.store, gw.orgId);
        assert.equal(balance.reserved, 1000, "only req_alive's reservation is held");
        await assertRollUpExact(gw.store);
      } finally {
        await gw.close();
        await db?.drop();
      }
    });
  });
}
