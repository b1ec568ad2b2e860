import type { Balance, LedgerEntry, Reservation, ReservationStatus } from "../../domain/credits.ts";
import type { UsageRecord } from "../../domain/usage-records.ts";
import type { BatchRequestRow, BatchRow } from "../batches/batch-rows.ts";
import { bigint, boolean, float, int, Table, text } from "./table.ts";

/**
 * The tables of the books and of batches, described once for both dialects (the migrations create them). A column
 * added to a table is added here, to the two migrations, and to the code that sets its value.
 */

/**
 * A usage record as stored: with the instance (gateway process) that admitted it, null when none is known, and the
 * credit reservation of a paid request (all three null when it reserved nothing): pending exactly while the record
 * is in flight, resolved once with the final record (migration 010; before it, a table of its own). A reservation
 * made by a key with a budget also counts in the key spend of `keyBudgetKeyId` (the key's lineage id) and
 * `keyBudgetPeriod` (key_spend, migration 013), fixed at admission and kept after it resolves; both null otherwise.
 */
export type StoredUsageRecord = UsageRecord & {
  instanceId: string | null;
  reservedMicrousd: number | null;
  reservationExpiresAtMs: number | null;
  reservationStatus: ReservationStatus | null;
  keyBudgetKeyId: string | null;
  keyBudgetPeriod: string | null;
};

export const usageRecords = new Table<StoredUsageRecord>("usage_records", {
  requestId: text("request_id"),
  orgId: text("org_id"),
  keyId: text("key_id"),
  createdAtMs: bigint("created_at_ms"),
  source: text("source"),
  model: text("model"),
  mode: text("mode"),
  outcome: text("outcome"),
  httpStatus: int("http_status"),
  inputTokens: bigint("input_tokens"),
  outputTokens: bigint("output_tokens"),
  costMicrousd: bigint("cost_microusd"),
  latencyMs: float("latency_ms"),
  gatewayLatencyMs: float("gateway_latency_ms"),
  errorDetail: text("error_detail"),
  overReservation: boolean("over_reservation"),
  completedAtMs: bigint("completed_at_ms"),
  deployment: text("deployment"),
  attempts: int("attempts"),
  instanceId: text("instance_id"),
  reservedMicrousd: bigint("reserved_microusd"),
  reservationExpiresAtMs: bigint("reservation_expires_at_ms"),
  reservationStatus: text("reservation_status"),
  keyBudgetKeyId: text("key_budget_key_id"),
  keyBudgetPeriod: text("key_budget_period"),
});

/** The columns of the reservation a paid request's record holds, with the key spend it counts in. */
export const RESERVATION_FIELDS = [
  "reservedMicrousd",
  "reservationExpiresAtMs",
  "reservationStatus",
  "keyBudgetKeyId",
  "keyBudgetPeriod",
] as const;

/** The fields of a UsageRecord (read back): every column but the admitting instance and the reservation. */
export const USAGE_RECORD_FIELDS = usageRecords.fieldsExcept("instanceId", ...RESERVATION_FIELDS);

/** The reservation of a record that holds one, as the domain states it (its id is the request id; resolved with the record). */
export function reservationOf(
  record: Pick<
    StoredUsageRecord,
    "requestId" | "orgId" | "createdAtMs" | "completedAtMs" | "costMicrousd" | (typeof RESERVATION_FIELDS)[number]
  >,
): Reservation | null {
  const { reservedMicrousd, reservationExpiresAtMs, reservationStatus: status } = record;
  if (reservedMicrousd === null || reservationExpiresAtMs === null || status === null) return null;
  return {
    id: record.requestId,
    orgId: record.orgId,
    requestId: record.requestId,
    amountMicrousd: reservedMicrousd,
    status,
    costMicrousd: status === "settled" ? record.costMicrousd : null,
    createdAtMs: record.createdAtMs,
    expiresAtMs: reservationExpiresAtMs,
    resolvedAtMs: status === "pending" ? null : record.completedAtMs,
  };
}

export const ledgerEntries = new Table<LedgerEntry>("ledger_entries", {
  id: bigint("id"),
  orgId: text("org_id"),
  kind: text("kind"),
  reservationId: text("reservation_id"),
  availableDelta: bigint("available_delta"),
  reservedDelta: bigint("reserved_delta"),
  spentDelta: bigint("spent_delta"),
  grantedDelta: bigint("granted_delta"),
  createdAtMs: bigint("created_at_ms"),
  note: text("note"),
});

/** The fields an appended entry is written with (the id is generated). */
export const NEW_LEDGER_FIELDS = ledgerEntries.fieldsExcept("id");

export type OrgBalance = Balance & { orgId: string };

export const orgBalances = new Table<OrgBalance>("org_balances", {
  orgId: text("org_id"),
  available: bigint("available"),
  reserved: bigint("reserved"),
  spent: bigint("spent"),
  granted: bigint("granted"),
});

