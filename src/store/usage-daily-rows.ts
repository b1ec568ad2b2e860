import type { UsageOutcome } from "../domain/usage-records.ts";
import { DAY_MS } from "../domain/utc-day.ts";
import { USAGE_DAILY_COUNTS, type UsageDailyDelta, usageDaily } from "./schema/tables.ts";

/**
 * The daily usage roll-up (table usage_daily, migration 007), the same in every dialect: one row per organization
 * and UTC day of creation, kept exact in the transactions that write usage records (admission adds the request in
 * flight, completion or the sweep moves it to its final class and adds its tokens and cost). Usage summaries read
 * these rows, never the records.
 */

/** The UTC midnight that starts the day of `ms` (created_at_ms is never negative). */
export const dayStartOf = (ms: number): number => ms - (ms % DAY_MS);

/**
 * Adds deltas to their rows, creating a missing row at the delta: `rows` is a VALUES list or a SELECT of the
 * description's columns (parameters from `usageDaily.params`). On PostgreSQL the increments are applied to the row as
 * it is when its lock is held, so concurrent transactions of several instances add up.
 */
export function addToUsageDaily(rows: string): string {
  const add = usageDaily.assign(USAGE_DAILY_COUNTS, (c) => `usage_daily.${c} + excluded.${c}`);
  return `INSERT INTO usage_daily (${usageDaily.list()}) ${rows} ON CONFLICT (day_start_ms, org_id) DO UPDATE SET ${add}`;
}

/** What one change adds to its (organization, day) row. */
export type DailyChange = Omit<UsageDailyDelta, "orgId" | "dayStartMs">;

/** Accumulates deltas, one per (organization, day). */
export class UsageDailyDeltas {
  readonly #rows = new Map<string, UsageDailyDelta>();

  /** Field by field (every request adds twice): no spread, no Object.entries, no key built with JSON. */
  add(orgId: string, createdAtMs: number, change: DailyChange): void {
    const dayStartMs = dayStartOf(createdAtMs);
    // Unambiguous whatever the id holds: the day after the last NUL is a number.
    const k = `${orgId}\u0000${dayStartMs}`;
    let row = this.#rows.get(k);
    if (!row) {
      row = { orgId, dayStartMs, requests: 0, inFlight: 0, succeeded: 0, failed: 0, inputTokens: 0, outputTokens: 0, costMicrousd: 0 };
      this.#rows.set(k, row);
    }
    row.requests += change.requests;
    row.inFlight += change.inFlight;
    row.succeeded += change.succeeded;
    row.failed += change.failed;
    row.inputTokens += change.inputTokens;
    row.outputTokens += change.outputTokens;
    row.costMicrousd += change.costMicrousd;
  }

  /** A record as it is now (in flight or final), counted whole: for writers that insert records directly. */
  addRecord(r: {
    orgId: string;
    createdAtMs: number;
    outcome: UsageOutcome;
    inputTokens: number;
    outputTokens: number;
    costMicrousd: number;
  }) {
    this.add(r.orgId, r.createdAtMs, finalChange(r, { requests: 1 }));
  }

  list(): UsageDailyDelta[] {
    return [...this.#rows.values()];
  }
}

/** What an admission adds: one request, in flight. */
export const ADMITTED: Readonly<DailyChange> = Object.freeze({
  requests: 1,
  inFlight: 1,
  succeeded: 0,
  failed: 0,
  inputTokens: 0,
  outputTokens: 0,
  costMicrousd: 0,
});

/**
 * What a record's outcome and final figures add: `in_flight` counts as in flight, anything else as final.
 * `moved`: what else the change does to the counts of requests and of requests in flight (a completion takes its
 * request out of flight: `{ inFlight: -1 }`; a record counted whole adds a request: `{ requests: 1 }`).
 */
export function finalChange(
  r: { outcome: UsageOutcome; inputTokens: number; outputTokens: number; costMicrousd: number },
  moved: { requests?: number; inFlight?: number } = {},
): DailyChange {
  return {
    requests: moved.requests ?? 0,
    inFlight: moved.inFlight ?? (r.outcome === "in_flight" ? 1 : 0),
    succeeded: r.outcome === "succeeded" ? 1 : 0,
    failed: r.outcome === "in_flight" || r.outcome === "succeeded" ? 0 : 1,
    inputTokens: r.inputTokens,
    outputTokens: r.outputTokens,
    costMicrousd: r.costMicrousd,
  };
}

/** The sums a totals query selects from usage_daily; `cast` for PostgreSQL's numeric sums. */
export function dailySumColumns(cast = ""): string {
  return (
    `sum(requests)${cast} AS requests, sum(input_tokens)${cast} AS sum_input, sum(output_tokens)${cast} AS sum_output, ` +
    `sum(cost_microusd)${cast} AS sum_cost`
  );
}
