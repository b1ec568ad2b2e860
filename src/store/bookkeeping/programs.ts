import {
  type AdmitCommand,
  type AdmitResult,
  type CompleteCommand,
  type CompleteResult,
  MAX_KEPT_RESPONSE_BYTES,
  type SweepResult,
} from "../../domain/bookkeeping.ts";
import type { Balance, LedgerKind, ReservationStatus } from "../../domain/credits.ts";
import { statusOf } from "../../domain/errors.ts";
import { GLOBAL_PREVIEW_SCOPE } from "../input-checks.ts";
import type { StoredUsageRecord } from "../schema/tables.ts";
import { StoreInputError } from "../store-errors.ts";
import { ADMITTED, finalChange, UsageDailyDeltas } from "../usage-daily-rows.ts";
import {
  type BookProgram,
  type CounterKey,
  counterKey,
  emptyWriteSet,
  type IdempotencyKeyRef,
  type IdempotencyRow,
  idempotencyKey,
  type KeySpendKey,
  keySpendKey,
  type OrphanQuery,
  type Snapshot,
  type SnapshotQuery,
  type UsageFinal,
  type UsageState,
  type WriteSet,
} from "./rows.ts";
import { type BlockUse, blockSize } from "./shared-blocks.ts";

/**
 * The bookkeeping decisions, the same for every database: each program reads the rows it needs (locked),
 * decides every command against them in order, and writes the result. Nothing here knows SQL.
 */

const ZERO: Balance = Object.freeze({ available: 0, reserved: 0, spent: 0, granted: 0 });

export const EXPIRED_DETAIL = "the credit reservation expired before settlement; nothing was charged";
export const ABANDONED_DETAIL =
  "the request did not complete within reservation_ttl_seconds (the gateway stopped, or could not store its outcome); nothing was charged";
export const ORPHANED_DETAIL =
  "the gateway process that accepted the request stopped before it completed (it crashed or was killed); nothing was charged";

/** The working state of one transaction: rows as read, changed as commands are decided, then written once each. */
class BatchState {
  readonly writes: WriteSet = emptyWriteSet();
  /** The roll-up's changes: every usage record written here is counted in its day, in this transaction. */
  readonly daily = new UsageDailyDeltas();
  readonly #balances = new Map<string, { value: Balance; existed: boolean; delta: Balance | null }>();
  /**
   * Each counter as read and as counted; a shared one (read without a lock) also with `maxRead`: the most it may hold
   * in the database, when this batch's additions are made, for every admission counted here to have been within its limit.
   */
  readonly #counters = new Map<string, { key: CounterKey; read: number; count: number; shared: boolean; maxRead: number }>();
  readonly #keySpend = new Map<string, { key: KeySpendKey; reserved: number; spent: number; changed: boolean }>();
  readonly #idempotency = new Map<string, { ref: IdempotencyKeyRef; row: IdempotencyRow | null; existed: boolean; changed: boolean }>();
  readonly #completed = new Set<string>();

  /** `units`: the transaction's units of the service-wide counter (batches of admissions only). */
  constructor(
    private readonly snapshot: Snapshot,
    private readonly units: BlockUse | null = null,
  ) {}

  balance(orgId: string): Balance {
    return this.#balance(orgId).value;
  }

  /** True the first time a request is completed in this transaction (a duplicate delivery finds it no longer in flight). */
  completing(requestId: string): boolean {
    if (this.#completed.has(requestId)) return false;
    this.#completed.add(requestId);
    return true;
  }

  /** The organization exists (read with its balance). */
  knows(orgId: string): boolean {
    return this.snapshot.organizations.has(orgId);
  }

  #balance(orgId: string) {
    let entry = this.#balances.get(orgId);
    if (!entry) {
      const stored = this.snapshot.balances.get(orgId);
      entry = { value: { ...(stored ?? ZERO) }, existed: stored !== undefined, delta: null };
      this.#balances.set(orgId, entry);
    }
    return entry;
  }

