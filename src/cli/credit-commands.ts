import { formatUsd, parseUsd } from "../gateway/money.ts";
import type { Balance } from "../store/store.ts";
import { requiredOption, stringOption, UsageError, type CommandGroup } from "./command.ts";
import { checkName, describeOrganization, findOrganizationOrFail } from "./org-commands.ts";

/** An organization's credits as `tds credits … --json` prints them: each amount in integer microUSD and as a decimal USD string. */
export interface BalanceJson {
  org_id: string;
  available_microusd: number;
  available_usd: string;
  reserved_microusd: number;
  reserved_usd: string;
  spent_microusd: number;
  spent_usd: string;
  granted_microusd: number;
  granted_usd: string;
}

export function balanceJson(orgId: string, balance: Balance): BalanceJson {
  return {
    org_id: orgId,
    available_microusd: balance.available,
    available_usd: formatUsd(balance.available),
    reserved_microusd: balance.reserved,
    reserved_usd: formatUsd(balance.reserved),
    spent_microusd: balance.spent,
    spent_usd: formatUsd(balance.spent),
    granted_microusd: balance.granted,
    granted_usd: formatUsd(balance.granted),
  };
}

/** A USD amount given on the command line, such as 12.50: at most 6 decimals, more than 0. */
export function parseUsdOption(name: string, text: string): number {
  const microusd = parseUsd(text);
  if (microusd === null) throw new UsageError(`--${name} must be a decimal USD amount such as 12.50 (at most 6 decimals), got ${JSON.stringify(text)}`);
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
      },
      synopsis: "--org ORG --usd USD [--note TEXT]",
      summary: "Add credits to an organization's available balance",
      async run(ctx, input) {
        const orgRef = requiredOption(input, "org");
        const amount = parseUsdOption("usd", requiredOption(input, "usd"));
        const noteText = stringOption(input, "note");
        const note = noteText === undefined ? undefined : checkName("The note", noteText);
        const store = await ctx.store();
        const org = await findOrganizationOrFail(store, orgRef);
        const balance = await store.grantCredits({ orgId: org.id, amountMicrousd: amount, nowMs: ctx.nowMs(), ...(note === undefined ? {} : { note }) });
        if (ctx.out.jsonMode) return ctx.out.json(balanceJson(org.id, balance));
        ctx.out.line(
          `Granted ${formatUsd(amount)} USD to organization ${describeOrganization(org)}.`,
          `Available: ${formatUsd(balance.available)} USD (reserved ${formatUsd(balance.reserved)}, spent ${formatUsd(balance.spent)}, granted ${formatUsd(balance.granted)}).`,
        );
      },
    },
    {
      name: "show",
      positionals: [],
      options: { org: ORG_OPTION },
      synopsis: "--org ORG",
      summary: "Show an organization's credits: available, reserved, spent, granted",
      async run(ctx, input) {
        const store = await ctx.store();
        const org = await findOrganizationOrFail(store, requiredOption(input, "org"));
        const balance = await store.getBalance(org.id);
        if (ctx.out.jsonMode) return ctx.out.json(balanceJson(org.id, balance));
        ctx.out.line(`Credits of organization ${describeOrganization(org)}:`);
        ctx.out.table(...balanceTable(balance));
      },
    },
  ],
};
