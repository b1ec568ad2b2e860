import { apiKeyJson, createdApiKeyJson, rotatedApiKeyJson } from "../admin/admin-json.ts";
import type { KeySettingsRequest } from "../admin/key-settings.ts";
import { keyStatus } from "../admin/key-status.ts";
import type { ApiKeyInfo, KeyUpdate } from "../admin/operations.ts";
import { MAX_GRACE_SECONDS } from "../contract/admin.ts";
import { apiKeyMatches, keyIdOf } from "../domain/api-keys.ts";
import { formatUsd } from "../domain/money.ts";
import { StoreConflictError } from "../store/store-errors.ts";
import {
  CliError,
  type CommandContext,
  type CommandGroup,
  type CommandInput,
  nameArgument,
  type OptionSpec,
  requiredOption,
  stringOption,
  UsageError,
} from "./command.ts";
import { describeOrganization } from "./org-commands.ts";
import { isoTime, quoted } from "./output.ts";

function describeKey(key: ApiKeyInfo): string {
  return key.name === null ? key.id : `${key.id} (${quoted(key.name)})`;
}

/** The options that set a key's limits (tds key create and update). */
const SETTING_OPTIONS: Record<string, OptionSpec> = {
  expires: { type: "string", valueName: "TIME", description: "Refuse the key from this RFC 3339 time on, such as 2027-01-31T00:00:00Z" },
  models: { type: "string", valueName: "A,B", description: "The only models the key may use (public names, comma-separated)" },
  rpm: { type: "string", valueName: "N", description: "The key's own requests per minute, within its organization's" },
  "budget-usd": { type: "string", valueName: "USD", description: "Paid mode: the most the key may spend per period, such as 25 or 12.50" },
  "budget-period": { type: "string", valueName: "day|month", description: "The UTC period of --budget-usd (with it)" },
};

/** The options that clear a setting (tds key update). */
const CLEARING_OPTIONS: Record<string, OptionSpec> = {
  "no-name": { type: "boolean", description: "Remove the key's name" },
  "no-expires": { type: "boolean", description: "The key no longer expires" },
  "all-models": { type: "boolean", description: "The key may use every model" },
  "no-rpm": { type: "boolean", description: "Only the organization's per-minute limit applies" },
  "no-budget": { type: "boolean", description: "The key has no budget of its own" },
};

/** A setting given or cleared, or neither; both is a usage error. */
function settingOption<T>(input: CommandInput, set: string, clear: string | null, parse: (text: string) => T): T | null | undefined {
  const text = stringOption(input, set);
  const cleared = clear !== null && input.options[clear] === true;
  if (text !== undefined && cleared) throw new UsageError(`--${set} and --${clear} do not go together`);
  return cleared ? null : text === undefined ? undefined : parse(text);
}

/** The settings of --expires, --models, --rpm and --budget-usd with --budget-period (and the clearing options of an update). */
function settingsOptions(input: CommandInput, clearing: boolean): KeySettingsRequest {
  const clear = (name: string) => (clearing ? name : null);
  const expires = settingOption(input, "expires", clear("no-expires"), (t) => t);
  const models = settingOption(input, "models", clear("all-models"), (t) => {
    const names = t.split(",").map((m) => m.trim());
    if (names.some((m) => m === "")) throw new UsageError("--models must be model names separated by commas, such as --models a,b");
    return names;
  });
  const rpm = settingOption(input, "rpm", clear("no-rpm"), (t) => {
    if (!/^[1-9][0-9]{0,8}$/.test(t)) throw new UsageError("--rpm must be a whole number above 0");
    return Number(t);
  });
  const period = stringOption(input, "budget-period");
  const budget = settingOption(input, "budget-usd", clear("no-budget"), (usd) => {
    if (period === undefined) throw new UsageError("--budget-usd needs --budget-period day or month");
    if (period !== "day" && period !== "month") throw new UsageError("--budget-period must be day or month");
    return { usd, period } as const;
  });
  if (period !== undefined && budget == null) throw new UsageError("--budget-period goes with --budget-usd");
  return {
    ...(expires === undefined ? {} : { expires_at: expires }),
    ...(models === undefined ? {} : { models }),
    ...(rpm === undefined ? {} : { requests_per_minute: rpm }),
    ...(budget === undefined ? {} : { budget }),
  };
}

