/**
 * Books as the service wrote them before migration 010 (reservations in a table of their own, a reserve entry at
 * admission), and what must hold after it: the migration tests of both databases.
 */
import assert from "node:assert/strict";
import type { Store } from "../../src/store/store.ts";
import { admission, completion, T0 } from "../store/store-contract.ts";
import { assertLedgerMatches } from "./books.ts";

const HOUR = 3_600_000;
const DAY_START = T0 - (T0 % 86_400_000);

/**
 * req_done settled (cost 40 of 100), req_fail released (50), req_run in flight with a pending reservation of 300,
 * req_gone pending (200) without a record (its request was never recorded), req_view a preview request in flight.
 * `bool` writes a boolean in the dialect.
 */
export function rowsBefore010(bool: (b: boolean) => string): string {
  const record = (id: string, mode: string, outcome: string, status: string, cost: number, completed: string) =>
    `('${id}', 'org_1', 'k1', ${T0}, 'api', 'jev-1', '${mode}', '${outcome}', ${status}, 0, 0, ${cost}, NULL, 1, NULL, ${bool(false)}, ${completed}, NULL, 0, NULL)`;
  return `
  INSERT INTO organizations (id, name, paused, created_at_ms) VALUES ('org_1', 'Acme', ${bool(false)}, 1);
  INSERT INTO org_balances (org_id, available, reserved, spent, granted) VALUES ('org_1', 9460, 500, 40, 10000);
  INSERT INTO reservations (id, org_id, request_id, amount_microusd, status, cost_microusd, created_at_ms, expires_at_ms, resolved_at_ms) VALUES
    ('req_done', 'org_1', 'req_done', 100, 'settled', 40, ${T0}, ${T0 + HOUR}, ${T0 + 5}),
    ('req_fail', 'org_1', 'req_fail', 50, 'released', NULL, ${T0}, ${T0 + HOUR}, ${T0 + 5}),
    ('req_run', 'org_1', 'req_run', 300, 'pending', NULL, ${T0}, ${T0 + HOUR}, NULL),
    ('req_gone', 'org_1', 'req_gone', 200, 'pending', NULL, ${T0}, ${T0 + HOUR}, NULL);
  INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note) VALUES
    ('org_1', 'grant', NULL, 10000, 0, 0, 10000, 1, NULL),
    ('org_1', 'reserve', 'req_done', -100, 100, 0, 0, ${T0}, NULL),
    ('org_1', 'reserve', 'req_fail', -50, 50, 0, 0, ${T0}, NULL),
    ('org_1', 'reserve', 'req_run', -300, 300, 0, 0, ${T0}, NULL),
    ('org_1', 'reserve', 'req_gone', -200, 200, 0, 0, ${T0}, NULL),
    ('org_1', 'settle', 'req_done', 60, -100, 40, 0, ${T0 + 5}, NULL),
    ('org_1', 'release', 'req_fail', 50, -50, 0, 0, ${T0 + 5}, NULL);
  INSERT INTO usage_records (request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens, output_tokens,
    cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms, deployment, attempts, instance_id) VALUES
    ${record("req_done", "paid", "succeeded", "200", 40, `${T0 + 5}`)},
    ${record("req_fail", "paid", "model_error", "502", 0, `${T0 + 5}`)},
    ${record("req_run", "paid", "in_flight", "NULL", 0, "NULL")},
    ${record("req_view", "preview", "in_flight", "NULL", 0, "NULL")};
  INSERT INTO usage_daily (org_id, day_start_ms, requests, in_flight, succeeded, failed, input_tokens, output_tokens, cost_microusd) VALUES
    ('org_1', ${DAY_START}, 4, 2, 1, 1, 0, 0, 40);
  `;
}

/** The books after 010: each reservation on its record, the one without a record expired, the ledger exact. */
export async function checkRowsAfter010(store: Store): Promise<void> {
  assert.deepEqual(await assertLedgerMatches(store, "org_1"), { available: 9660, reserved: 300, spent: 40, granted: 10000 });
  const reservation = async (id: string) => {
    const r = await store.getReservation(id);
    return r && [r.status, r.amountMicrousd, r.costMicrousd, r.expiresAtMs, r.resolvedAtMs];
  };
  assert.deepEqual(await reservation("req_done"), ["settled", 100, 40, T0 + HOUR, T0 + 5]);
  assert.deepEqual(await reservation("req_fail"), ["released", 50, null, T0 + HOUR, T0 + 5]);
  assert.deepEqual(await reservation("req_run"), ["pending", 300, null, T0 + HOUR, null]);
  assert.equal(await reservation("req_gone"), null, "no record to hold it: the ledger keeps its history");
  assert.equal(await reservation("req_view"), null, "a preview request reserves nothing");
  const migrated = (await store.listLedger("org_1")).slice(7).map((e) => [e.kind, e.reservationId, e.availableDelta, e.reservedDelta]);
  assert.deepEqual(migrated, [
    ["expire", "req_gone", 200, -200],
    ["reserve", "req_run", 300, -300],
  ]);

  // The request in flight completes as any other: one settle entry; a new paid request writes one entry too.
  const done = await store.commitBatch({
    admissions: [
      admission({ requestId: "req_new", orgId: "org_1", nowMs: T0 + 10, reservation: { amountMicrousd: 70, expiresAtMs: T0 + HOUR } }),
    ],
    completions: [completion({ requestId: "req_run", orgId: "org_1", nowMs: T0 + 10, costMicrousd: 120, reserved: true })],
  });
  assert.deepEqual(done, { admissions: [{ kind: "admitted" }], completions: [{ kind: "completed" }] });
  await store.commitBatch({
    admissions: [],
    completions: [
      completion({ requestId: "req_new", orgId: "org_1", nowMs: T0 + 11, outcome: "model_error", httpStatus: 502, reserved: true }),
    ],
  });
  assert.deepEqual(await assertLedgerMatches(store, "org_1"), { available: 9840, reserved: 0, spent: 160, granted: 10000 });
  assert.deepEqual(
    (await store.listLedger("org_1")).slice(9).map((e) => [e.kind, e.reservationId, e.availableDelta, e.reservedDelta, e.spentDelta]),
    [
      ["settle", "req_run", -120, 0, 120],
      ["release", "req_new", 0, 0, 0],
    ],
  );
}
