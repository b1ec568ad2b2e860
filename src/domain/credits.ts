/** Credits of one organization in integer microUSD. Invariant: granted − spent = available + reserved. */
export interface Balance {
  available: number;
  /** Sum of the pending reservations. */
  reserved: number;
  /** Sum of settled costs. */
  spent: number;
  granted: number;
}

export type ReservationStatus = "pending" | "settled" | "released" | "expired";

/**
 * Credits set aside for one paid request, from its admission until its completion: pending while the request is in
 * flight, then resolved exactly once — settled (its cost charged), released or expired (nothing charged). Its id is
 * the request id; it is kept with the request's usage record.
 */
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
  /** When it was resolved: when its request completed. */
  resolvedAtMs: number | null;
}

/** `reserve`: only in entries written before reservations were kept on usage records (migration 010). */
export type LedgerKind = "grant" | "reserve" | "settle" | "release" | "expire";

/**
 * A final change of an organization's credits: a grant, or the resolution of one paid request's reservation —
 * settle (available −cost, spent +cost), release or expire (no change; the entry records the resolution). A
 * reservation while pending has no entry: it is in the balance's `reserved` and on its request's usage record. So,
 * per organization: Σ granted = granted, Σ spent = spent, Σ available = available + reserved, Σ reserved = 0.
 */
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