/** The amounts of a balance row. */
export const BALANCE_FIELDS = orgBalances.fieldsExcept("orgId");

/** Preview requests counted per UTC day ("YYYY-MM-DD"); the scope is an organization id or the whole service's. */
export interface PreviewCounter {
  scope: string;
  day: string;
  count: number;
}

export const previewCounters = new Table<PreviewCounter>("preview_counters", {
  scope: text("scope"),
  day: text("day"),
  count: bigint("count"),
});

/** What a key with a budget has reserved (requests in flight) and spent in one UTC period ("YYYY-MM-DD" or "YYYY-MM"). */
export interface KeySpend {
  /** The key's lineage id: the keys of one chain of rotations spend together. */
  keyId: string;
  period: string;
  reservedMicrousd: number;
  spentMicrousd: number;
}

export const keySpends = new Table<KeySpend>("key_spend", {
  keyId: text("key_id"),
  period: text("period"),
  reservedMicrousd: bigint("reserved_microusd"),
  spentMicrousd: bigint("spent_microusd"),
});

/** The amounts of a key_spend row. */
export const KEY_SPEND_FIELDS = keySpends.fieldsExcept("keyId", "period");

/** An idempotency_keys row. */
export interface IdempotencyEntry {
  orgId: string;
  key: string;
  requestHash: string;
  /** The request that holds the claim, or produced the kept response. */
  requestId: string;
  state: "in_progress" | "completed";
  /** Set once completed. */
  responseStatus: number | null;
  /** The kept body; null while in progress, and when the response was too large to keep. */
  responseBody: string | null;
  responseRequestId: string | null;
  lockUntilMs: number;
  expiresAtMs: number;
}

export const idempotencyKeys = new Table<IdempotencyEntry>("idempotency_keys", {
  orgId: text("org_id"),
  key: text("key"),
  requestHash: text("request_hash"),
  requestId: text("request_id"),
  state: text("state"),
  responseStatus: int("response_status"),
  responseBody: text("response_body"),
  responseRequestId: text("response_request_id"),
  lockUntilMs: bigint("lock_until_ms"),
  expiresAtMs: bigint("expires_at_ms"),
});

/** A change to one day's usage_daily row; the counts are deltas (negative for the request that leaves in_flight). */
export interface UsageDailyDelta {
  orgId: string;
  dayStartMs: number;
  requests: number;
  inFlight: number;
  succeeded: number;
  /** Every final outcome but succeeded. */
  failed: number;
  inputTokens: number;
  outputTokens: number;
  costMicrousd: number;
}

export const usageDaily = new Table<UsageDailyDelta>("usage_daily", {
  orgId: text("org_id"),
  dayStartMs: bigint("day_start_ms"),
  requests: bigint("requests"),
  inFlight: bigint("in_flight"),
  succeeded: bigint("succeeded"),
  failed: bigint("failed"),
  inputTokens: bigint("input_tokens"),
  outputTokens: bigint("output_tokens"),
  costMicrousd: bigint("cost_microusd"),
});

/** The counts of a day's row (what a change adds). */
export const USAGE_DAILY_COUNTS = usageDaily.fieldsExcept("orgId", "dayStartMs");

/** Batch submissions (migration 011). */
export const batches = new Table<BatchRow>("batches", {
  id: text("id"),
  orgId: text("org_id"),
  keyId: text("key_id"),
  model: text("model"),
  status: text("status"),
  createdAtMs: bigint("created_at_ms"),
  startedAtMs: bigint("started_at_ms"),
  endedAtMs: bigint("ended_at_ms"),
  expiresAtMs: bigint("expires_at_ms"),
  touchedAtMs: bigint("touched_at_ms"),
  total: int("total"),
  succeeded: int("succeeded"),
  failed: int("failed"),
  expired: int("expired"),
  costMicrousd: bigint("cost_microusd"),
  inputBytes: bigint("input_bytes"),
  idempotencyKey: text("idempotency_key"),
  requestHash: text("request_hash"),
});

/** The fields of a BatchRecord. */
export const BATCH_FIELDS = batches.fieldsExcept("touchedAtMs", "expired", "idempotencyKey", "requestHash");

/** The requests of batches, one row per input line (migration 011). */
export const batchRequests = new Table<BatchRequestRow>("batch_requests", {
  batchId: text("batch_id"),
  position: int("position"),
  customId: text("custom_id"),
  body: text("body"),
  state: text("state"),
  requestId: text("request_id"),
  claimedBy: text("claimed_by"),
  leaseUntilMs: bigint("lease_until_ms"),
  resultStatus: int("result_status"),
  resultBody: text("result_body"),
  costMicrousd: bigint("cost_microusd"),
  finishedAtMs: bigint("finished_at_ms"),
});