  /** A change of the balance: a reservation made or resolved, a grant. */
  move(orgId: string, delta: Balance): void {
    const entry = this.#balance(orgId);
    entry.delta ??= { ...ZERO };
    for (const k of ["available", "reserved", "spent", "granted"] as const) {
      entry.value[k] += delta[k];
      entry.delta[k] += delta[k];
    }
  }

  /** A ledger entry: a final change of the balance (a grant, a reservation resolved; see LedgerEntry). */
  enter(orgId: string, kind: LedgerKind, reservationId: string | null, delta: Balance, nowMs: number, note: string | null = null): void {
    this.writes.ledger.push({
      orgId,
      kind,
      reservationId,
      availableDelta: delta.available,
      reservedDelta: delta.reserved,
      spentDelta: delta.spent,
      grantedDelta: delta.granted,
      createdAtMs: nowMs,
      note,
    });
  }

  /** A key's spend in a budget period, as read (locked) and changed here; zeros where it has no row. */
  keySpend(keyId: string, period: string): { reserved: number; spent: number } {
    return this.#keySpendEntry(keyId, period);
  }

  #keySpendEntry(keyId: string, period: string) {
    const k = keySpendKey(keyId, period);
    let entry = this.#keySpend.get(k);
    if (!entry) {
      const stored = this.snapshot.keySpend.get(k);
      entry = { key: { keyId, period }, reserved: stored?.reservedMicrousd ?? 0, spent: stored?.spentMicrousd ?? 0, changed: false };
      this.#keySpend.set(k, entry);
    }
    return entry;
  }

  /** A change of a key's spend: a reservation set aside, or resolved (out of reserved, its cost into spent). */
  moveKeySpend(keyId: string, period: string, reserved: number, spent: number): void {
    const entry = this.#keySpendEntry(keyId, period);
    entry.reserved += reserved;
    entry.spent += spent;
    entry.changed = true;
  }

  counter(scope: string, day: string): number {
    return this.#counter(scope, day).count;
  }

  #counter(scope: string, day: string) {
    const k = counterKey(scope, day);
    let entry = this.#counters.get(k);
    if (!entry) {
      const read = this.snapshot.counters.get(k) ?? 0;
      entry = { key: { scope, day }, read, count: read, shared: false, maxRead: Number.MAX_SAFE_INTEGER };
      this.#counters.set(k, entry);
    }
    return entry;
  }

  /** Counts one more on a counter read locked. */
  count(scope: string, day: string): void {
    this.#counter(scope, day).count += 1;
  }

  /** Adds `n` to a shared counter, found at most `limit` - `n`: with the count the database holds then, it must still be. */
  countShared(scope: string, day: string, limit: number, n: number): void {
    const entry = this.#counter(scope, day);
    entry.shared = true;
    entry.maxRead = Math.min(entry.maxRead, limit - n - (entry.count - entry.read));
    entry.count += n;
  }

  /** A unit of the shared counter can be had: the transaction holds one, or the counter is below `limit`. */
  mayTakeShared(scope: string, day: string, limit: number): boolean {
    return this.units?.holds(day) === true || this.counter(scope, day) < limit;
  }

  /** Takes a unit of the shared counter: one the transaction holds, else a block of them added to the counter. */
  takeShared(scope: string, day: string, limit: number, block: number): void {
    if (this.units?.use(day)) return;
    const n = this.units ? blockSize(limit - this.counter(scope, day), block) : 1;
    this.countShared(scope, day, limit, n);
    this.units?.add(day, n);
  }

  entry(orgId: string, key: string): IdempotencyRow | null {
    return this.#entry(orgId, key).row;
  }

  #entry(orgId: string, key: string) {
    const k = idempotencyKey(orgId, key);
    let entry = this.#idempotency.get(k);
    if (!entry) {
      const stored = this.snapshot.idempotency.get(k) ?? null;
      entry = { ref: { orgId, key }, row: stored, existed: stored !== null, changed: false };
      this.#idempotency.set(k, entry);
    }
    return entry;
  }

  setEntry(orgId: string, key: string, row: IdempotencyRow | null): void {
    const entry = this.#entry(orgId, key);
    entry.row = row;
    entry.changed = true;
  }

  /** The write set, with every balance, key spend, counter and idempotency entry written once. */
  finish(): WriteSet {
    const w = this.writes;
    for (const [orgId, entry] of this.#balances) {
      if (entry.delta === null) continue;
      if (entry.existed) w.balanceDeltas.push({ orgId, ...entry.delta });
      else w.balanceInserts.push({ orgId, ...entry.value });
    }
    for (const { key, reserved, spent, changed } of this.#keySpend.values()) {
      if (changed) w.keySpend.push({ keyId: key.keyId, period: key.period, reservedMicrousd: reserved, spentMicrousd: spent });
    }
    for (const { key, read, count, shared, maxRead } of this.#counters.values()) {
      if (count === read) continue;
      // Written out whole: `{ ...key, count }` costs V8 a slow path, in every transaction.
      if (shared) w.counterIncrements.push({ scope: key.scope, day: key.day, count: count - read, limit: maxRead + count - read });
      else w.counters.push({ scope: key.scope, day: key.day, count });
    }
    for (const entry of this.#idempotency.values()) {
      if (!entry.changed) continue;
      if (entry.row) w.idempotencyPuts.push(entry.row);
      else if (entry.existed) w.idempotencyDeletes.push(entry.ref);
    }
    w.usageDaily = this.daily.list();
    return w;
  }
}

