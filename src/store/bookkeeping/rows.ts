import type { ServiceMode } from "../../contract/decision.ts";
import type { ReservationRow } from "../credit-rows.ts";
import type { Balance, FinalOutcome, LedgerEntry, ReservationStatus, UsageOutcome, UsageRecord } from "../store.ts";
import type { UsageDailyDelta } from "../usage-daily-rows.ts";

export type { ReservationRow };

/**
 * The language between the bookkeeping logic (programs.ts, dialect-neutral) and a database adapter: a program
 * asks for a snapshot of rows (locked until the transaction ends), decides, and hands back the rows to write.
 * An adapter runs a program inside one transaction and knows nothing of what the rows mean.
 */

export interface CounterKey {
  scope: string;
  day: string;
}

export interface IdempotencyKeyRef {
  orgId: string;
  key: string;
}

export interface SnapshotQuery {
  /** Preview counters, locked (created at 0 where missing, so that they can be locked). */
  counters?: readonly CounterKey[];
  /** Usage records by request id, locked. */
  usage?: readonly string[];
  /** Reservations by id, locked. */
  reservations?: readonly string[];
  /** Balances by organization id, locked; the organizations that exist are reported too (with or without a balance). */
  balances?: readonly string[];
  /** Idempotency entries, locked. */
  idempotency?: readonly IdempotencyKeyRef[];
  /** In-flight usage records created before the time, oldest first; rows another transaction holds are skipped. */
  dueInFlight?: { createdBeforeMs: number; limit: number };
  /** Pending reservations due at nowMs whose request is not in flight; rows another transaction holds are skipped. */
  dueReservations?: { nowMs: number; limit: number };
  /**
   * In-flight usage records whose gateway process is gone, oldest first; rows another transaction holds are skipped:
   * admitted by another instance than `instanceId` whose lease ended at or before nowMs, or (createdBeforeMs not null)
   * created before createdBeforeMs by any other.
   */
  orphanedInFlight?: OrphanQuery;
}

export interface OrphanQuery {
  /** The instance asking: its own work is never orphaned. */
  instanceId: string;
  nowMs: number;
  createdBeforeMs: number | null;
  limit: number;
}

export interface UsageState {
  requestId: string;
  orgId: string;
  /** The day of creation is the day the record counts in (usage_daily). */
  createdAtMs: number;
  mode: ServiceMode;
  outcome: UsageOutcome;
}

export interface IdempotencyRow {
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
  /** Of a claim in progress: its request, as read with the claim (never written). */
  holder?: ClaimHolder;
}

/** The request holding a claim in progress, for the admission that finds the claim. */
export interface ClaimHolder {
  /**
   * Completed without an answer (by the sweep: its process stopped): no completion will keep or drop the claim, so
   * it blocks nothing. A completion always records the status it answered with.
   */
  abandoned: boolean;
  /** The instance that admitted it (null: not recorded, an earlier version). */
  instanceId: string | null;
  /** The end of that instance's lease (null: no lease known). */
  leaseUntilMs: number | null;
}

/** The columns of an idempotency_keys row as both adapters read them. */
export const IDEMPOTENCY_COLUMNS =
  "org_id, key, request_hash, request_id, state, response_status, response_body, response_request_id, lock_until_ms, expires_at_ms";

export interface IdempotencyDbRow {
  org_id: string;
  key: string;
  request_hash: string;
  request_id: string;
  state: IdempotencyRow["state"];
  response_status: number | null;
  response_body: string | null;
  response_request_id: string | null;
  lock_until_ms: number;
  expires_at_ms: number;
  /** Read with CLAIM_HOLDER_COLUMNS: the holder's usage record and its instance's lease (null where none). */
  holder_outcome?: UsageOutcome | null;
  holder_http_status?: number | null;
  holder_instance_id?: string | null;
  holder_lease_until_ms?: number | null;
}

/**
 * The claim's holder, read with an idempotency_keys row `i` through CLAIM_HOLDER_JOINS (its usage record `u`, the
 * lease `g` of the instance that admitted it); locks nothing but the claim.
 */
export const CLAIM_HOLDER_COLUMNS =
  "u.outcome AS holder_outcome, u.http_status AS holder_http_status, u.instance_id AS holder_instance_id, g.lease_until_ms AS holder_lease_until_ms";
export const CLAIM_HOLDER_JOINS =
  "LEFT JOIN usage_records u ON i.state = 'in_progress' AND u.request_id = i.request_id LEFT JOIN gateway_instances g ON g.id = u.instance_id";

export function toIdempotencyRow(r: IdempotencyDbRow): IdempotencyRow {
  const row: IdempotencyRow = {
    orgId: r.org_id,
    key: r.key,
    requestHash: r.request_hash,
    requestId: r.request_id,
    state: r.state,
    responseStatus: r.response_status,
    responseBody: r.response_body,
    responseRequestId: r.response_request_id,
    lockUntilMs: r.lock_until_ms,
    expiresAtMs: r.expires_at_ms,
  };
  if (r.state === "in_progress" && r.holder_outcome != null) {
    row.holder = {
      abandoned: r.holder_outcome !== "in_flight" && r.holder_http_status == null,
      instanceId: r.holder_instance_id ?? null,
      leaseUntilMs: r.holder_lease_until_ms ?? null,
    };
  }
  return row;
}

/** The columns of a usage record's state as both adapters read them. */
export const USAGE_STATE_COLUMNS = "request_id, org_id, created_at_ms, mode, outcome";

