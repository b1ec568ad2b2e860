import { adminOrganizationJson } from "../admin/admin-json.ts";
import { looksLikeOrganizationId } from "../admin/names.ts";
import type { OrganizationStatus } from "../admin/operations.ts";
import { formatUsd } from "../domain/money.ts";
import type { Organization } from "../domain/organizations.ts";
import { MAX_PAGE_LIMIT } from "../domain/paging.ts";
import { type CommandGroup, nameArgument, UsageError } from "./command.ts";
import { isoTime, quoted } from "./output.ts";

export interface OrganizationJson {
  id: string;
  name: string;
  paused: boolean;
  created_at: string;
}

export function organizationJson(org: Organization): OrganizationJson {
  return { id: org.id, name: org.name, paused: org.paused, created_at: isoTime(org.createdAtMs) };
}

/** `org_abc… ("Acme")` for sentences. */
export function describeOrganization(org: Organization): string {
  return `${org.id} (${quoted(org.name)})`;
}

function statusLines(s: OrganizationStatus): string[] {
  const usd = (microusd: number) => formatUsd(microusd);
  const remaining = Math.max(0, s.preview.limit - s.preview.used);
  return [
    `Organization ${describeOrganization(s.org)}: ${s.org.paused ? "paused (its decision requests get 403)" : "active"}, created ${isoTime(s.org.createdAtMs)}`,
    `Credits (USD): available ${usd(s.balance.available)}, reserved ${usd(s.balance.reserved)}, spent ${usd(s.balance.spent)}, granted ${usd(s.balance.granted)}`,
    `Preview today (${s.preview.day}): ${s.preview.used} of ${s.preview.limit} requests used, ${remaining} remaining; resets at ${isoTime(s.preview.resetsAtMs)}`,
    `API keys: ${s.keys.active} active, ${s.keys.revoked} revoked`,
  ];
}

export const orgCommands: CommandGroup = {
  name: "org",
  summary: "Organizations: create, list, show, pause, resume",
  commands: [
    {
      name: "create",
      positionals: ["NAME"],
      summary: "Create an organization (names are unique)",
      async run(ctx, input) {
        const name = nameArgument("The organization name", input.positionals[0]!);
        if (looksLikeOrganizationId(name))
          throw new UsageError("The organization name must not look like an organization id (org_ and 12 characters)");
        const org = await (await ctx.admin()).createOrganization(name);
        if (ctx.out.jsonMode) ctx.out.json(organizationJson(org));
        else ctx.out.line(`Created organization ${describeOrganization(org)}.`, `Create an API key with: tds key create --org ${org.id}`);
      },
    },
    {
      name: "list",
      positionals: [],
      summary: "List organizations, oldest first",
      async run(ctx) {
        const admin = await ctx.admin();
        const orgs: Organization[] = [];
        let cursor: string | null = null;
        do {
          const page: { organizations: Organization[]; nextCursor: string | null } = await admin.listOrganizations({
            limit: MAX_PAGE_LIMIT,
            ...(cursor === null ? {} : { cursor }),
          });
          orgs.push(...page.organizations);
          cursor = page.nextCursor;
        } while (cursor !== null);
        if (ctx.out.jsonMode) return ctx.out.json(orgs.map(organizationJson));
        if (orgs.length === 0) return ctx.out.line("No organizations yet. Create one with: tds org create NAME");
        ctx.out.table(
          ["ID", "NAME", "STATUS", "CREATED"],
          orgs.map((o) => [o.id, o.name, o.paused ? "paused" : "active", isoTime(o.createdAtMs)]),
        );
      },
    },
    {
      name: "show",
      positionals: ["ORG"],
      summary: "Show an organization: status, credits, today's preview use, API key counts",
      async run(ctx, input) {
        const status = await (await ctx.admin()).organization(input.positionals[0]!);
        if (ctx.out.jsonMode) return ctx.out.json(adminOrganizationJson(status));
        ctx.out.line(...statusLines(status));
      },
    },
    {
      name: "pause",
      positionals: ["ORG"],
      summary: "Pause an organization: its decision requests get 403 until resumed",
      async run(ctx, input) {
        const { org, changed } = await (await ctx.admin()).setPaused(input.positionals[0]!, true);
        if (ctx.out.jsonMode) return ctx.out.json(organizationJson(org));
        ctx.out.line(
          changed
            ? `Paused organization ${describeOrganization(org)}: its decision requests now get 403.`
            : `Organization ${describeOrganization(org)} was already paused.`,
        );
      },
    },
    {
      name: "resume",
      positionals: ["ORG"],
      summary: "Resume a paused organization",
      async run(ctx, input) {
        const { org, changed } = await (await ctx.admin()).setPaused(input.positionals[0]!, false);
        if (ctx.out.jsonMode) return ctx.out.json(organizationJson(org));
        ctx.out.line(
          changed ? `Resumed organization ${describeOrganization(org)}.` : `Organization ${describeOrganization(org)} was not paused.`,
        );
      },
    },
  ],
};