/** A usage record in flight that holds a pending reservation. */
type Reserving = UsageState & { reservedMicrousd: number; reservationExpiresAtMs: number; reservationStatus: "pending" };

/** The key spend a record's reservation counts in (its key's lineage at admission); null: none. */
const keySpendOf = (u: UsageState): KeySpendKey | null =>
  u.keyBudgetKeyId !== null && u.keyBudgetPeriod !== null ? { keyId: u.keyBudgetKeyId, period: u.keyBudgetPeriod } : null;

const reserving = (u: UsageState | undefined): u is Reserving => u?.reservationStatus === "pending";

const ENTRY_KIND = { settled: "settle", released: "release", expired: "expire" } as const satisfies Record<string, LedgerKind>;

/**
 * Resolves a record's pending reservation, charging `cost` (settled; 0 otherwise): the amount leaves `reserved`, the
 * cost goes to `spent` and the rest back to `available`; so too in the key spend it counts in (its key's lineage and
 * period), when it counts in one (that row read locked). Its one ledger entry holds what changed for good: the cost.
 * Returns the status, for the final record.
 */
function resolve<S extends Exclude<ReservationStatus, "pending">>(
  batch: BatchState,
  u: Reserving,
  status: S,
  cost: number,
  nowMs: number,
): S {
  const amount = u.reservedMicrousd;
  if (!Number.isSafeInteger(cost) || cost < 0 || cost > amount || (status !== "settled" && cost !== 0)) {
    throw new RangeError(
      `The cost ${cost} is not a whole amount from 0 to the reservation ${JSON.stringify(u.requestId)} of ${amount} microUSD`,
    );
  }
  batch.move(u.orgId, { available: amount - cost, reserved: -amount, spent: cost, granted: 0 });
  const spend = keySpendOf(u);
  if (spend) batch.moveKeySpend(spend.keyId, spend.period, -amount, cost);
  batch.enter(u.orgId, ENTRY_KIND[status], u.requestId, { available: -cost, reserved: 0, spent: cost, granted: 0 }, nowMs);
  return status;
}

/**
 * The rows a batch needs (the shared counters read without a lock), in the one order every transaction locks them:
 * counters, usage (with their reservations), balances, key spend, idempotency.
 */
