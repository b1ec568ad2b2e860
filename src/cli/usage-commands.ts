import { formatUsd } from "../domain/money.ts";
import { MAX_PAGE_LIMIT } from "../domain/paging.ts";
import { USAGE_OUTCOMES, type UsageOutcome, type UsageRecord } from "../domain/usage-records.ts";
import { usageRecordJson } from "../presentation/usage-json.ts";
import type { UsageQuery } from "../store/store.ts";
import { CliError, type CommandGroup, requiredOption, stringOption, UsageError } from "./command.ts";
import { describeOrganization } from "./org-commands.ts";
import { isoTime, quoted } from "./output.ts";

const OUTCOMES = USAGE_OUTCOMES;
export const DEFAULT_USAGE_LIMIT = 20;
export const MAX_USAGE_LIMIT = 10_000;

/** --limit N of the commands that list newest first (usage, audit). */
export function parseLimit(text: string | undefined): number {
  if (text === undefined) return DEFAULT_USAGE_LIMIT;
  if (!/^[0-9]{1,5}$/.test(text) || Number(text) < 1 || Number(text) > MAX_USAGE_LIMIT) {
    throw new UsageError(`--limit must be a whole number from 1 to ${MAX_USAGE_LIMIT}, got ${JSON.stringify(text)}`);
  }
  return Number(text);
}

function parseOutcome(text: string | undefined): UsageOutcome | undefined {
  if (text === undefined) return undefined;
  const outcome = OUTCOMES.find((o) => o === text);
  if (!outcome) throw new UsageError(`--outcome must be one of ${OUTCOMES.join(", ")}, got ${JSON.stringify(text)}`);
  return outcome;
}

function ms(value: number | null): string {
  return value === null ? "" : String(value);
}

/** The lines of one record for people: `field: value`, in the JSON order. */
function recordLines(record: UsageRecord): string[] {
  const json = usageRecordJson(record);
  const width = Math.max(...Object.keys(json).map((k) => k.length));
  return Object.entries(json).map(([k, v]) => `${`${k}:`.padEnd(width + 1)} ${v === null ? "-" : String(v)}`);
}

export const usageCommands: CommandGroup = {
  name: "usage",
  summary: "Usage records of accepted decision requests",
  commands: [
    {
      // The group is the command: `tds usage --org ORG …` (see the empty-name convention in cli.ts).
      name: "",
      positionals: [],
      options: {
        org: { type: "string", valueName: "ORG", description: "Organization id or name (required)" },
        "request-id": {
          type: "string",
          valueName: "ID",
          description: "Show only this request's record (exit 1 if the organization has none)",
        },
        limit: {
          type: "string",
          valueName: "N",
          description: `At most N records, newest first (1 to ${MAX_USAGE_LIMIT}, default ${DEFAULT_USAGE_LIMIT})`,
        },
        outcome: { type: "string", valueName: "O", description: `Only records with this outcome: ${OUTCOMES.join(", ")}` },
      },
      synopsis: "--org ORG [--request-id ID] [--limit N] [--outcome O]",
      summary: "An organization's usage records, newest first, or one record by request id",
      async run(ctx, input) {
        const orgRef = requiredOption(input, "org");
        const requestId = stringOption(input, "request-id");
        const limitText = stringOption(input, "limit");
        const outcomeText = stringOption(input, "outcome");
        if (requestId !== undefined && (limitText !== undefined || outcomeText !== undefined)) {
          throw new UsageError("--request-id shows one record: it does not go with --limit or --outcome");
        }
        if (requestId !== undefined && requestId.trim() === "") throw new UsageError("--request-id must not be empty");
        const limit = parseLimit(limitText);
        const outcome = parseOutcome(outcomeText);
        const admin = await ctx.admin();

        if (requestId !== undefined) {
          const { org, record } = await admin.usageRecord(orgRef, requestId);
          if (!record)
            throw new CliError(`No usage record with request id ${quoted(requestId)} in organization ${describeOrganization(org)}`);
          if (ctx.out.jsonMode) return ctx.out.json(usageRecordJson(record));
          return ctx.out.line(...recordLines(record));
        }

        const query = (got: number, cursor: string | null): UsageQuery => ({
          limit: Math.min(MAX_PAGE_LIMIT, limit - got),
          ...(outcome === undefined ? {} : { outcome }),
          ...(cursor === null ? {} : { cursor }),
        });
        const first = await admin.usage(orgRef, query(0, null));
        const org = first.org;
        const records: UsageRecord[] = [...first.page.records];
        let cursor = first.page.nextCursor;
        while (cursor !== null && records.length < limit) {
          const { page } = await admin.usage(org.id, query(records.length, cursor));
          records.push(...page.records);
          cursor = page.nextCursor;
        }

        if (ctx.out.jsonMode) return ctx.out.json(records.map(usageRecordJson));
        if (records.length === 0) {
          return ctx.out.line(
            `Organization ${describeOrganization(org)} has no usage records${outcome ? ` with outcome ${outcome}` : ""}.`,
          );
        }
        ctx.out.table(
          ["CREATED", "REQUEST ID", "OUTCOME", "STATUS", "MODEL", "MODE", "SOURCE", "IN", "OUT", "COST USD", "LATENCY MS", "GATEWAY MS"],
          records.map((r) => [
            isoTime(r.createdAtMs),
            r.requestId,
            r.overReservation ? `${r.outcome}*` : r.outcome,
            r.httpStatus === null ? "-" : String(r.httpStatus),
            r.model,
            r.mode,
            r.source,
            String(r.inputTokens),
            String(r.outputTokens),
            formatUsd(r.costMicrousd),
            ms(r.latencyMs),
            String(r.gatewayLatencyMs),
          ]),
        );
        if (records.some((r) => r.overReservation))
          ctx.out.note("* the model reported more tokens than reserved; the reservation was charged");
        if (cursor !== null) ctx.out.note(`Showing the newest ${records.length}; more with --limit N (up to ${MAX_USAGE_LIMIT}).`);
      },
    },
  ],
};
