import type { AdmitCommand, CompleteCommand } from "../../domain/bookkeeping.ts";
import type { Balance } from "../../domain/credits.ts";
import { checkAmount, checkCount, checkDay, checkEpochMs, checkHttpStatus, checkPreviewOrg, checkText } from "../input-checks.ts";
import type { BookkeepingStore } from "../store.ts";
import { StoreInputError } from "../store-errors.ts";
import { batchProgram, grantProgram, orphanProgram, returnUnitsProgram, sweepProgram } from "./programs.ts";
import { type BookProgram, CounterLimitPassed, type RunProgram } from "./rows.ts";
import { BlockUse, type SharedBlock } from "./shared-blocks.ts";

/**
 * The writing half of BookkeepingStore for any adapter that can run a program in one transaction: the
 * arguments are checked here, the decisions are made by programs.ts, and the adapter only reads and writes rows.
 * `block`: the units of the service-wide preview counter this process holds (one per store, whatever runs it).
 */
export function bookkeepingWrites(
  run: RunProgram,
  block: SharedBlock,
): Pick<BookkeepingStore, "commitBatch" | "sweep" | "releaseOrphans" | "grantCredits"> & { returnHeldUnits(): Promise<void> } {
  const commit = async (batch: Parameters<BookkeepingStore["commitBatch"]>[0], lockShared: boolean) => {
    const units = new BlockUse(block);
    try {
      const results = await run(() => batchProgram(batch.admissions, batch.completions, units, lockShared));
      units.committed();
      return results;
    } catch (err) {
      if (err instanceof CounterLimitPassed) units.rolledBack();
      throw err;
    }
  };
  return {
    async commitBatch(batch) {
      batch.admissions.forEach(checkAdmit);
      batch.completions.forEach(checkComplete);
      try {
        return await commit(batch, false);
      } catch (err) {
        if (!(err instanceof CounterLimitPassed)) throw err;
      }
      // Another transaction took the last units of a shared counter since it was read: once more, with it locked.
      return commit(batch, true);
    },
    /** Gives the units of the service-wide counter this process holds back to it (when the store closes). */
    async returnHeldUnits() {
      const held = block.drain();
      if (held) await run(() => returnUnitsProgram(held.day, held.count));
    },
    async sweep(input) {
      checkEpochMs(input.nowMs, "nowMs");
      checkEpochMs(input.inFlightBeforeMs, "inFlightBeforeMs");
      checkCount(input.limit, "limit");
      return run(() => sweepProgram(input));
    },
    async releaseOrphans(input) {
      checkText(input.instanceId, "instanceId");
      checkEpochMs(input.nowMs, "nowMs");
      if (input.createdBeforeMs !== null) checkEpochMs(input.createdBeforeMs, "createdBeforeMs");
      checkCount(input.limit, "limit");
      return run(() => orphanProgram(input));
    },
    async grantCredits(input) {
      checkGrant(input);
      return run(grantOf(input));
    },
  };
}

export interface GrantInput {
  orgId: string;
  amountMicrousd: number;
  nowMs: number;
  note?: string;
}

/** The checks of a credit grant, the same for every adapter. */
export function checkGrant(input: GrantInput): void {
  checkText(input.orgId, "orgId");
  checkAmount(input.amountMicrousd, "amountMicrousd", { positive: true });
  checkEpochMs(input.nowMs, "nowMs");
  if (input.note !== undefined && typeof input.note !== "string") throw new StoreInputError("note must be a string", "note");
}

/** The program of a (checked) grant, made anew for each attempt; for adapters that run it with more in its transaction. */
export function grantOf(input: GrantInput): () => BookProgram<Balance> {
  return () => grantProgram({ orgId: input.orgId, amountMicrousd: input.amountMicrousd, nowMs: input.nowMs, note: input.note ?? null });
}

function checkAdmit(a: AdmitCommand): void {
  checkText(a.requestId, "requestId");
  checkText(a.orgId, "orgId");
  checkText(a.keyId, "keyId");
  checkEpochMs(a.nowMs, "nowMs");
  if (a.instanceId != null) checkText(a.instanceId, "instanceId");
  if (a.idempotency) {
    checkText(a.idempotency.key, "idempotency.key");
    checkText(a.idempotency.requestHash, "idempotency.requestHash");
    checkEpochMs(a.idempotency.lockUntilMs, "idempotency.lockUntilMs");
    checkEpochMs(a.idempotency.expiresAtMs, "idempotency.expiresAtMs");
  }
  if (a.quota) {
    checkPreviewOrg(a.orgId);
    checkDay(a.quota.day, "quota.day");
    checkCount(a.quota.orgLimit, "quota.orgLimit");
    checkCount(a.quota.globalLimit, "quota.globalLimit");
    const block = a.quota.globalBlock;
    if (block !== undefined && (!Number.isSafeInteger(block) || block < 1))
      throw new StoreInputError("quota.globalBlock must be a whole number, 1 or more", "quota.globalBlock");
  }
  if (a.reservation) {
    checkAmount(a.reservation.amountMicrousd, "reservation.amountMicrousd");
    checkEpochMs(a.reservation.expiresAtMs, "reservation.expiresAtMs");
  }
  if (a.keyBudget) {
    checkText(a.keyBudget.keyId, "keyBudget.keyId");
    checkBudgetPeriod(a.keyBudget.period, "keyBudget.period");
    checkAmount(a.keyBudget.limitMicrousd, "keyBudget.limitMicrousd");
  }
}

const BUDGET_PERIOD = /^[0-9]{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?$/;

/** A key budget's period: a UTC day "YYYY-MM-DD" or month "YYYY-MM". */
export function checkBudgetPeriod(value: string, field = "period"): void {
  if (typeof value !== "string" || !BUDGET_PERIOD.test(value))
    throw new StoreInputError(`${field} must be a UTC day written YYYY-MM-DD or a month written YYYY-MM`, field);
}

function checkComplete(c: CompleteCommand): void {
  checkText(c.requestId, "requestId");
  checkText(c.orgId, "orgId");
  checkEpochMs(c.nowMs, "nowMs");
  checkHttpStatus(c.httpStatus, "httpStatus");
  checkCount(c.inputTokens, "inputTokens");
  checkCount(c.outputTokens, "outputTokens");
  checkAmount(c.costMicrousd, "costMicrousd");
  if (c.keyBudget) {
    checkText(c.keyBudget.keyId, "keyBudget.keyId");
    checkBudgetPeriod(c.keyBudget.period, "keyBudget.period");
  }
  if (c.idempotency) checkText(c.idempotency.key, "idempotency.key");
  if (c.idempotency?.response) {
    checkHttpStatus(c.idempotency.response.status, "idempotency.response.status");
    if (typeof c.idempotency.response.body !== "string")
      throw new StoreInputError("idempotency.response.body must be a string", "idempotency.response.body");
    checkText(c.idempotency.response.requestId, "idempotency.response.requestId");
  }
}
