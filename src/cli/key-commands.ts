import { apiKeyJson } from "../admin/admin-json.ts";
import type { ApiKeyInfo } from "../admin/operations.ts";
import type { CreatedApiKey } from "../contract/admin.ts";
import { apiKeyMatches, keyIdOf } from "../domain/api-keys.ts";
import { StoreConflictError } from "../store/store-errors.ts";
import { CliError, type CommandContext, type CommandGroup, nameArgument, requiredOption, stringOption } from "./command.ts";
import { describeOrganization } from "./org-commands.ts";
import { isoTime, quoted } from "./output.ts";

function describeKey(key: ApiKeyInfo): string {
  return key.name === null ? key.id : `${key.id} (${quoted(key.name)})`;
}

const NOT_FOUND_HINT = "See: tds key list --org ORG";

/**
 * The key id of KEY_ID or of a whole key. On the database a whole key must be really one of ours (its hash matches),
 * not only shaped like one; the admin API takes ids only, so over HTTP only the id is sent (never the key).
 */
async function keyIdToRevoke(ctx: CommandContext, given: string): Promise<string> {
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
  summary: "API keys: create, list, revoke",
  commands: [
    {
      name: "create",
      positionals: [],
      options: {
        org: { type: "string", valueName: "ORG", description: "Organization id or name (required)" },
        name: { type: "string", valueName: "NAME", description: "A label for the key, such as where it is used" },
      },
      synopsis: "--org ORG [--name NAME]",
      summary: "Create an API key; the key is printed once and cannot be shown again",
      async run(ctx, input) {
        const orgRef = requiredOption(input, "org");
        const nameText = stringOption(input, "name");
        const name = nameText === undefined ? null : nameArgument("The key name", nameText);
        // Only the hash is stored; the key itself exists here until it is printed.
        const { org, key, raw } = await (await ctx.admin()).createKey(orgRef, name).catch((err: unknown) => {
          if (err instanceof StoreConflictError)
            throw new CliError("A key with the same id already exists (very unlikely); run the command again");
          throw err;
        });
        if (org.paused)
          ctx.out.note(
            `Note: organization ${describeOrganization(org)} is paused; requests with this key get 403 until: tds org resume ${org.id}`,
          );
        if (ctx.out.jsonMode) {
          const created: CreatedApiKey = { id: key.id, org_id: key.orgId, name: key.name, key: raw, created_at: isoTime(key.createdAtMs) };
          return ctx.out.json(created);
        }
        ctx.out.line(
          `Created API key ${describeKey(key)} for organization ${describeOrganization(org)}.`,
          "",
          `    ${raw}`,
          "",
          "Copy this key now: it cannot be shown again (only its hash is stored).",
          "Send it as: Authorization: Bearer <key>",
        );
      },
    },
    {
      name: "list",
      positionals: [],
      options: {
        org: { type: "string", valueName: "ORG", description: "Organization id or name (required)" },
      },
      synopsis: "--org ORG",
      summary: "List an organization's API keys (ids and names; keys cannot be shown)",
      async run(ctx, input) {
        const { org, keys } = await (await ctx.admin()).listKeys(requiredOption(input, "org"));
        if (ctx.out.jsonMode) return ctx.out.json(keys.map(apiKeyJson));
        if (keys.length === 0)
          return ctx.out.line(`Organization ${describeOrganization(org)} has no API keys. Create one with: tds key create --org ${org.id}`);
        ctx.out.table(
          ["ID", "NAME", "STATUS", "CREATED", "REVOKED"],
          keys.map((k) => [
            k.id,
            k.name ?? "",
            k.revokedAtMs === null ? "active" : "revoked",
            isoTime(k.createdAtMs),
            k.revokedAtMs === null ? "" : isoTime(k.revokedAtMs),
          ]),
        );
      },
    },
    {
      name: "revoke",
      positionals: ["KEY_ID"],
      summary: "Revoke an API key: requests with it get 401 (a whole key is accepted too)",
      notFoundHint: NOT_FOUND_HINT,
      async run(ctx, input) {
        const keyId = await keyIdToRevoke(ctx, input.positionals[0]!);
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
