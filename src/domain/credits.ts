/** Credits of one organization in integer microUSD. Invariant: granted − spent = available + reserved. */
export interface Balance {
  available: number;
  reserved: number;
  /** Sum of settled costs. */
  spent: number;
  granted: number;
}

export type ReservationStatus = "pending" | "settled" | "released" | "expired";

export interface Reservation {
  id: string;
  orgId: string;
  requestId: string;
  amountMicrousd: number;
  status: ReservationStatus;
  /** Charged amount once settled (≤ amountMicrousd); null otherwise. */
  costMicrousd: number | null;
  createdAtMs: number;
  expiresAtMs: number;
  resolvedAtMs: number | null;
}

export type LedgerKind = "grant" | "reserve" | "settle" | "release" | "expire";

export interface LedgerEntry {
  id: number;
  orgId: string;
  kind: LedgerKind;
  reservationId: string | null;
  availableDelta: number;
  reservedDelta: number;
  spentDelta: number;
  grantedDelta: number;
  createdAtMs: number;
  note: string | null;
}
