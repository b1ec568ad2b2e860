/**
 * The work of a gateway process that is gone (migration 008: gateway_instances, usage_records.instance_id), on SQLite
 * and PostgreSQL: store.releaseOrphans completes the requests in flight of an instance whose lease ended — or, with
 * createdBeforeMs (one process serves the database), every other one from before it — as the sweep does (gateway_error,
 * nothing charged, the roll-up exact) but releasing their reservations, exactly once; never those of the asking
 * instance, of a live lease, or of an unknown instance. A claim of an Idempotency-Key whose request is in flight says
 * whose lease holds it, is abandoned once that lease ended, and is taken over once its request was completed.
 * store.renewLease keeps one row per instance and drops leases that ended long ago with nothing in flight.
 *
 * PostgreSQL: a fresh database per test (TDS_TEST_POSTGRES_URL); TDS_SKIP_POSTGRES=1 skips those tests.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, afterEach, beforeEach, describe, it } from "node:test";
import type { AdmitCommand } from "../../src/domain/bookkeeping.ts";
import { ORPHANED_DETAIL } from "../../src/store/bookkeeping/programs.ts";
import { openPostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";
import { assertLedgerMatches } from "../support/books.ts";
import { createTestDatabase } from "../support/postgres-db.ts";
import { assertRollUpExact, reservationStatuses, rowsOf } from "../support/roll-up.ts";
import { admission, completion, T0 } from "./store-contract.ts";

const SKIP_POSTGRES = process.env.TDS_SKIP_POSTGRES === "1";
const MINUTE = 60_000;
const DAY_MS = 86_400_000;
const GRANT = 10_000;

const dirs: string[] = [];
after(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

const paid = (requestId: string, instanceId: string | null, amount: number, nowMs = T0): AdmitCommand =>
  admission({ requestId, orgId: "org_a", instanceId, nowMs, reservation: { amountMicrousd: amount, expiresAtMs: nowMs + 2 * MINUTE } });
const keyed = (requestId: string, instanceId: string | null, nowMs: number, key = "key-1"): AdmitCommand => ({
  ...paid(requestId, instanceId, 100, nowMs),
  idempotency: { key, requestHash: "hash-1", lockUntilMs: nowMs + 2 * MINUTE, expiresAtMs: nowMs + DAY_MS },
});

for (const dialect of ["sqlite", "postgres"] as const) {
  describe(`${dialect}: the work of a gateway process that is gone`, { skip: dialect === "postgres" && SKIP_POSTGRES }, () => {
    let store: Store;
    let drop: () => Promise<void> = async () => {};
    let url = "";

    beforeEach(async () => {
      if (dialect === "sqlite") {
        const dir = mkdtempSync(join(tmpdir(), "tds-orphans-"));
        dirs.push(dir);
        store = openSqliteStore(join(dir, "tds.sqlite"));
      } else {
        const db = await createTestDatabase("tds_orphans");
        store = await openPostgresStore(db.url);
        drop = db.drop;
        url = db.url;
      }
      await store.createOrganization({ id: "org_a", name: "org a", nowMs: T0 });
      await store.grantCredits({ orgId: "org_a", amountMicrousd: GRANT, nowMs: T0 });
    });
    afterEach(async () => {
      await store.close();
      await drop();
    });

    const admit = async (...admissions: AdmitCommand[]) => (await store.commitBatch({ admissions, completions: [] })).admissions;
    const lease = (instanceId: string, leaseUntilMs: number, nowMs = T0) =>
      store.renewLease({ instanceId, startedAtMs: T0, leaseUntilMs, nowMs });
    const outcome = async (requestId: string) => (await store.getUsage("org_a", requestId))?.outcome;

    it("releases the requests of an instance whose lease ended, once: gateway_error, nothing charged, reservations released", async () => {
      await lease("gw_a", T0 + 15_000);
      await lease("gw_b", T0 + 60_000);
      await admit(
        paid("a_paid", "gw_a", 300),
        admission({
          requestId: "a_preview",
          orgId: "org_a",
          instanceId: "gw_a",
          quota: { day: "2026-01-01", orgLimit: 9, globalLimit: 9 },
        }),
        paid("b_paid", "gw_b", 200),
        paid("legacy", null, 100),
        paid("unknown", "gw_never_leased", 50),
      );
      const release = (instanceId: string, nowMs: number) => store.releaseOrphans({ instanceId, nowMs, createdBeforeMs: null, limit: 10 });

      assert.deepEqual(await release("gw_b", T0 + 14_999), { released: 0 }, "gw_a's lease still runs");
      assert.deepEqual(await release("gw_b", T0 + 15_000), { released: 2 });
      assert.deepEqual(await release("gw_b", T0 + 15_001), { released: 0 }, "exactly once");
      for (const id of ["a_paid", "a_preview"]) {
        const record = await store.getUsage("org_a", id);
        assert.deepEqual(
          [record?.outcome, record?.httpStatus, record?.costMicrousd, record?.errorDetail, record?.completedAtMs],
          ["gateway_error", null, 0, ORPHANED_DETAIL, T0 + 15_000],
          id,
        );
      }
      const reservation = await store.getReservation("a_paid");
      assert.deepEqual([reservation?.status, reservation?.costMicrousd, reservation?.resolvedAtMs], ["released", null, T0 + 15_000]);
      assert.deepEqual(
        (await store.listLedger("org_a"))
          .filter((e) => e.kind === "release")
          .map((e) => [e.reservationId, e.availableDelta, e.reservedDelta, e.spentDelta]),
        [["a_paid", 0, 0, 0]],
        "one entry records the release: nothing changed for good",
      );
      assert.deepEqual(await assertLedgerMatches(store, "org_a"), { available: GRANT - 350, reserved: 350, spent: 0, granted: GRANT });
      assert.deepEqual(
        await store.commitBatch({
          admissions: [],
          completions: [completion({ requestId: "a_paid", orgId: "org_a", nowMs: T0 + 16_000, costMicrousd: 100, reserved: true })],
        }),
        { admissions: [], completions: [{ kind: "not_in_flight" }] },
        "the dead process's completion, had it come, would change nothing",
      );

      assert.deepEqual(await release("gw_a", T0 + 60_000), { released: 1 }, "gw_b's lease ended: another instance releases it");
      assert.equal(await outcome("b_paid"), "gateway_error");
      assert.deepEqual(
        [await outcome("legacy"), await outcome("unknown")],
        ["in_flight", "in_flight"],
        "no instance recorded, or no lease known: left to the TTL sweep",
      );
      assert.deepEqual(await store.sweep({ nowMs: T0 + 3 * MINUTE, inFlightBeforeMs: T0 + 1, limit: 10 }), { abandoned: 2 });
      assert.deepEqual(await assertLedgerMatches(store, "org_a"), { available: GRANT, reserved: 0, spent: 0, granted: GRANT });
      assert.deepEqual(await reservationStatuses(store), { expired: 2, released: 2 });
      const [day] = await assertRollUpExact(store);
      assert.deepEqual([day?.requests, day?.in_flight, day?.failed], [5, 0, 5]);
    });

    it("with createdBeforeMs (one process serves the database): every other request from before it, oldest first, at most limit", async () => {
      await lease("gw_old", T0 + DAY_MS, T0);
      await admit(
        paid("x1", "gw_old", 10, T0),
        paid("x2", null, 20, T0 + 1),
        paid("x3", "gw_self", 40, T0 + 2),
        paid("x4", "gw_old", 80, T0 + 10),
      );
      const release = (limit: number) => store.releaseOrphans({ instanceId: "gw_self", nowMs: T0 + 20, createdBeforeMs: T0 + 10, limit });
      assert.deepEqual(await release(1), { released: 1 });
      assert.deepEqual([await outcome("x1"), await outcome("x2")], ["gateway_error", "in_flight"], "the oldest first");
      assert.deepEqual(await release(10), { released: 1 });
      assert.deepEqual(
        [await outcome("x2"), await outcome("x3"), await outcome("x4")],
        ["gateway_error", "in_flight", "in_flight"],
        "its own request, and one created at createdBeforeMs by a live lease, stay",
      );
      assert.deepEqual(await assertLedgerMatches(store, "org_a"), { available: GRANT - 120, reserved: 120, spent: 0, granted: GRANT });
      await assertRollUpExact(store);
    });

    it("a claim whose request is in flight: in progress until its owner's lease ends, then abandoned, then taken over once released", async () => {
      await lease("gw_a", T0 + 15_000);
      assert.deepEqual(await admit(keyed("req_1", "gw_a", T0)), [{ kind: "admitted" }]);
      assert.deepEqual(await admit(keyed("req_2", "gw_b", T0 + 1000)), [
        { kind: "idempotency_in_progress", ownerLeaseUntilMs: T0 + 15_000 },
      ]);
      assert.deepEqual(await admit(keyed("req_2", "gw_a", T0 + 1000)), [{ kind: "idempotency_in_progress" }], "its own instance: alive");
      assert.deepEqual(await admit(keyed("req_2", "gw_b", T0 + 15_000)), [{ kind: "idempotency_abandoned", requestId: "req_1" }]);
      assert.deepEqual(await store.releaseOrphans({ instanceId: "gw_b", nowMs: T0 + 15_000, createdBeforeMs: null, limit: 10 }), {
        released: 1,
      });
      assert.deepEqual(await admit(keyed("req_2", "gw_b", T0 + 15_001)), [{ kind: "admitted" }], "long before the lock passes");
      const response = { status: 200, body: '{"ok":true}', requestId: "req_2" };
      await store.commitBatch({
        admissions: [],
        completions: [
          completion({ requestId: "req_2", orgId: "org_a", nowMs: T0 + 16_000, reserved: true, idempotency: { key: "key-1", response } }),
        ],
      });
      assert.deepEqual(await admit(keyed("req_3", "gw_b", T0 + 17_000)), [{ kind: "replay", response }]);
      await assertLedgerMatches(store, "org_a");
      await assertRollUpExact(store);
    });

    it("a claim whose request the TTL sweep completed blocks nothing: taken over before its lock passes", async () => {
      await admit(keyed("req_1", null, T0, "key-swept"));
      assert.deepEqual(await admit(keyed("req_2", null, T0 + 1, "key-swept")), [{ kind: "idempotency_in_progress" }]);
      assert.deepEqual(await store.sweep({ nowMs: T0 + 2, inFlightBeforeMs: T0 + 1, limit: 10 }), { abandoned: 1 });
      assert.deepEqual(await admit(keyed("req_2", null, T0 + 3, "key-swept")), [{ kind: "admitted" }], "its lock has not passed");
      assert.deepEqual(await admit(keyed("req_3", null, T0 + 4, "key-swept")), [{ kind: "idempotency_in_progress" }], "req_2 holds it");
    });

    it("renewLease keeps one row per instance and drops leases that ended a day ago, unless they hold work in flight", async () => {
      await lease("gw_a", T0 + 15_000);
      await lease("gw_a", T0 + 20_000, T0 + 5000);
      await lease("gw_busy", T0 + 15_000);
      await admit(paid("busy_1", "gw_busy", 10));
      await lease("gw_idle", T0 + 15_000);
      const leases = async () =>
        (await rowsOf(store, "SELECT id, started_at_ms, lease_until_ms FROM gateway_instances ORDER BY id")).map((r) => [
          r.id,
          r.lease_until_ms,
        ]);
      assert.deepEqual(await leases(), [
        ["gw_a", T0 + 20_000],
        ["gw_busy", T0 + 15_000],
        ["gw_idle", T0 + 15_000],
      ]);
      await lease("gw_new", T0 + 2 * DAY_MS, T0 + DAY_MS + 15_000);
      assert.deepEqual(
        await leases(),
        [
          ["gw_a", T0 + 20_000],
          ["gw_busy", T0 + 15_000],
          ["gw_idle", T0 + 15_000],
          ["gw_new", T0 + 2 * DAY_MS],
        ],
        "ended exactly a day ago: kept",
      );
      await lease("gw_new", T0 + 2 * DAY_MS, T0 + DAY_MS + 20_001);
      assert.deepEqual(await leases(), [
        ["gw_busy", T0 + 15_000],
        ["gw_new", T0 + 2 * DAY_MS],
      ]);
      assert.equal((await rowsOf(store, "SELECT instance_id FROM usage_records WHERE request_id = 'busy_1'"))[0]?.instance_id, "gw_busy");
    });

    if (dialect === "postgres") {
      it("two instances releasing at once complete each request exactly once", async () => {
        await lease("gw_dead", T0 + 1000);
        const n = 30;
        await admit(...Array.from({ length: n }, (_, i) => paid(`dead_${String(i).padStart(2, "0")}`, "gw_dead", 10 + i, T0 + i)));
        const other = await openPostgresStore(url);
        try {
          const drain = async (s: Store, instanceId: string) => {
            let total = 0;
            for (;;) {
              const { released } = await s.releaseOrphans({ instanceId, nowMs: T0 + 2000, createdBeforeMs: null, limit: 4 });
              total += released;
              if (released < 4) return total;
            }
          };
          const counts = await Promise.all([drain(store, "gw_1"), drain(other, "gw_2"), drain(store, "gw_1"), drain(other, "gw_2")]);
          const left = await drain(store, "gw_1");
          assert.equal(counts.reduce((a, b) => a + b, 0) + left, n, JSON.stringify(counts));
        } finally {
          await other.close();
        }
        assert.deepEqual(await reservationStatuses(store), { released: n });
        assert.deepEqual(await assertLedgerMatches(store, "org_a"), { available: GRANT, reserved: 0, spent: 0, granted: GRANT });
        await assertRollUpExact(store);
      });
    }
  });
}
