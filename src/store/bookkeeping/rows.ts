import type { Balance, LedgerEntry, ReservationStatus } from "../../domain/credits.ts";
import type { FinalOutcome } from "../../domain/usage-records.ts";
import type { DbRow } from "../schema/table.ts";
import {
  BALANCE_FIELDS,
  type IdempotencyEntry,
  idempotencyKeys,
  type KeySpend,
  keySpends,
  type OrgBalance,
  orgBalances,
  type PreviewCounter,
  previewCounters,
  RESERVATION_FIELDS,
  type StoredUsageRecord,
  type UsageDailyDelta,
  usageRecords,
} from "../schema/tables.ts";

/**
 * The language between the bookkeeping logic (programs.ts, dialect-neutral) and a database adapter: a program
 * asks for a snapshot of rows (locked until the transaction ends), decides, and hands back the rows to write.
 * An adapter runs a program inside one transaction and knows nothing of what the rows mean.
 */

export interface CounterKey {
  scope: string;
  day: string;
}

/**
 * `count` added to a counter (created with it where missing) only if the counter then holds at most `limit`; else the
 * write fails with CounterLimitPassed.
 */
export interface CounterIncrement extends CounterKey {
  count: number;
  limit: number;
}

/**
 * Thrown by an adapter's write when a CounterIncrement would pass its limit: another transaction added to the counter
 * since it was read without a lock. The transaction rolls back; the program runs again with the counter locked.
 */
export class CounterLimitPassed extends Error {
  constructor() {
    super("A shared counter changed since it was read and would pass its limit");
    this.name = "CounterLimitPassed";
  }
}

/** A key's budget period: its key_spend row. */
export interface KeySpendKey {
  /** The key's lineage id (ApiKeyRecord.lineageId). */
  keyId: string;
  period: string;
}

export interface IdempotencyKeyRef {
  orgId: string;
  key: string;
}

