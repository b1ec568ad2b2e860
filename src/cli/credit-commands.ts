import { balanceJson } from "../admin/admin-json.ts";
import type { Balance } from "../domain/credits.ts";
import { formatUsd, parseUsd } from "../domain/money.ts";
import { type CommandGroup, nameArgument, requiredOption, stringOption, UsageError } from "./command.ts";
import { describeOrganization } from "./org-commands.ts";

/** The admin API's Idempotency-Key: 1 to 255 printable ASCII characters, no spaces. */
const IDEMPOTENCY_KEY = /^[\x21-\x7E]{1,255}$/;
const REPLAYED = "Already granted with this idempotency key; nothing granted again.";

/** A USD amount given on the command line, such as 12.50: at most 6 decimals, more than 0. */
export function parseUsdOption(name: string, text: string): number {
  const microusd = parseUsd(text);
  if (microusd === null)
    throw new UsageError(`--${name} must be a decimal USD amount such as 12.50 (at most 6 decimals), got ${JSON.stringify(text)}`);
  if (microusd <= 0n) throw new UsageError(`--${name} must be more than 0`);
  return Number(microusd);
}

function balanceTable(balance: Balance): [string[], string[][]] {
  const row = (label: string, microusd: number) => [label, formatUsd(microusd), String(microusd)];
  return [
    ["", "USD", "MICROUSD"],
    [row("available", balance.available), row("reserved", balance.reserved), row("spent", balance.spent), row("granted", balance.granted)],
  ];
}

const ORG_OPTION = { type: "string", valueName: "ORG", description: "Organization id or name (required)" } as const;

export const creditCommands: CommandGroup = {
  name: "credits",
  summary: "Credits (paid mode): grant, show the balance",
  commands: [
    {
      name: "grant",
      positionals: [],
      options: {
        org: ORG_OPTION,
        usd: { type: "string", valueName: "USD", description: "Amount in USD, such as 12.50 (required, more than 0, at most 6 decimals)" },
        note: { type: "string", valueName: "TEXT", description: "A note kept with the grant in the credit ledger" },
        "idempotency-key": {
          type: "string",
          valueName: "KEY",
          description: "Grant at most once per KEY (kept 24 hours): run again with the same KEY after a failure, nothing is granted twice",
        },
      },
      synopsis: "--org ORG --usd USD [--note TEXT] [--idempotency-key KEY]",
      summary: "Add credits to an organization's available balance",
      async run(ctx, input) {
        const orgRef = requiredOption(input, "org");
        const amount = parseUsdOption("usd", requiredOption(input, "usd"));
        const noteText = stringOption(input, "note");
        const note = noteText === undefined ? undefined : nameArgument("The note", noteText);
        const idempotencyKey = stringOption(input, "idempotency-key");
        if (idempotencyKey !== undefined && !IDEMPOTENCY_KEY.test(idempotencyKey)) {
          throw new UsageError("--idempotency-key must be 1 to 255 printable ASCII characters without spaces");
        }
        const { org, balance, replayed } = await (await ctx.admin()).grantCredits(orgRef, {
          amountMicrousd: amount,
          ...(note === undefined ? {} : { note }),
          ...(idempotencyKey === undefined ? {} : { idempotencyKey }),
        });
        const available = `${formatUsd(balance.available)} USD (reserved ${formatUsd(balance.reserved)}, spent ${formatUsd(balance.spent)}, granted ${formatUsd(balance.granted)})`;
        if (ctx.out.jsonMode) {
          if (replayed) ctx.out.note(REPLAYED);
          return ctx.out.json(balanceJson(org.id, balance));
        }
        // A replay answers the balance the first grant answered.
        if (replayed) ctx.out.line(REPLAYED, `Available after that grant: ${available}.`);
        else ctx.out.line(`Granted ${formatUsd(amount)} USD to organization ${describeOrganization(org)}.`, `Available: ${available}.`);
      },
    },
    {
      name: "show",
      positionals: [],
      options: { org: ORG_OPTION },
      synopsis: "--org ORG",
      summary: "Show an organization's credits: available, reserved, spent, granted",
      async run(ctx, input) {
        const { org, balance } = await (await ctx.admin()).organization(requiredOption(input, "org"));
        if (ctx.out.jsonMode) return ctx.out.json(balanceJson(org.id, balance));
        ctx.out.line(`Credits of organization ${describeOrganization(org)}:`);
        ctx.out.table(...balanceTable(balance));
      },
    },
  ],
};