export interface UsageStateRow {
  request_id: string;
  org_id: string;
  created_at_ms: number;
  mode: UsageState["mode"];
  outcome: UsageState["outcome"];
}

export const toUsageState = (r: UsageStateRow): UsageState => ({
  requestId: r.request_id,
  orgId: r.org_id,
  createdAtMs: r.created_at_ms,
  mode: r.mode,
  outcome: r.outcome,
});

export interface Snapshot {
  /** The organizations of `balances` that exist. */
  organizations: Set<string>;
  counters: Map<string, number>;
  usage: Map<string, UsageState>;
  reservations: Map<string, ReservationRow>;
  balances: Map<string, Balance>;
  idempotency: Map<string, IdempotencyRow>;
  dueInFlight: UsageState[];
  dueReservations: ReservationRow[];
  orphanedInFlight: UsageState[];
}

/** Map keys of the snapshot: unambiguous for any text. */
export const counterKey = (scope: string, day: string): string => JSON.stringify([scope, day]);
export const idempotencyKey = (orgId: string, key: string): string => JSON.stringify([orgId, key]);

export function emptySnapshot(): Snapshot {
  return {
    organizations: new Set(),
    counters: new Map(),
    usage: new Map(),
    reservations: new Map(),
    balances: new Map(),
    idempotency: new Map(),
    dueInFlight: [],
    dueReservations: [],
    orphanedInFlight: [],
  };
}

/** The final fields of a usage record, written once at completion. */
export type UsageFinal = Pick<
  UsageRecord,
  | "requestId"
  | "inputTokens"
  | "outputTokens"
  | "costMicrousd"
  | "latencyMs"
  | "gatewayLatencyMs"
  | "errorDetail"
  | "overReservation"
  | "deployment"
  | "attempts"
> & { completedAtMs: number; outcome: FinalOutcome; httpStatus: number | null };

export type NewLedgerEntry = Omit<LedgerEntry, "id">;

/** A usage record as admitted: with the instance (gateway process) that admitted it, null when none is known. */
export type NewUsageRecord = UsageRecord & { instanceId: string | null };

export interface ReservationResolution {
  id: string;
  status: Exclude<ReservationStatus, "pending">;
  costMicrousd: number | null;
  resolvedAtMs: number;
}

/**
 * Rows to write, each row at most once: balances, counters and idempotency entries are final values or one
 * summed delta per row, so that an adapter may write each list with one set-based statement.
 */
export interface WriteSet {
  usageInserts: NewUsageRecord[];
  usageFinals: UsageFinal[];
  reservationInserts: ReservationRow[];
  reservationResolutions: ReservationResolution[];
  ledger: NewLedgerEntry[];
  /**
   * New balance rows (the organization had none), with their values, never negative. Added to the row instead
   * when another transaction created it meanwhile (a first grant racing another instance's first grant).
   */
  balanceInserts: (Balance & { orgId: string })[];
  /** Changes to existing (locked) balance rows, one summed delta per organization. */
  balanceDeltas: (Balance & { orgId: string })[];
  /** Counter values to set (the rows exist or are created). */
  counters: (CounterKey & { count: number })[];
  idempotencyPuts: IdempotencyRow[];
  idempotencyDeletes: IdempotencyKeyRef[];
  /** Additions to the daily usage roll-up, one per (organization, day): the changes of this write set's usage records. */
  usageDaily: UsageDailyDelta[];
}

export function emptyWriteSet(): WriteSet {
  return {
    usageInserts: [],
    usageFinals: [],
    reservationInserts: [],
    reservationResolutions: [],
    ledger: [],
    balanceInserts: [],
    balanceDeltas: [],
    counters: [],
    idempotencyPuts: [],
    idempotencyDeletes: [],
    usageDaily: [],
  };
}

export function isEmptyWriteSet(w: WriteSet): boolean {
  return Object.values(w).every((list: unknown[]) => list.length === 0);
}

export type BookOp = { read: SnapshotQuery; write?: undefined } | { write: WriteSet; read?: undefined };

/**
 * A bookkeeping transaction as a generator: it yields reads (answered with a Snapshot) and writes (answered
 * with nothing), and returns its result. The same program runs synchronously on SQLite and asynchronously on
 * PostgreSQL.
 */
export type BookProgram<T> = Generator<BookOp, T, Snapshot | undefined>;

/** Runs a program (made anew for each attempt) inside one write transaction; rolls back when it throws. */
export type RunProgram = <T>(program: () => BookProgram<T>) => Promise<T>;

/** Drives a program with synchronous read and write functions (the caller holds the transaction). */
export function runSync<T>(program: BookProgram<T>, read: (q: SnapshotQuery) => Snapshot, write: (w: WriteSet) => void): T {
  let step = program.next(undefined);
  while (!step.done) {
    const op = step.value;
    if (op.read) {
      step = program.next(read(op.read));
    } else {
      if (!isEmptyWriteSet(op.write)) write(op.write);
      step = program.next(undefined);
    }
  }
  return step.value;
}

/** Drives a program with asynchronous read and write functions (the caller holds the transaction). */
export async function runAsync<T>(
  program: BookProgram<T>,
  read: (q: SnapshotQuery) => Promise<Snapshot>,
  write: (w: WriteSet) => Promise<void>,
): Promise<T> {
  let step = program.next(undefined);
  while (!step.done) {
    const op = step.value;
    if (op.read) {
      step = program.next(await read(op.read));
    } else {
      if (!isEmptyWriteSet(op.write)) await write(op.write);
      step = program.next(undefined);
    }
  }
  return step.value;
}
