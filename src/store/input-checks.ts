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

/** The most public model names one key may be limited to. */
export const MAX_KEY_MODELS = 64;
const BUDGET_PERIODS = ["day", "month"];

/**
 * A key's settings, each one given (`partial`: each may be absent, as in an update; null clears): expiry in epoch
 * milliseconds (0 or more), 1 to MAX_KEY_MODELS distinct non-empty model names, a per-minute limit above 0, and a
 * budget of whole microUSD (0 or more) per "day" or "month".
 */
export function checkKeySettings(settings: unknown, field: string, partial = false): void {
  if (typeof settings !== "object" || settings === null || Array.isArray(settings))
    throw new StoreInputError(`${field} must be an object of key settings`, field);
  const s = settings as Record<string, unknown>;
  const present = (name: string) => s[name] !== undefined;
  if (!partial)
    for (const name of ["expiresAtMs", "models", "requestsPerMinute", "budget"])
      if (s[name] === undefined) throw new StoreInputError(`${field}.${name} is required (null: none)`, `${field}.${name}`);
  if (present("expiresAtMs") && s.expiresAtMs !== null) {
    checkEpochMs(s.expiresAtMs as number, `${field}.expiresAtMs`);
    if ((s.expiresAtMs as number) < 0) throw new StoreInputError(`${field}.expiresAtMs must be 0 or more`, `${field}.expiresAtMs`);
  }
  if (present("models") && s.models !== null) {
    const models = s.models;
    const f = `${field}.models`;
    if (!Array.isArray(models) || models.length === 0 || models.length > MAX_KEY_MODELS)
      throw new StoreInputError(`${f} must be null or an array of 1 to ${MAX_KEY_MODELS} model names`, f);
    for (const m of models) checkText(m as string, f);
    if (new Set(models).size !== models.length) throw new StoreInputError(`${f} must not name a model twice`, f);
  }
  if (present("requestsPerMinute") && s.requestsPerMinute !== null) {
    const rpm = s.requestsPerMinute;
    if (typeof rpm !== "number" || !Number.isSafeInteger(rpm) || rpm < 1)
      throw new StoreInputError(`${field}.requestsPerMinute must be null or a whole number above 0`, `${field}.requestsPerMinute`);
  }
  if (present("budget") && s.budget !== null) {
    const budget = s.budget as { limitMicrousd?: unknown; period?: unknown };
    if (typeof budget !== "object" || Array.isArray(budget))
      throw new StoreInputError(`${field}.budget must be null or {limitMicrousd, period}`, `${field}.budget`);
    checkAmount(budget.limitMicrousd as number, `${field}.budget.limitMicrousd`);
    if (!BUDGET_PERIODS.includes(budget.period as string))
      throw new StoreInputError(`${field}.budget.period must be "day" or "month"`, `${field}.budget.period`);
  }
}
