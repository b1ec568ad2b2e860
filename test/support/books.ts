/**
 * Money and quota invariants checked after each injected fault (shared by the fault suite).
 */
import assert from "node:assert/strict";
import type { Balance, LedgerEntry } from "../../src/domain/credits.ts";
import type { UsageRecord } from "../../src/domain/usage-records.ts";
import type { Store } from "../../src/store/store.ts";

/**
 * The books of an organization are exact: granted − spent = available + reserved, nothing negative; `reserved` is the
 * sum of the pending reservations (each held by a request in flight); and the ledger (an entry per grant and per
 * resolved reservation, none for one still pending) sums to what is final: Σ granted = granted, Σ spent = spent,
 * Σ available = available + reserved, Σ reserved = 0.
 */
export async function assertLedgerMatches(store: Store, orgId: string): Promise<Balance> {
  const balance = await store.getBalance(orgId);
  const ledger = await store.listLedger(orgId);
  const sum = (f: (e: (typeof ledger)[number]) => number) => ledger.reduce((a, e) => a + f(e), 0);
  assert.equal(
    sum((e) => e.grantedDelta),
    balance.granted,
    "the ledger sums to granted",
  );
  assert.equal(
    sum((e) => e.spentDelta),
    balance.spent,
    "the ledger sums to spent",
  );
  assert.equal(
    sum((e) => e.availableDelta),
    balance.available + balance.reserved,
    "the ledger sums to available + reserved",
  );
  assert.equal(
    sum((e) => e.reservedDelta),
    0,
    "the ledger holds nothing reserved",
  );
  assert.equal(await pendingReserved(store, orgId), balance.reserved, "reserved = the sum of the pending reservations");
  assert.equal(balance.granted - balance.spent, balance.available + balance.reserved, "granted − spent = available + reserved");
  assert.ok(balance.available >= 0 && balance.reserved >= 0, `nothing negative: ${JSON.stringify(balance)}`);
  return balance;
}

/** The sum of the organization's pending reservations: those of its requests in flight. */
export async function pendingReserved(store: Store, orgId: string): Promise<number> {
  let total = 0;
  for (const r of await allUsage(store, orgId)) {
    const reservation = r.outcome === "in_flight" ? await store.getReservation(r.requestId) : null;
    if (reservation?.status === "pending") total += reservation.amountMicrousd;
  }
  return total;
}

/** The ledger entries of paid requests (all but grants): exactly one per resolved reservation. */
export async function requestEntries(store: Store, orgId: string): Promise<LedgerEntry[]> {
  return (await store.listLedger(orgId)).filter((e) => e.kind !== "grant");
}

/** Every usage record of the organization (newest first), all pages. */
export async function allUsage(store: Store, orgId: string): Promise<UsageRecord[]> {
  const out: UsageRecord[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await store.listUsage(orgId, { limit: 200, ...(cursor ? { cursor } : {}) });
    out.push(...page.records);
    if (!page.nextCursor) return out;
    cursor = page.nextCursor;
  }
}

/** The usage records of one request id (0 or 1: the store forbids duplicates, this counts what is there). */
export async function recordsOf(store: Store, orgId: string, requestId: string): Promise<UsageRecord[]> {
  return (await allUsage(store, orgId)).filter((r) => r.requestId === requestId);
}

export interface Snapshot {
  balance: Balance;
  usage: number;
  ledger: number;
}

export async function snapshot(store: Store, orgId: string): Promise<Snapshot> {
  return {
    balance: await store.getBalance(orgId),
    usage: (await allUsage(store, orgId)).length,
    ledger: (await store.listLedger(orgId)).length,
  };
}

/** Waits until `check` holds (polling every 10 ms), or fails after `ms`: for work the gateway finishes after answering. */
export async function eventually(what: string, check: () => Promise<boolean>, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) assert.fail(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
