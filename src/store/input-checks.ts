import { MAX_PAGE_LIMIT } from "../domain/paging.ts";
import { StoreInputError } from "./store-errors.ts";

/**
 * Argument checks shared by the credit, quota and idempotency methods. Nothing here is dialect-specific,
 * so the PostgreSQL adapter can use it as it is. Each throws StoreInputError naming the field.
 */

/** A whole number of microUSD, 0 or more (more than 0 with `positive`), within the safe integer range. */
export function checkAmount(value: number, field: string, options: { positive?: boolean } = {}): void {
  const min = options.positive ? 1 : 0;
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < min) {
    throw new StoreInputError(`${field} must be a whole number of microUSD${options.positive ? " greater than 0" : ", 0 or more"}`, field);
  }
}

/** Epoch milliseconds as a whole number (the columns are INTEGER). */
export function checkEpochMs(value: number, field: string): void {
  if (typeof value !== "number" || !Number.isSafeInteger(value)) {
    throw new StoreInputError(`${field} must be a whole number of epoch milliseconds`, field);
  }
}

/** A whole number, 0 or more. */
export function checkCount(value: number, field: string): void {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    throw new StoreInputError(`${field} must be a whole number, 0 or more`, field);
  }
}

export function checkText(value: string, field: string): void {
  if (typeof value !== "string" || value.length === 0) throw new StoreInputError(`${field} must be a non-empty string`, field);
}

const DAY = /^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$/;

/** A UTC day as `YYYY-MM-DD`. */
export function checkDay(value: string, field = "day"): void {
  if (typeof value !== "string" || !DAY.test(value)) throw new StoreInputError(`${field} must be a UTC day written YYYY-MM-DD`, field);
}

/** The preview counter scope of the whole service; no organization may use it as its id. */
export const GLOBAL_PREVIEW_SCOPE = "*";

export function checkPreviewOrg(orgId: string): void {
  checkText(orgId, "orgId");
  if (orgId === GLOBAL_PREVIEW_SCOPE)
    throw new StoreInputError(`orgId must not be ${JSON.stringify(GLOBAL_PREVIEW_SCOPE)}, the scope of the whole service`, "orgId");
}

/** An HTTP status code of a stored response. */
export function checkHttpStatus(value: number, field: string): void {
  if (typeof value !== "number" || !Number.isInteger(value) || value < 100 || value > 599) {
    throw new StoreInputError(`${field} must be an HTTP status from 100 to 599`, field);
  }
}

/** A page size: a whole number from 1 to MAX_PAGE_LIMIT (organizations, audit entries, usage records). */
export function checkPageLimit(limit: number): void {
  if (typeof limit !== "number" || !Number.isInteger(limit) || limit < 1 || limit > MAX_PAGE_LIMIT) {
    throw new StoreInputError(`limit must be a whole number from 1 to ${MAX_PAGE_LIMIT}`, "limit");
  }
}
