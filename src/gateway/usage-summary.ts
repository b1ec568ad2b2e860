import type { UsageSums } from "../domain/usage-records.ts";
import { DAY_MS, msUntilUtcMidnight, utcDay } from "../domain/utc-day.ts";
import type { AdministrationStore } from "../store/administration.ts";

/**
 * The usage summary behind GET /v1/usage/summary (one organization) and GET /admin/v1/usage/summary (every
 * organization): the last N UTC days, today included, from the store's daily totals. Its cost is one row per
 * organization and day of the period, whatever the number of records, and nothing is left out.
 */
export interface UsageSummary {
  /** 00:00 UTC of the first day, inclusive. */
  fromMs: number;
  /** 00:00 UTC after today, exclusive. */
  toMs: number;
  /** Every day of the period, oldest first; days without requests as zeros. */
  days: Array<{ dayStartMs: number; date: string } & UsageSums>;
  /** Organizations with requests in the period, by cost then requests, largest first; an organization not found is named by its id. */
  organizations: Array<{ orgId: string; name: string } & UsageSums>;
}

/** The summary of the `days` UTC days up to the one of `nowMs`, of one organization or (without `orgId`) every one. */
export async function usageSummary(
  store: Pick<AdministrationStore, "usageTotals">,
  query: { nowMs: number; days: number; orgId?: string },
): Promise<UsageSummary> {
  const toMs = query.nowMs + msUntilUtcMidnight(query.nowMs);
  const fromMs = toMs - query.days * DAY_MS;
  const totals = await store.usageTotals({ fromMs, toMs, ...(query.orgId === undefined ? {} : { orgId: query.orgId }) });
  const byDay = new Map(totals.days.map((d) => [d.dayStartMs, d]));
  const days: UsageSummary["days"] = [];
  for (let start = fromMs; start < toMs; start += DAY_MS) {
    const d = byDay.get(start);
    days.push({
      dayStartMs: start,
      date: utcDay(start),
      requests: d?.requests ?? 0,
      inputTokens: d?.inputTokens ?? 0,
      outputTokens: d?.outputTokens ?? 0,
      costMicrousd: d?.costMicrousd ?? 0,
    });
  }
  const organizations = totals.organizations.map(({ name, ...o }) => ({ ...o, name: name ?? o.orgId }));
  return { fromMs, toMs, days, organizations };
}
