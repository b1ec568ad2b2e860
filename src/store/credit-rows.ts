import type { Balance, LedgerEntry, LedgerKind, Reservation, ReservationStatus } from "./store.ts";

/** Rows of the credit tables, the same in every dialect (PostgreSQL bigints are parsed to numbers by the adapter). */
export interface ReservationRow {
  id: string;
  org_id: string;
  request_id: string;
  amount_microusd: number;
  status: ReservationStatus;
  cost_microusd: number | null;
  created_at_ms: number;
  expires_at_ms: number;
  resolved_at_ms: number | null;
}

export interface LedgerRow {
  id: number;
  org_id: string;
  kind: LedgerKind;
  reservation_id: string | null;
  available_delta: number;
  reserved_delta: number;
  spent_delta: number;
  granted_delta: number;
  created_at_ms: number;
  note: string | null;
}

/** One balance change: applied to org_balances and appended to the ledger with the same numbers. */
export interface Delta {
  available: number;
  reserved: number;
  spent: number;
  granted: number;
}

export type SettleResult = "settled" | "expired" | "not_pending";
export type ReleaseResult = "released" | "not_pending";

export const RESERVATION_COLUMNS =
  "id, org_id, request_id, amount_microusd, status, cost_microusd, created_at_ms, expires_at_ms, resolved_at_ms";
export const LEDGER_COLUMNS =
  "id, org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note";
export const ZERO_BALANCE: Balance = Object.freeze({ available: 0, reserved: 0, spent: 0, granted: 0 });

export function toReservation(row: ReservationRow): Reservation {
  return {
    id: row.id,
    orgId: row.org_id,
    requestId: row.request_id,
    amountMicrousd: row.amount_microusd,
    status: row.status,
    costMicrousd: row.cost_microusd,
    createdAtMs: row.created_at_ms,
    expiresAtMs: row.expires_at_ms,
    resolvedAtMs: row.resolved_at_ms,
  };
}

export function toLedgerEntry(row: LedgerRow): LedgerEntry {
  return {
    id: row.id,
    orgId: row.org_id,
    kind: row.kind,
    reservationId: row.reservation_id,
    availableDelta: row.available_delta,
    reservedDelta: row.reserved_delta,
    spentDelta: row.spent_delta,
    grantedDelta: row.granted_delta,
    createdAtMs: row.created_at_ms,
    note: row.note,
  };
}
