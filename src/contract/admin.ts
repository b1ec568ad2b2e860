import { type Static, type TSchema, Type } from "@sinclair/typebox";
import { OrganizationBalance, PreviewQuota, UsageDay, UsageSummaryQuery } from "./organization.ts";
import { PageLimit } from "./usage.ts";

/** The admin API (/admin/v1): schemas of its bodies, queries and answers. */

const Microusd = (description: string) => Type.Integer({ minimum: 0, description: `${description}, integer microUSD (1 USD = 1,000,000)` });
const Usd = (description: string) => Type.String({ description: `${description}, exact decimal USD string` });
const Cursor = Type.Optional(Type.String({ maxLength: 500, description: "next_cursor of the previous page" }));

export const NAME_MAX_LENGTH = 100;

/** An organization's or key's name: 1–100 characters, no control characters; surrounding spaces are trimmed (checked beyond the schema). */
const Name = (description: string) => Type.String({ minLength: 1, maxLength: NAME_MAX_LENGTH, description });

export const AdminBalance = Type.Object(
  {
    org_id: Type.String(),
    ...OrganizationBalance.properties,
    granted_microusd: Microusd("Sum of grants"),
    granted_usd: Usd("granted_microusd"),
  },
  { additionalProperties: false, title: "AdminBalance" },
);

export const AdminOrganization = Type.Object(
  {
    id: Type.String(),
    name: Type.String(),
    paused: Type.Boolean({ description: "Paused: its decision requests get 403" }),
    created_at: Type.String({ description: "ISO-8601" }),
    balance: AdminBalance,
    preview: PreviewQuota,
    keys: Type.Object(
      {
        active: Type.Integer({
          minimum: 0,
          description: "Keys that work now: active, or rotated within their grace (not expired or retired)",
        }),
        revoked: Type.Integer({ minimum: 0 }),
      },
      { additionalProperties: false, description: "How many API keys it has" },
    ),
  },
  { additionalProperties: false, title: "AdminOrganization" },
);

export const AdminOrganizationPage = Type.Object(
  { data: Type.Array(AdminOrganization, { description: "Oldest first" }), next_cursor: Type.Union([Type.String(), Type.Null()]) },
  { additionalProperties: false, title: "AdminOrganizationPage" },
);

export const AdminPageQuery = Type.Object({ cursor: Cursor, limit: PageLimit }, { additionalProperties: false });

export const CreateOrganizationBody = Type.Object(
  { name: Name("Unique name of the organization") },
  { additionalProperties: false, title: "CreateOrganization" },
);

export const UpdateOrganizationBody = Type.Object(
  { paused: Type.Boolean({ description: "true pauses (decision requests get 403), false resumes" }) },
  { additionalProperties: false, title: "UpdateOrganization" },
);

export const OrgParams = Type.Object(
  { org: Type.String({ minLength: 1, maxLength: 200, description: "Organization id (org_…) or unique name" }) },
  { additionalProperties: false },
);

export const KeyParams = Type.Object({ key_id: Type.String({ minLength: 1, maxLength: 200 }) }, { additionalProperties: false });

const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);

/** The most a key's rotation grace may be: 30 days. */
export const MAX_GRACE_SECONDS = 2_592_000;

export const KeyBudgetJson = Type.Object(
  {
    usd: Type.String({
      minLength: 1,
      maxLength: 20,
      description: "Decimal USD such as 25 or 12.50: at least 0, at most 6 decimals (checked beyond the schema)",
    }),
    period: Type.Union([Type.Literal("day"), Type.Literal("month")], { description: "The UTC day or calendar month the spend counts in" }),
  },
  { additionalProperties: false, title: "KeyBudget" },
);

/** A key's own limits, as the admin API shows them (null: none of its own). */
const KeySettingsJson = {
  expires_at: Nullable(Type.String({ format: "date-time", description: "From this time the key is refused (401)" })),
  models: Nullable(
    Type.Array(Type.String(), { description: "The public model names the key may use (403 for another); null: every model" }),
  ),
  requests_per_minute: Nullable(
    Type.Integer({ minimum: 1, description: "The key's own per-minute request limit, within its organization's" }),
  ),
  budget: Nullable(KeyBudgetJson),
};

