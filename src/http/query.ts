import { USAGE_SUMMARY_DEFAULT_DAYS, USAGE_SUMMARY_MAX_DAYS } from "../contract/organization.ts";
import type { UsageListQuery } from "../contract/usage.ts";
import { ServiceError } from "../domain/errors.ts";
import { DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT } from "../domain/paging.ts";
import type { UsageQuery } from "../store/store.ts";

/**
 * Query parameters past their schema: the route's schema admits the text (digits, a length, an enum), these read its
 * value. A value out of range is a 422 invalid_query naming the parameter (`query.<name>`), as the schema's refusals are.
 */

function invalidQuery(name: string, message: string): ServiceError {
  return new ServiceError("invalid_query", undefined, { errors: [{ field: `query.${name}`, message }] });
}

/** A whole number from `min` to `max`; `fallback` when the parameter is absent. */
export function intInRange(name: string, text: string | undefined, range: { min: number; max: number; fallback: number }): number {
  const value = text === undefined ? range.fallback : Number(text);
  if (!Number.isInteger(value) || value < range.min || value > range.max)
    throw invalidQuery(name, `must be from ${range.min} to ${range.max}`);
  return value;
}

/** An instant written in ISO 8601, as epoch milliseconds; undefined when the parameter is absent. */
export function isoTime(name: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const ms = Date.parse(text);
  if (!Number.isFinite(ms)) throw invalidQuery(name, "must be an ISO-8601 time such as 2026-11-26T00:00:00Z");
  return ms;
}

/** `limit` and `cursor` of a listing: 1 to MAX_PAGE_LIMIT entries (DEFAULT_PAGE_LIMIT when absent); no cursor or an empty one is the first page. */
export function pageQuery(q: { limit?: string; cursor?: string }): { limit: number; cursor?: string } {
  const limit = intInRange("limit", q.limit, { min: 1, max: MAX_PAGE_LIMIT, fallback: DEFAULT_PAGE_LIMIT });
  return q.cursor ? { limit, cursor: q.cursor } : { limit };
}

/** `days` of the usage summaries: the last N UTC days, today included. */
export function summaryDays(text: string | undefined): number {
  return intInRange("days", text, { min: 1, max: USAGE_SUMMARY_MAX_DAYS, fallback: USAGE_SUMMARY_DEFAULT_DAYS });
}

/** The store query of GET …/usage's query string (limit, cursor, from, to, outcome). */
export function usageListQuery(q: UsageListQuery): UsageQuery {
  const query: UsageQuery = pageQuery(q);
  const fromMs = isoTime("from", q.from);
  const toMs = isoTime("to", q.to);
  if (fromMs !== undefined) query.fromMs = fromMs;
  if (toMs !== undefined) query.toMs = toMs;
  if (q.outcome) query.outcome = q.outcome;
  return query;
}
