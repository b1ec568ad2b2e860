import type { OrganizationBalance, PreviewQuota } from "../contract/organization.ts";
import type { Balance } from "../domain/credits.ts";
import { formatUsd } from "../domain/money.ts";
import type { PreviewUse } from "../gateway/preview-use.ts";

/** An organization's credits as GET /v1/organization and the admin API show them: integer microUSD and decimal USD. */
export function creditsJson(balance: Balance): OrganizationBalance {
  return {
    available_microusd: balance.available,
    available_usd: formatUsd(balance.available),
    reserved_microusd: balance.reserved,
    reserved_usd: formatUsd(balance.reserved),
    spent_microusd: balance.spent,
    spent_usd: formatUsd(balance.spent),
  };
}

/** Today's preview use against the limit, as GET /v1/organization and the admin API show it. */
export function previewQuotaJson(preview: PreviewUse): PreviewQuota {
  return {
    date: preview.day,
    used: preview.used,
    limit: preview.limit,
    remaining: Math.max(0, preview.limit - preview.used),
    resets_at: new Date(preview.resetsAtMs).toISOString(),
  };
}