/** The settings a create or update sends: each may be absent; in an update, null clears it. */
const KeySettingsInput = {
  expires_at: Type.Optional(
    Nullable(Type.String({ format: "date-time", maxLength: 40, description: "RFC 3339 time from which the key is refused (401)" })),
  ),
  models: Type.Optional(
    Nullable(
      Type.Array(Type.String({ minLength: 1, maxLength: 200 }), {
        minItems: 1,
        maxItems: 64,
        uniqueItems: true,
        description: "Public model names (GET /v1/models) the key may use; absent or null: every model",
      }),
    ),
  ),
  requests_per_minute: Type.Optional(
    Nullable(
      Type.Integer({ minimum: 1, maximum: 1_000_000, description: "The key's own per-minute request limit, within its organization's" }),
    ),
  ),
  budget: Type.Optional(Nullable(KeyBudgetJson)),
};

export const AdminApiKey = Type.Object(
  {
    id: Type.String(),
    org_id: Type.String(),
    name: Type.Union([Type.String(), Type.Null()]),
    created_at: Type.String(),
    revoked_at: Type.Union([Type.String(), Type.Null()]),
    ...KeySettingsJson,
    replaced_by: Nullable(Type.String({ description: "Rotated: the id of the key that replaced it" })),
    retires_at: Nullable(Type.String({ description: "Rotated: the end of its grace period, from which it is refused (401)" })),
    last_used_at: Nullable(
      Type.String({ description: "The last request it authenticated, accurate to about a minute; null: none recorded" }),
    ),
  },
  { additionalProperties: false, title: "AdminApiKey" },
);

export const AdminApiKeyList = Type.Object(
  { data: Type.Array(AdminApiKey, { description: "Oldest first; never the key or its hash" }) },
  { additionalProperties: false, title: "AdminApiKeyList" },
);

export const CreateKeyBody = Type.Object(
  { name: Type.Optional(Name("A label for the key, such as where it is used")), ...KeySettingsInput },
  { additionalProperties: false, title: "CreateKey" },
);

export const UpdateKeyBody = Type.Object(
  { name: Type.Optional(Nullable(Name("A label for the key; null clears it"))), ...KeySettingsInput },
  { additionalProperties: false, minProperties: 1, title: "UpdateKey" },
);

export const RotateKeyBody = Type.Object(
  {
    grace_seconds: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_GRACE_SECONDS,
        description: "How long the old key keeps working, in seconds (default 86,400; 0: refused at once)",
      }),
    ),
  },
  { additionalProperties: false, title: "RotateKey" },
);

export const CreatedApiKey = Type.Object(
  {
    id: Type.String(),
    org_id: Type.String(),
    name: Type.Union([Type.String(), Type.Null()]),
    key: Type.String({ description: "The API key: shown in this answer only, never again (only its hash is stored)" }),
    created_at: Type.String(),
    ...KeySettingsJson,
  },
  { additionalProperties: false, title: "CreatedApiKey" },
);

export const RotatedApiKey = Type.Object(
  {
    ...CreatedApiKey.properties,
    replaces: Type.String({ description: "The id of the rotated key" }),
    old_key_retires_at: Type.String({ description: "When the rotated key's grace ends and it is refused" }),
  },
  { additionalProperties: false, title: "RotatedApiKey" },
);

export const GrantCreditsBody = Type.Object(
  {
    amount_usd: Type.String({
      minLength: 1,
      maxLength: 20,
      description: "Decimal USD such as 12.50: more than 0, at most 6 decimals (checked beyond the schema)",
    }),
    note: Type.Optional(Name("Kept with the grant in the ledger and the audit log")),
  },
  { additionalProperties: false, title: "GrantCredits" },
);

export const AdminUsageSummaryQuery = Type.Object({ days: UsageSummaryQuery.properties.days }, { additionalProperties: false });

const UsageTotalsJson = {
  requests: Type.Integer({ minimum: 0 }),
  input_tokens: Type.Integer({ minimum: 0 }),
  output_tokens: Type.Integer({ minimum: 0 }),
  cost_microusd: Type.Integer({ minimum: 0 }),
  cost_usd: Type.String(),
};