export interface SnapshotQuery {
  /** Preview counters, locked (created at 0 where missing, so that they can be locked). */
  counters?: readonly CounterKey[];
  /**
   * Counters every organization's transactions add to (the service-wide preview counter), read without a lock (0 where
   * missing): the write adds to them within a limit (WriteSet.counterIncrements), so they hold no lock until it.
   */
  sharedCounters?: readonly CounterKey[];
  /** Usage records by request id, locked (with the reservations they hold). */
  usage?: readonly string[];
  /** Balances by organization id, locked; the organizations that exist are reported too (with or without a balance). */
  balances?: readonly string[];
  /** Keys' spend per budget period, locked (created at 0 where missing, so that they can be locked); no key twice. */
  keySpend?: readonly KeySpendKey[];
  /** Idempotency entries, locked. */
  idempotency?: readonly IdempotencyKeyRef[];
  /** In-flight usage records created before the time, oldest first; rows another transaction holds are skipped. */
  dueInFlight?: { createdBeforeMs: number; limit: number };
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

/**
 * What a program reads of a usage record, with its reservation (and the key spend it counts in); the day of creation
 * is the day the record counts in (usage_daily).
 */
export const USAGE_STATE_FIELDS = ["requestId", "orgId", "keyId", "createdAtMs", "mode", "outcome", ...RESERVATION_FIELDS] as const;
export type UsageState = Pick<StoredUsageRecord, (typeof USAGE_STATE_FIELDS)[number]>;
export const toUsageState = (row: DbRow): UsageState => usageRecords.fromRow(row, USAGE_STATE_FIELDS);

export type IdempotencyRow = IdempotencyEntry & {
  /** Of a claim in progress: its request, as read with the claim (never written). */
  holder?: ClaimHolder;
};

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

/**
 * The claims `i` (joined first to `keys`, when given) with their holders: the holder's usage record `u` and the lease
 * `g` of the instance that admitted it. Locks nothing but the claim.
 */
export function selectClaims(keys = ""): string {
  return (
    `SELECT ${idempotencyKeys.list(idempotencyKeys.fields, "i.")}, u.outcome AS holder_outcome, u.http_status AS holder_http_status, ` +
    "u.instance_id AS holder_instance_id, g.lease_until_ms AS holder_lease_until_ms " +
    `FROM idempotency_keys i ${keys}${keys && " "}LEFT JOIN usage_records u ON i.state = 'in_progress' AND u.request_id = i.request_id ` +
    "LEFT JOIN gateway_instances g ON g.id = u.instance_id"
  );
}

/** An entry read with selectClaims. */
export function toIdempotencyRow(r: DbRow): IdempotencyRow {
  const row: IdempotencyRow = idempotencyKeys.fromRow(r);
  if (row.state === "in_progress" && r.holder_outcome != null) {
    row.holder = {
      abandoned: r.holder_outcome !== "in_flight" && r.holder_http_status == null,
      instanceId: (r.holder_instance_id as string | null | undefined) ?? null,
      leaseUntilMs: (r.holder_lease_until_ms as number | null | undefined) ?? null,
    };
  }
  return row;
}

/**
 * The sweep's reads, the same in both dialects but for the lock a dialect adds after each (`lock(alias)`: PostgreSQL
 * locks the rows read, of the table with that alias, and skips those another transaction holds). Parameters are `?`.
 */
export function sweepReads(lock: (alias: string) => string) {
  const state = usageRecords.list(USAGE_STATE_FIELDS);
  return {
    dueInFlight:
      `SELECT ${state} FROM usage_records WHERE outcome = 'in_flight' AND created_at_ms < ? ` +
      `ORDER BY created_at_ms LIMIT ?${lock("usage_records")}`,
    orphanedInFlight:
      `SELECT ${state} FROM usage_records u WHERE u.outcome = 'in_flight' AND u.instance_id IS DISTINCT FROM ? ` +
      "AND (u.created_at_ms < ? OR EXISTS (SELECT 1 FROM gateway_instances g WHERE g.id = u.instance_id AND g.lease_until_ms <= ?)) " +
      `ORDER BY u.created_at_ms LIMIT ?${lock("u")}`,
  };
}

/** The instance `g` admitted no request still in flight: its lease may be deleted. */
export const NO_WORK_IN_FLIGHT = "NOT EXISTS (SELECT 1 FROM usage_records u WHERE u.outcome = 'in_flight' AND u.instance_id = g.id)";

export interface Snapshot {
  /** The organizations of `balances` that exist. */
  organizations: Set<string>;
  counters: Map<string, number>;
  usage: Map<string, UsageState>;
  balances: Map<string, Balance>;
  /** By keySpendKey; a row not read or missing is not there (nothing reserved or spent). */
  keySpend: Map<string, Pick<KeySpend, "reservedMicrousd" | "spentMicrousd">>;
  idempotency: Map<string, IdempotencyRow>;
  dueInFlight: UsageState[];
  orphanedInFlight: UsageState[];
}

/** Map keys of the snapshot: unambiguous for any text. */
export const counterKey = (scope: string, day: string): string => JSON.stringify([scope, day]);
export const idempotencyKey = (orgId: string, key: string): string => JSON.stringify([orgId, key]);
export const keySpendKey = (keyId: string, period: string): string => JSON.stringify([keyId, period]);

/** The rows a snapshot query read, by part, by column name (a part not asked for is left out). */
export interface SnapshotRows {
  counters?: DbRow[];
  sharedCounters?: DbRow[];
  usage?: DbRow[];
  /** One per organization that exists: `org_id`, with its balance's columns (null where it has no balance row). */
  balances?: DbRow[];
  keySpend?: DbRow[];
  /** Read with selectClaims. */
  idempotency?: DbRow[];
  dueInFlight?: DbRow[];
  orphanedInFlight?: DbRow[];
}

export function snapshotOf(rows: SnapshotRows): Snapshot {
  const s: Snapshot = {
    organizations: new Set(),
    counters: new Map(),
    usage: new Map(),
    balances: new Map(),
    keySpend: new Map(),
    idempotency: new Map(),
    dueInFlight: (rows.dueInFlight ?? []).map(toUsageState),
    orphanedInFlight: (rows.orphanedInFlight ?? []).map(toUsageState),
  };
  for (const { scope, day, count } of [...(rows.counters ?? []), ...(rows.sharedCounters ?? [])].map((r) => previewCounters.fromRow(r)))
    s.counters.set(counterKey(scope, day), count);
  for (const u of (rows.usage ?? []).map(toUsageState)) s.usage.set(u.requestId, u);
  for (const b of rows.balances ?? []) {
    const orgId = b.org_id as string;
    s.organizations.add(orgId);
    if (b.available != null) s.balances.set(orgId, orgBalances.fromRow(b, BALANCE_FIELDS));
  }
  for (const { keyId, period, ...spend } of (rows.keySpend ?? []).map((r) => keySpends.fromRow(r)))
    s.keySpend.set(keySpendKey(keyId, period), spend);
  for (const i of (rows.idempotency ?? []).map(toIdempotencyRow)) s.idempotency.set(idempotencyKey(i.orgId, i.key), i);
  return s;
}

/** The fields a completion writes, once, to a usage record in flight (its request id finds it), its reservation resolved. */
export const USAGE_FINAL_FIELDS = [
  "completedAtMs",
  "outcome",
  "httpStatus",
  "inputTokens",
  "outputTokens",
  "costMicrousd",
  "latencyMs",
  "gatewayLatencyMs",
  "errorDetail",
  "overReservation",
  "deployment",
  "attempts",
  "reservationStatus",
] as const satisfies readonly (keyof StoredUsageRecord)[];

export type UsageFinal = Pick<StoredUsageRecord, "requestId" | (typeof USAGE_FINAL_FIELDS)[number]> & {
  completedAtMs: number;
  outcome: FinalOutcome;
  httpStatus: number | null;
  /** How the record's reservation resolved; null when it holds none. */
  reservationStatus: Exclude<ReservationStatus, "pending"> | null;
};

export type NewLedgerEntry = Omit<LedgerEntry, "id">;

/**
 * Rows to write, each row at most once: balances, key spend, counters and idempotency entries are final values or
 * one summed delta per row, so that an adapter may write each list with one set-based statement.
 */
export interface WriteSet {
  usageInserts: StoredUsageRecord[];
  usageFinals: UsageFinal[];
  ledger: NewLedgerEntry[];
  /**
   * New balance rows (the organization had none), with their values, never negative. Added to the row instead
   * when another transaction created it meanwhile (a first grant racing another instance's first grant).
   */
  balanceInserts: OrgBalance[];
  /** Changes to existing (locked) balance rows, one summed delta per organization. */
  balanceDeltas: OrgBalance[];
  /** Key spend values to set (the rows were read locked; they exist or are created). */
  keySpend: KeySpend[];
  /** Counter values to set (the rows exist or are created). */
  counters: PreviewCounter[];
  /** Additions to shared counters (SnapshotQuery.sharedCounters), one per counter, each within its limit. */
  counterIncrements: CounterIncrement[];
  idempotencyPuts: IdempotencyRow[];
  idempotencyDeletes: IdempotencyKeyRef[];
  /** Additions to the daily usage roll-up, one per (organization, day): the changes of this write set's usage records. */
  usageDaily: UsageDailyDelta[];
}

export function emptyWriteSet(): WriteSet {
  return {
    usageInserts: [],
    usageFinals: [],
    ledger: [],
    balanceInserts: [],
    balanceDeltas: [],
    keySpend: [],
    counters: [],
    counterIncrements: [],
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