/** The limits of a key in a few words, for tables and messages: "expires …, models a, b, 10/min, $25/month". */
function describeSettings(key: ApiKeyInfo): string {
  const parts = [
    key.expiresAtMs === null ? null : `expires ${isoTime(key.expiresAtMs)}`,
    key.models === null ? null : `models ${key.models.join(", ")}`,
    key.requestsPerMinute === null ? null : `${key.requestsPerMinute}/min`,
    key.budget === null ? null : `$${formatUsd(key.budget.limitMicrousd)}/${key.budget.period}`,
  ].filter((p) => p !== null);
  return parts.length === 0 ? "no limits of its own" : parts.join("; ");
}

function printNewKey(ctx: CommandContext, raw: string): void {
  ctx.out.line(
    "",
    `    ${raw}`,
    "",
    "Copy this key now: it cannot be shown again (only its hash is stored).",
    "Send it as: Authorization: Bearer <key>",
  );
}

const NOT_FOUND_HINT = "See: tds key list --org ORG";

/**
 * The key id of KEY_ID or of a whole key. On the database a whole key must be really one of ours (its hash matches),
 * not only shaped like one; the admin API takes ids only, so over HTTP only the id is sent (never the key).
 */
async function keyIdGiven(ctx: CommandContext, given: string): Promise<string> {
  const idFromRaw = keyIdOf(given);
  if (idFromRaw === null) return given;
  const store = await ctx.store();
  if (store === null) return idFromRaw;
  const found = await store.findApiKey(idFromRaw);
  if (!found || !apiKeyMatches(given, found.key.hash)) throw new CliError("That key is not a key of this service");
  return idFromRaw;
}

