/**
 * Rows that break the books' invariants, written past the store: the schema of each database must refuse every one
 * (CHECK, NOT NULL, foreign keys). `seedInvariantRows` writes what they refer to.
 */
import type { Store } from "../../src/store/store.ts";
import { admission, recordUsage, usageRecord } from "./store-contract.ts";

/** org_1 with 1,000 microUSD granted; q1 in flight holding a reservation of 100; q2 a record without one. */
export async function seedInvariantRows(store: Store): Promise<void> {
  await store.createOrganization({ id: "org_1", name: "Acme", nowMs: 1 });
  await store.grantCredits({ orgId: "org_1", amountMicrousd: 1000, nowMs: 2 });
  await recordUsage(store, [usageRecord({ requestId: "q2", orgId: "org_1" })]);
  const { admissions } = await store.commitBatch({
    admissions: [admission({ requestId: "q1", orgId: "org_1", nowMs: 3, reservation: { amountMicrousd: 100, expiresAtMs: 10 } })],
    completions: [],
  });
  if (admissions[0]?.kind !== "admitted") throw new Error(`q1 was not admitted: ${JSON.stringify(admissions[0])}`);
}

/** The balance seedInvariantRows leaves, which no refused statement may change. */
export const SEEDED_BALANCE = { available: 900, reserved: 100, spent: 0, granted: 1000 };

export const REFUSED_STATEMENTS: readonly string[] = [
  "UPDATE org_balances SET available = available + 1",
  "UPDATE org_balances SET available = -1, granted = granted - 901",
  "UPDATE org_balances SET reserved = reserved - 101, granted = granted - 101",
  "UPDATE usage_records SET reservation_status = 'settled', outcome = 'succeeded', completed_at_ms = 4, cost_microusd = 101 WHERE request_id = 'q1'",
  "UPDATE usage_records SET reservation_status = 'released', outcome = 'model_error', completed_at_ms = 4, cost_microusd = 1 WHERE request_id = 'q1'",
  "UPDATE usage_records SET reservation_status = 'expired' WHERE request_id = 'q1'",
  "UPDATE usage_records SET reservation_status = 'pending', outcome = 'gateway_error', completed_at_ms = 4 WHERE request_id = 'q1'",
  "UPDATE usage_records SET reservation_status = 'cancelled' WHERE request_id = 'q1'",
  "UPDATE usage_records SET reserved_microusd = NULL WHERE request_id = 'q1'",
  "UPDATE usage_records SET reserved_microusd = -1 WHERE request_id = 'q1'",
  "UPDATE usage_records SET reservation_status = 'pending', reserved_microusd = 1, reservation_expires_at_ms = 1 WHERE request_id = 'q2'",
  "INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms) VALUES ('org_1', 'grant', NULL, 5, 0, 0, 4, 5)",
  "INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms) VALUES ('org_1', 'settle', NULL, 0, 0, 0, 0, 5)",
  "INSERT INTO org_balances (org_id) VALUES ('org_missing')",
  "INSERT INTO preview_counters (scope, day, count) VALUES ('org_1', '2026-1-1', 1)",
  "INSERT INTO idempotency_keys (org_id, key, request_hash, request_id, state, lock_until_ms, expires_at_ms) VALUES ('org_1', 'k', 'h', 'q', 'completed', 1, 2)",
  "INSERT INTO idempotency_keys (org_id, key, request_hash, request_id, state, response_body, lock_until_ms, expires_at_ms) VALUES ('org_1', 'k', 'h', 'q', 'in_progress', '{}', 1, 2)",
  "UPDATE usage_records SET http_status = 200 WHERE request_id = 'q1'",
  "UPDATE usage_records SET completed_at_ms = 5 WHERE request_id = 'q1'",
  "UPDATE usage_records SET completed_at_ms = NULL WHERE request_id = 'q2'",
  "UPDATE usage_records SET outcome = 'cancelled' WHERE request_id = 'q2'",
];
