import { auditEntryJson } from "../admin/admin-json.ts";
import type { NamedAuditPage } from "../admin/operations.ts";
import type { AuditEntry } from "../domain/audit.ts";
import { formatUsd } from "../domain/money.ts";
import { MAX_PAGE_LIMIT } from "../domain/paging.ts";
import { type CommandGroup, stringOption } from "./command.ts";
import { isoTime, quoted } from "./output.ts";
import { DEFAULT_USAGE_LIMIT, MAX_USAGE_LIMIT, parseLimit } from "./usage-commands.ts";

/** `name="Acme"`, `amount_usd=12.5 note="invoice 7"`: an entry's details on one line (amounts in USD, nulls left out). */
export function detailsText(details: AuditEntry["details"]): string {
  return Object.entries(details)
    .filter(([, value]) => value !== null)
    .map(([key, value]) => {
      if (typeof value === "number" && key.endsWith("_microusd")) return `${key.slice(0, -"_microusd".length)}_usd=${formatUsd(value)}`;
      return `${key}=${typeof value === "string" ? JSON.stringify(value) : String(value)}`;
    })
    .join(" ");
}

export const auditCommands: CommandGroup = {
  name: "audit",
  summary: "The audit log of administrative changes",
  commands: [
    {
      // The group is the command: `tds audit …` (see the empty-name convention in cli.ts).
      name: "",
      positionals: [],
      options: {
        org: { type: "string", valueName: "ORG", description: "Only this organization's entries (id or name)" },
        limit: {
          type: "string",
          valueName: "N",
          description: `At most N entries, newest first (1 to ${MAX_USAGE_LIMIT}, default ${DEFAULT_USAGE_LIMIT})`,
        },
      },
      synopsis: "[--org ORG] [--limit N]",
      summary: "The audit log: who changed what and when, newest first",
      async run(ctx, input) {
        const org = stringOption(input, "org");
        const limit = parseLimit(stringOption(input, "limit"));
        const admin = await ctx.admin();
        const entries: NamedAuditPage["entries"] = [];
        let cursor: string | null = null;
        do {
          const page = await admin.audit({
            limit: Math.min(MAX_PAGE_LIMIT, limit - entries.length),
            ...(org === undefined ? {} : { org }),
            ...(cursor === null ? {} : { cursor }),
          });
          entries.push(...page.entries);
          cursor = page.nextCursor;
        } while (cursor !== null && entries.length < limit);

        if (ctx.out.jsonMode) return ctx.out.json(entries.map(auditEntryJson));
        if (entries.length === 0)
          return ctx.out.line(org === undefined ? "No audit entries yet." : `No audit entries for organization ${quoted(org)}.`);
        ctx.out.table(
          ["TIME", "ACTION", "ORGANIZATION", "TARGET", "SOURCE", "CLIENT", "DETAILS"],
          entries.map((e) => [
            isoTime(e.atMs),
            e.action,
            e.orgName ?? e.orgId,
            e.targetId,
            e.source,
            e.client ?? "",
            detailsText(e.details),
          ]),
        );
        if (cursor !== null) ctx.out.note(`Showing the newest ${entries.length}; more with --limit N (up to ${MAX_USAGE_LIMIT}).`);
      },
    },
  ],
};