export function batchQuery(admissions: readonly AdmitCommand[], completions: readonly CompleteCommand[]): SnapshotQuery {
  const counters = new Map<string, CounterKey>();
  const shared = new Map<string, CounterKey>();
  const balances = new Set<string>();
  const keySpend = new Map<string, KeySpendKey>();
  const idempotency = new Map<string, IdempotencyKeyRef>();
  const spendOf = (keyId: string, period: string) => keySpend.set(keySpendKey(keyId, period), { keyId, period });
  for (const a of admissions) {
    if (a.quota) {
      counters.set(counterKey(a.orgId, a.quota.day), { scope: a.orgId, day: a.quota.day });
      shared.set(counterKey(GLOBAL_PREVIEW_SCOPE, a.quota.day), { scope: GLOBAL_PREVIEW_SCOPE, day: a.quota.day });
    }
    if (a.reservation) balances.add(a.orgId);
    if (a.reservation && a.keyBudget) spendOf(a.keyBudget.keyId, a.keyBudget.period);
    if (a.idempotency) idempotency.set(idempotencyKey(a.orgId, a.idempotency.key), { orgId: a.orgId, key: a.idempotency.key });
  }
  for (const c of completions) {
    if (c.reserved) balances.add(c.orgId);
    if (c.keyBudget) spendOf(c.keyBudget.keyId, c.keyBudget.period);
    if (c.idempotency) idempotency.set(idempotencyKey(c.orgId, c.idempotency.key), { orgId: c.orgId, key: c.idempotency.key });
  }
  return {
    counters: [...counters.values()],
    sharedCounters: [...shared.values()],
    usage: completions.map((c) => c.requestId),
    balances: [...balances],
    keySpend: [...keySpend.values()],
    idempotency: [...idempotency.values()],
  };
}

function complete(batch: BatchState, snapshot: Snapshot, c: CompleteCommand): CompleteResult {
  const state = snapshot.usage.get(c.requestId);
  if (state?.outcome !== "in_flight" || state.orgId !== c.orgId || !batch.completing(c.requestId)) return { kind: "not_in_flight" };
  const final: UsageFinal = {
    requestId: c.requestId,
    completedAtMs: c.nowMs,
    outcome: c.outcome,
    httpStatus: c.httpStatus,
    inputTokens: c.inputTokens,
    outputTokens: c.outputTokens,
    costMicrousd: c.outcome === "succeeded" && c.reserved ? c.costMicrousd : 0,
    latencyMs: c.latencyMs,
    gatewayLatencyMs: c.gatewayLatencyMs,
    errorDetail: c.errorDetail,
    overReservation: c.overReservation,
    deployment: c.deployment,
    attempts: c.attempts,
    reservationStatus: null,
  };
  let result: CompleteResult = { kind: "completed" };
  const pending = reserving(state) ? state : null;
  // Only a completion that says it reserved has its organization's balance read and locked; so too its key's spend.
  if (pending && !c.reserved)
    throw new Error(`The request ${JSON.stringify(c.requestId)} holds a reservation its completion does not name`);
  const spend = pending && keySpendOf(pending);
  if (spend && (c.keyBudget?.keyId !== spend.keyId || c.keyBudget.period !== spend.period)) {
    throw new Error(
      `The request ${JSON.stringify(c.requestId)} holds a reservation in the budget of key lineage ${JSON.stringify(spend.keyId)} ` +
        `for ${JSON.stringify(spend.period)}, which its completion does not name`,
    );
  }
  if (c.reserved) {
    const expired = pending === null || pending.reservationExpiresAtMs <= c.nowMs;
    if (c.outcome === "succeeded" && expired) {
      Object.assign(final, {
        outcome: "reservation_expired",
        httpStatus: statusOf("reservation_expired"),
        costMicrousd: 0,
        errorDetail: EXPIRED_DETAIL,
        overReservation: false,
        reservationStatus: pending ? resolve(batch, pending, "expired", 0, c.nowMs) : null,
      });
      result = { kind: "reservation_expired" };
    } else if (pending) {
      final.reservationStatus =
        c.outcome === "succeeded"
          ? resolve(batch, pending, "settled", final.costMicrousd, c.nowMs)
          : resolve(batch, pending, "released", 0, c.nowMs);
    }
  }
  batch.writes.usageFinals.push(final);
  batch.daily.add(state.orgId, state.createdAtMs, finalChange(final, { inFlight: -1 }));
  if (c.idempotency) {
    const row = batch.entry(c.orgId, c.idempotency.key);
    if (row && row.requestId === c.requestId && row.state === "in_progress") {
      const response = final.outcome === "succeeded" ? c.idempotency.response : null;
      batch.setEntry(
        c.orgId,
        c.idempotency.key,
        response
          ? {
              ...row,
              state: "completed",
              responseStatus: response.status,
              responseBody: Buffer.byteLength(response.body, "utf8") <= MAX_KEPT_RESPONSE_BYTES ? response.body : null,
              responseRequestId: response.requestId,
            }
          : null,
      );
    }
  }
  return result;
}