export const AdminUsageSummary = Type.Object(
  {
    from: Type.String({ description: "ISO-8601, inclusive: 00:00 UTC of the first day" }),
    to: Type.String({ description: "ISO-8601, exclusive: 00:00 UTC after today" }),
    days: Type.Array(UsageDay, { description: "Every organization together, per UTC day, oldest first, days without requests as zeros" }),
    organizations: Type.Array(
      Type.Object({ id: Type.String(), name: Type.String(), ...UsageTotalsJson }, { additionalProperties: false }),
      { description: "Organizations with requests in the period, by cost then requests, largest first" },
    ),
  },
  { additionalProperties: false, title: "AdminUsageSummary" },
);

export const AuditAction = Type.Union(
  [
    "organization.created",
    "organization.paused",
    "organization.resumed",
    "key.created",
    "key.revoked",
    "key.updated",
    "key.rotated",
    "credits.granted",
  ].map((a) => Type.Literal(a)),
);

export const AuditEntryJson = Type.Object(
  {
    id: Type.Integer(),
    at: Type.String({ description: "ISO-8601" }),
    action: AuditAction,
    org_id: Type.String(),
    org_name: Type.Union([Type.String(), Type.Null()], { description: "The organization's name now" }),
    target: Type.String({ description: "The organization's id, or the key's id for key actions" }),
    source: Type.Union([Type.Literal("cli"), Type.Literal("http")], {
      description: "cli: the tds CLI on the database; http: the admin API",
    }),
    client: Type.Union([Type.String(), Type.Null()], {
      description: "The admin API caller's x-tds-client header (the console sends console, the CLI cli)",
    }),
    remote_address: Type.Union([Type.String(), Type.Null()]),
    details: Type.Record(Type.String(), Type.Union([Type.String(), Type.Number(), Type.Boolean(), Type.Null()]), {
      description:
        "What changed: a name; a key's settings at creation (with rotated_from, the old key's id, for a rotation's new key) or the fields an update changed; a rotation's new_key_id and retires_at; a grant's amount_microusd and note",
    }),
  },
  { additionalProperties: false, title: "AuditEntry" },
);

export const AuditPageJson = Type.Object(
  { data: Type.Array(AuditEntryJson, { description: "Newest first" }), next_cursor: Type.Union([Type.String(), Type.Null()]) },
  { additionalProperties: false, title: "AuditPage" },
);

export const AuditQuery = Type.Object(
  {
    org: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: "Only this organization's entries (id or name)" })),
    cursor: Cursor,
    limit: PageLimit,
  },
  { additionalProperties: false },
);

export type AdminBalance = Static<typeof AdminBalance>;
export type AdminOrganization = Static<typeof AdminOrganization>;
export type AdminOrganizationPage = Static<typeof AdminOrganizationPage>;
export type AdminApiKey = Static<typeof AdminApiKey>;
export type CreatedApiKey = Static<typeof CreatedApiKey>;
export type AdminUsageSummary = Static<typeof AdminUsageSummary>;
export type AuditEntryJson = Static<typeof AuditEntryJson>;
export type AuditPageJson = Static<typeof AuditPageJson>;
export type AdminPageQuery = Static<typeof AdminPageQuery>;
export type CreateOrganizationBody = Static<typeof CreateOrganizationBody>;
export type UpdateOrganizationBody = Static<typeof UpdateOrganizationBody>;
export type OrgParams = Static<typeof OrgParams>;
export type KeyParams = Static<typeof KeyParams>;
export type CreateKeyBody = Static<typeof CreateKeyBody>;
export type UpdateKeyBody = Static<typeof UpdateKeyBody>;
export type RotateKeyBody = Static<typeof RotateKeyBody>;
export type RotatedApiKey = Static<typeof RotatedApiKey>;
export type GrantCreditsBody = Static<typeof GrantCreditsBody>;
export type AdminUsageSummaryQuery = Static<typeof AdminUsageSummaryQuery>;
export type AuditQuery = Static<typeof AuditQuery>;