export const keyCommands: CommandGroup = {
  name: "key",
  summary: "API keys: create, list, update, rotate, revoke",
  commands: [
    {
      name: "create",
      positionals: [],
      options: {
        org: { type: "string", valueName: "ORG", description: "Organization id or name (required)" },
        name: { type: "string", valueName: "NAME", description: "A label for the key, such as where it is used" },
        ...SETTING_OPTIONS,
      },
      synopsis: "--org ORG [--name NAME] [limit options]",
      summary:
        "Create an API key, with limits of its own if given (--expires, --models, --rpm, --budget-usd with --budget-period); the key is printed once",
      async run(ctx, input) {
        const orgRef = requiredOption(input, "org");
        const nameText = stringOption(input, "name");
        const name = nameText === undefined ? null : nameArgument("The key name", nameText);
        const settings = settingsOptions(input, false);
        // Only the hash is stored; the key itself exists here until it is printed.
        const { org, key, raw } = await (await ctx.admin()).createKey(orgRef, name, settings).catch((err: unknown) => {
          if (err instanceof StoreConflictError)
            throw new CliError("A key with the same id already exists (very unlikely); run the command again");
          throw err;
        });
        if (org.paused)
          ctx.out.note(
            `Note: organization ${describeOrganization(org)} is paused; requests with this key get 403 until: tds org resume ${org.id}`,
          );
        if (ctx.out.jsonMode) return ctx.out.json(createdApiKeyJson(key, raw));
        ctx.out.line(`Created API key ${describeKey(key)} for organization ${describeOrganization(org)}: ${describeSettings(key)}.`);
        printNewKey(ctx, raw);
      },
    },
    {
      name: "list",
      positionals: [],
      options: {
        org: { type: "string", valueName: "ORG", description: "Organization id or name (required)" },
      },
      synopsis: "--org ORG",
      summary: "List an organization's API keys: ids, names, status, limits and last use (keys cannot be shown)",
      async run(ctx, input) {
        const { org, keys } = await (await ctx.admin()).listKeys(requiredOption(input, "org"));
        if (ctx.out.jsonMode) return ctx.out.json(keys.map(apiKeyJson));
        if (keys.length === 0)
          return ctx.out.line(`Organization ${describeOrganization(org)} has no API keys. Create one with: tds key create --org ${org.id}`);
        const nowMs = ctx.nowMs();
        ctx.out.table(
          ["ID", "NAME", "STATUS", "CREATED", "LAST USED", "LIMITS", "REVOKED / REPLACED"],
          keys.map((k) => [
            k.id,
            k.name ?? "",
            keyStatus(k, nowMs),
            isoTime(k.createdAtMs),
            k.lastUsedAtMs === null ? "never" : isoTime(k.lastUsedAtMs),
            describeSettings(k),
            k.revokedAtMs !== null
              ? isoTime(k.revokedAtMs)
              : k.replacedBy !== null
                ? `by ${k.replacedBy}, works until ${isoTime(k.retiresAtMs ?? k.createdAtMs)}`
                : "",
          ]),
        );
      },
    },
    {
      name: "update",
      positionals: ["KEY_ID"],
      options: {
        name: { type: "string", valueName: "NAME", description: "A new label for the key" },
        ...SETTING_OPTIONS,
        ...CLEARING_OPTIONS,
      },
      synopsis: "KEY_ID [--name NAME] [limit options] [--no-name|--no-expires|--all-models|--no-rpm|--no-budget]",
      summary: "Change an API key's name or limits (the options of tds key create; a --no- option clears one); the rest is kept",
      notFoundHint: NOT_FOUND_HINT,
      async run(ctx, input) {
        const keyId = await keyIdGiven(ctx, input.positionals[0]!);
        const name = settingOption(input, "name", "no-name", (t) => nameArgument("The key name", t));
        const changes: KeyUpdate = { ...(name === undefined ? {} : { name }), ...settingsOptions(input, true) };
        if (Object.keys(changes).length === 0)
          throw new UsageError(
            "Nothing to change: give --name, --expires, --models, --rpm or --budget-usd (or one of their --no- options)",
          );
        const { org, key } = await (await ctx.admin()).updateKey(keyId, changes);
        if (ctx.out.jsonMode) return ctx.out.json(apiKeyJson(key));
        ctx.out.line(`Updated API key ${describeKey(key)} of organization ${describeOrganization(org)}: ${describeSettings(key)}.`);
      },
    },
    {
      name: "rotate",
      positionals: ["KEY_ID"],
      options: {
        "grace-seconds": {
          type: "string",
          valueName: "N",
          description: "How long the old key keeps working, in seconds (default 86400: one day; 0: refused at once)",
        },
      },
      synopsis: "KEY_ID [--grace-seconds N]",
      summary: "Replace an API key by a new one with the same name and limits; the new key is printed once",
      notFoundHint: NOT_FOUND_HINT,
      async run(ctx, input) {
        const keyId = await keyIdGiven(ctx, input.positionals[0]!);
        const graceText = stringOption(input, "grace-seconds");
        if (graceText !== undefined && !(/^(0|[1-9][0-9]{0,7})$/.test(graceText) && Number(graceText) <= MAX_GRACE_SECONDS))
          throw new UsageError(`--grace-seconds must be a whole number of seconds from 0 to ${MAX_GRACE_SECONDS} (30 days)`);
        const grace = graceText === undefined ? undefined : Number(graceText);
        const { org, old, key, raw } = await (await ctx.admin()).rotateKey(keyId, grace).catch((err: unknown) => {
          if (err instanceof StoreConflictError)
            throw new CliError("A key with the same id already exists (very unlikely); run the command again");
          throw err;
        });
        if (ctx.out.jsonMode) return ctx.out.json(rotatedApiKeyJson(old, key, raw));
        ctx.out.line(
          `Rotated API key ${describeKey(old)} of organization ${describeOrganization(org)}: the new key is ${key.id}.`,
          `The old key keeps working until ${isoTime(old.retiresAtMs ?? old.createdAtMs)}, then gets 401.`,
        );
        printNewKey(ctx, raw);
      },
    },
    {
      name: "revoke",
      positionals: ["KEY_ID"],
      summary: "Revoke an API key: requests with it get 401 (a whole key is accepted too)",
      notFoundHint: NOT_FOUND_HINT,
      async run(ctx, input) {
        const keyId = await keyIdGiven(ctx, input.positionals[0]!);
        const { org, key, revoked } = await (await ctx.admin()).revokeKey(keyId);
        if (ctx.out.jsonMode) return ctx.out.json(apiKeyJson(key));
        const when = key.revokedAtMs === null ? "" : ` at ${isoTime(key.revokedAtMs)}`;
        ctx.out.line(
          revoked
            ? `Revoked API key ${describeKey(key)} of organization ${describeOrganization(org)}; requests with it now get 401.`
            : `API key ${describeKey(key)} was already revoked${when}.`,
        );
      },
    },
  ],
};