function admit(batch: BatchState, a: AdmitCommand): AdmitResult {
  const idem = a.idempotency;
  if (idem) {
    const row = batch.entry(a.orgId, idem.key);
    if (row && row.expiresAtMs > a.nowMs) {
      if (row.state === "completed") {
        if (row.requestHash !== idem.requestHash) return { kind: "idempotency_mismatch" };
        if (row.responseBody === null) return { kind: "replay_not_kept", requestId: row.responseRequestId ?? row.requestId };
        return {
          kind: "replay",
          response: { status: row.responseStatus ?? 200, body: row.responseBody, requestId: row.responseRequestId ?? row.requestId },
        };
      }
      const holder = row.holder;
      if (row.lockUntilMs > a.nowMs && !holder?.abandoned) {
        const lease = holder?.instanceId && holder.instanceId !== a.instanceId ? holder.leaseUntilMs : null;
        if (lease === null) return { kind: "idempotency_in_progress" };
        if (lease <= a.nowMs) return { kind: "idempotency_abandoned", requestId: row.requestId };
        return { kind: "idempotency_in_progress", ownerLeaseUntilMs: lease };
      }
    }
    // No entry, an expired one, a claim whose request the sweep completed (its process stopped), or whose lock passed
    // (its process died or hung): this request claims it.
  }
  if (a.quota) {
    if (batch.counter(a.orgId, a.quota.day) >= a.quota.orgLimit) return { kind: "quota_exhausted", scope: "org" };
    if (!batch.mayTakeShared(GLOBAL_PREVIEW_SCOPE, a.quota.day, a.quota.globalLimit)) return { kind: "quota_exhausted", scope: "global" };
  }
  if (a.reservation) {
    const amount = a.reservation.amountMicrousd;
    // An unknown organization has nothing to reserve from, not even 0.
    const available = batch.knows(a.orgId) ? batch.balance(a.orgId).available : -1;
    if (available < amount) return { kind: "insufficient_credits", availableMicrousd: Math.max(0, available) };
    // The organization's balance is asked first: a key's budget is a share of what its organization may spend.
    if (a.keyBudget) {
      const { keyId, period, limitMicrousd } = a.keyBudget;
      const { reserved, spent } = batch.keySpend(keyId, period);
      const remaining = limitMicrousd - spent - reserved;
      if (amount > remaining) return { kind: "key_budget_exhausted", remainingMicrousd: Math.max(0, remaining) };
      batch.moveKeySpend(keyId, period, amount, 0);
    }
    // Set aside in the balance (and the key's spend) and on the record (inFlightRecord); the ledger records it once resolved.
    batch.move(a.orgId, { available: -amount, reserved: amount, spent: 0, granted: 0 });
  }
  if (a.quota) {
    batch.count(a.orgId, a.quota.day);
    batch.takeShared(GLOBAL_PREVIEW_SCOPE, a.quota.day, a.quota.globalLimit, a.quota.globalBlock ?? 1);
  }
  if (idem) {
    batch.setEntry(a.orgId, idem.key, {
      orgId: a.orgId,
      key: idem.key,
      requestHash: idem.requestHash,
      requestId: a.requestId,
      state: "in_progress",
      responseStatus: null,
      responseBody: null,
      responseRequestId: null,
      lockUntilMs: idem.lockUntilMs,
      expiresAtMs: idem.expiresAtMs,
      holder: { abandoned: false, instanceId: a.instanceId ?? null, leaseUntilMs: null },
    });
  }
  batch.writes.usageInserts.push(inFlightRecord(a));
  batch.daily.add(a.orgId, a.nowMs, ADMITTED);
  return { kind: "admitted" };
}

