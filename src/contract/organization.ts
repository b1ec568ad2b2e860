import { type Static, Type } from "@sinclair/typebox";
import { ServiceMode } from "./decision.ts";

const Microusd = (description: string) => Type.Integer({ minimum: 0, description: `${description}, integer microUSD (1 USD = 1,000,000)` });
const Usd = (description: string) => Type.String({ description: `${description}, exact decimal USD string` });

export const OrganizationBalance = Type.Object(
  {
    available_microusd: Microusd("Credits that can be reserved"),
    available_usd: Usd("available_microusd"),
    reserved_microusd: Microusd("Credits held by requests in flight"),
    reserved_usd: Usd("reserved_microusd"),
    spent_microusd: Microusd("Sum of settled costs"),
    spent_usd: Usd("spent_microusd"),
  },
  { additionalProperties: false, title: "OrganizationBalance" },
);

export const PreviewQuota = Type.Object(
  {
    date: Type.String({ description: "The UTC day the counter belongs to, YYYY-MM-DD" }),
    used: Type.Integer({ minimum: 0, description: "Requests of the organization counted today" }),
    limit: Type.Integer({ minimum: 0, description: "preview_request_limit" }),
    remaining: Type.Integer({ minimum: 0 }),
    resets_at: Type.String({ description: "ISO-8601 time of the next 00:00 UTC" }),
  },
  { additionalProperties: false, title: "PreviewQuota" },
);

/** GET /v1/organization: the key's organization, its mode and where it stands against its limits. */
export const OrganizationResponse = Type.Object(
  {
    id: Type.String(),
    name: Type.String(),
    service_mode: ServiceMode,
    paused: Type.Boolean({ description: "Paused pending billing review: decision requests get 403" }),
    balance: Type.Union([OrganizationBalance, Type.Null()], { description: "Credits in paid mode; null in preview" }),
    preview: Type.Union([PreviewQuota, Type.Null()], { description: "Today's preview quota; null in paid mode" }),
    rate_limit: Type.Object(
      { requests_per_minute: Type.Integer({ minimum: 1, description: "Shared by every key of the organization and the Playground" }) },
      { additionalProperties: false },
    ),
  },
  { additionalProperties: false, title: "Organization" },
);

export const USAGE_SUMMARY_MAX_DAYS = 31;
export const USAGE_SUMMARY_DEFAULT_DAYS = 14;

export const UsageSummaryQuery = Type.Object(
  {
    days: Type.Optional(
      Type.String({ pattern: "^[0-9]{1,2}$", description: `1 to ${USAGE_SUMMARY_MAX_DAYS}, default ${USAGE_SUMMARY_DEFAULT_DAYS}` }),
    ),
  },
  { additionalProperties: false },
);

export const UsageDay = Type.Object(
  {
    date: Type.String({ description: "UTC day, YYYY-MM-DD" }),
    requests: Type.Integer({ minimum: 0, description: "Accepted requests (every outcome)" }),
    input_tokens: Type.Integer({ minimum: 0 }),
    output_tokens: Type.Integer({ minimum: 0 }),
    cost_microusd: Type.Integer({ minimum: 0 }),
    cost_usd: Type.String(),
  },
  { additionalProperties: false, title: "UsageDay" },
);

export const UsageSummaryResponse = Type.Object(
  {
    days: Type.Array(UsageDay, { description: "The last N UTC days, today included, oldest first, days without requests as zeros" }),
    truncated: Type.Boolean({
      description: "Always false: the totals are kept per UTC day and count every record of the period (kept for compatibility)",
    }),
  },
  { additionalProperties: false, title: "UsageSummary" },
);

export type OrganizationBalance = Static<typeof OrganizationBalance>;
export type PreviewQuota = Static<typeof PreviewQuota>;
export type OrganizationResponse = Static<typeof OrganizationResponse>;
export type UsageSummaryQuery = Static<typeof UsageSummaryQuery>;
export type UsageDay = Static<typeof UsageDay>;
export type UsageSummaryResponse = Static<typeof UsageSummaryResponse>;
