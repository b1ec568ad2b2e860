import type { AdminUsageSummary } from "../contract/admin.ts";
import type { UsageDay, UsageSummaryResponse } from "../contract/organization.ts";
import { formatUsd } from "../domain/money.ts";
import type { UsageSums } from "../domain/usage-records.ts";
import type { UsageSummary } from "../gateway/usage-summary.ts";

/** The usage summary as GET /v1/usage/summary and GET /admin/v1/usage/summary answer it: one mapping for both. */

function sumsJson(s: UsageSums) {
  return {
    requests: s.requests,
    input_tokens: s.inputTokens,
    output_tokens: s.outputTokens,
    cost_microusd: s.costMicrousd,
    cost_usd: formatUsd(s.costMicrousd),
  };
}

export function usageDaysJson(summary: UsageSummary): UsageDay[] {
  return summary.days.map((d) => ({ date: d.date, ...sumsJson(d) }));
}

/** One organization's summary; never truncated (the totals are kept per day). */
export function usageSummaryJson(summary: UsageSummary): UsageSummaryResponse {
  return { days: usageDaysJson(summary), truncated: false };
}

export function adminUsageSummaryJson(summary: UsageSummary): AdminUsageSummary {
  return {
    from: new Date(summary.fromMs).toISOString(),
    to: new Date(summary.toMs).toISOString(),
    days: usageDaysJson(summary),
    organizations: summary.organizations.map((o) => ({ id: o.orgId, name: o.name, ...sumsJson(o) })),
  };
}