export function inFlightRecord(a: AdmitCommand): StoredUsageRecord {
  return {
    instanceId: a.instanceId ?? null,
    requestId: a.requestId,
    orgId: a.orgId,
    keyId: a.keyId,
    createdAtMs: a.nowMs,
    completedAtMs: null,
    source: a.source,
    model: a.model,
    mode: a.mode,
    outcome: "in_flight",
    errorDetail: null,
    ...NOTHING_SPENT,
    reservedMicrousd: a.reservation?.amountMicrousd ?? null,
    reservationExpiresAtMs: a.reservation?.expiresAtMs ?? null,
    reservationStatus: a.reservation ? "pending" : null,
    keyBudgetKeyId: a.reservation && a.keyBudget ? a.keyBudget.keyId : null,
    keyBudgetPeriod: a.reservation && a.keyBudget ? a.keyBudget.period : null,
  };
}

/** The figures of a request that got no answer: no status, no tokens, nothing charged, no deployment. */
const NOTHING_SPENT = {
  httpStatus: null,
  inputTokens: 0,
  outputTokens: 0,
  costMicrousd: 0,
  latencyMs: null,
  gatewayLatencyMs: 0,
  overReservation: false,
  deployment: null,
  attempts: 0,
} as const;

/**
 * Decides a batch against its snapshot: completions first (they may return credits), then admissions in order, taking
 * units of the service-wide counter from `units` when given.
 */
export function planBatch(
  admissions: readonly AdmitCommand[],
  completions: readonly CompleteCommand[],
  snapshot: Snapshot,
  units: BlockUse | null = null,
): { writes: WriteSet; results: { admissions: AdmitResult[]; completions: CompleteResult[] } } {
  const batch = new BatchState(snapshot, units);
  const completed = completions.map((c) => complete(batch, snapshot, c));
  const admitted = admissions.map((a) => admit(batch, a));
  return { writes: batch.finish(), results: { admissions: admitted, completions: completed } };
}

/**
 * One batch in one transaction. Its preview admissions take units of the service-wide counter from `units` first;
 * the counter is read only for a day whose admissions those do not cover. Shared counters are read without a lock
 * and added to within their limits by the write; when another transaction took the last units meanwhile
 * (CounterLimitPassed), the batch runs again with `lockShared`: they are then locked by a second read, after every
 * row of the first (the lock order of docs/architecture.md, "Lanes and the service-wide counter").
 */
export function* batchProgram(
  admissions: readonly AdmitCommand[],
  completions: readonly CompleteCommand[],
  units: BlockUse,
  lockShared = false,
): BookProgram<{ admissions: AdmitResult[]; completions: CompleteResult[] }> {
  const query = batchQuery(admissions, completions);
  const need = new Map<string, number>();
  for (const a of admissions) if (a.quota) need.set(a.quota.day, (need.get(a.quota.day) ?? 0) + 1);
  const sharedCounters = (query.sharedCounters ?? []).filter((k) => units.reserve(k.day, need.get(k.day)!) < need.get(k.day)!);
  // Replaced in place (a copy by rest and spread takes V8 a slow path, in every transaction).
  query.sharedCounters = lockShared ? undefined : sharedCounters;
  const snapshot = (yield { read: query })!;
  if (lockShared && sharedCounters.length) {
    for (const [key, count] of (yield { read: { counters: sharedCounters } })!.counters) snapshot.counters.set(key, count);
  }
  const plan = planBatch(admissions, completions, snapshot, units);
  units.decided();
  yield { write: plan.writes };
  return plan.results;
}

/** Gives `count` unused units of the service-wide counter of `day` back to it (a stopping process's block). */
export function* returnUnitsProgram(day: string, count: number): BookProgram<void> {
  const key = { scope: GLOBAL_PREVIEW_SCOPE, day };
  const held = (yield { read: { counters: [key] } })!.counters.get(counterKey(key.scope, day)) ?? 0;
  const writes = emptyWriteSet();
  writes.counters.push({ ...key, count: Math.max(0, held - count) });
  yield { write: writes };
}

/** How requests completed without an answer are recorded: their reservation's resolution and the record's detail. */
interface Unanswered {
  status: "expired" | "released";
  detail: string;
}

/**
 * Completes requests left in flight as gateway_error with nothing charged (no answer is known, so no HTTP status),
 * resolving the reservations they hold as `how` says. Usage rows (already locked by the caller's read), then
 * balances and the key spend they count in, as a completion locks them.
 */
function* completeUnanswered(nowMs: number, inFlight: readonly UsageState[], how: Unanswered): BookProgram<void> {
  const pending = inFlight.filter(reserving);
  const keySpend = new Map<string, KeySpendKey>();
  for (const spend of pending.map(keySpendOf)) if (spend) keySpend.set(keySpendKey(spend.keyId, spend.period), spend);
  const locked = (yield { read: { balances: [...new Set(pending.map((u) => u.orgId))], keySpend: [...keySpend.values()] } })!;
  const batch = new BatchState(locked);
  for (const u of inFlight) {
    const final: UsageFinal = {
      requestId: u.requestId,
      completedAtMs: nowMs,
      outcome: "gateway_error",
      ...NOTHING_SPENT,
      errorDetail: how.detail,
      reservationStatus: reserving(u) ? resolve(batch, u, how.status, 0, nowMs) : null,
    };
    batch.writes.usageFinals.push(final);
    batch.daily.add(u.orgId, u.createdAtMs, finalChange(final, { inFlight: -1 }));
  }
  yield { write: batch.finish() };
}

/**
 * Requests left in flight past their deadline (the gateway crashed, or could not store the outcome) are completed
 * as gateway_error with nothing charged, their reservations expired. (A reservation is pending only while its request
 * is in flight, so no other reservation can be left pending.)
 */
export function* sweepProgram(input: { nowMs: number; inFlightBeforeMs: number; limit: number }): BookProgram<SweepResult> {
  const due = (yield { read: { dueInFlight: { createdBeforeMs: input.inFlightBeforeMs, limit: input.limit } } })!.dueInFlight;
  if (due.length > 0) yield* completeUnanswered(input.nowMs, due, { status: "expired", detail: ABANDONED_DETAIL });
  return { abandoned: due.length };
}

/**
 * Requests in flight whose gateway process is gone (see OrphanQuery) are completed at once, as the sweep completes
 * them, but their reservations released: the same usage record (gateway_error, nothing charged), the same roll-up.
 * Their Idempotency-Key claims then block nothing (ClaimHolder.abandoned).
 */
export function* orphanProgram(input: OrphanQuery): BookProgram<{ released: number }> {
  const orphans = (yield { read: { orphanedInFlight: input } })!.orphanedInFlight;
  if (orphans.length === 0) return { released: 0 };
  yield* completeUnanswered(input.nowMs, orphans, { status: "released", detail: ORPHANED_DETAIL });
  return { released: orphans.length };
}

/** Adds credits with a grant ledger entry; returns the new balance. */
export function* grantProgram(input: { orgId: string; amountMicrousd: number; nowMs: number; note: string | null }): BookProgram<Balance> {
  const snapshot = (yield { read: { balances: [input.orgId] } })!;
  if (!snapshot.organizations.has(input.orgId))
    throw new StoreInputError(`No organization with id ${JSON.stringify(input.orgId)}`, "orgId");
  const batch = new BatchState(snapshot);
  if (!Number.isSafeInteger(batch.balance(input.orgId).granted + input.amountMicrousd)) {
    throw new StoreInputError("The grant would take the organization's credits beyond the safe integer range", "amountMicrousd");
  }
  const grant = { available: input.amountMicrousd, reserved: 0, spent: 0, granted: input.amountMicrousd };
  batch.move(input.orgId, grant);
  batch.enter(input.orgId, "grant", null, grant, input.nowMs, input.note);
  yield { write: batch.finish() };
  // Read again: a first grant racing another instance's first grant adds to the row that one created.
  return (yield { read: { balances: [input.orgId] } })!.balances.get(input.orgId)!;
}
