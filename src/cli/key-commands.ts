import { apiKeyMatches, generateApiKey, keyIdOf } from "../gateway/api-keys.ts";
import { StoreConflictError, type ApiKeyRecord, type Organization } from "../store/store.ts";
import { CliError, requiredOption, stringOption, type CommandGroup } from "./command.ts";
import { checkName, describeOrganization, findOrganizationOrFail } from "./org-commands.ts";
import { isoTime, quoted } from "./output.ts";

/** A key as listed: never the hash, never the raw key. */
export interface ApiKeyJson {
  id: string;
  org_id: string;
  name: string | null;
  created_at: string;
  revoked_at: string | null;
}

/** A key just created: the raw key is in `key`, shown this once. */
export interface CreatedApiKeyJson {
  id: string;
  org_id: string;
  name: string | null;
  key: string;
  created_at: string;
}

export function apiKeyJson(key: ApiKeyRecord): ApiKeyJson {
  return {
    id: key.id,
    org_id: key.orgId,
    name: key.name,
    created_at: isoTime(key.createdAtMs),
    revoked_at: key.revokedAtMs === null ? null : isoTime(key.revokedAtMs),
  };
}

function describeKey(key: ApiKeyRecord): string {
  return key.name === null ? key.id : `${key.id} (${quoted(key.name)})`;
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
        const name = nameText === undefined ? null : checkName("The key name", nameText);
        const store = await ctx.store();
        const org: Organization = await findOrganizationOrFail(store, orgRef);
        // Only the hash is stored; the raw key exists in this process until it is printed.
        const generated = generateApiKey();
        let key: ApiKeyRecord;
        try {
          key = await store.createApiKey({ id: generated.id, orgId: org.id, name, hash: generated.hash, nowMs: ctx.nowMs() });
        } catch (err) {
          if (err instanceof StoreConflictError) throw new CliError("A key with the same id already exists (very unlikely); run the command again");
          throw err;
        }
        if (org.paused) ctx.out.note(`Note: organization ${describeOrganization(org)} is paused; requests with this key get 403 until: tds org resume ${org.id}`);
        if (ctx.out.jsonMode) {
          const created: CreatedApiKeyJson = { id: key.id, org_id: key.orgId, name: key.name, key: generated.raw, created_at: isoTime(key.createdAtMs) };
          return ctx.out.json(created);
        }
        ctx.out.line(
          `Created API key ${describeKey(key)} for organization ${describeOrganization(org)}.`,
          "",
          `    ${generated.raw}`,
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
        const store = await ctx.store();
        const org = await findOrganizationOrFail(store, requiredOption(input, "org"));
        const keys = await store.listApiKeys(org.id);
        if (ctx.out.jsonMode) return ctx.out.json(keys.map(apiKeyJson));
        if (keys.length === 0) return ctx.out.line(`Organization ${describeOrganization(org)} has no API keys. Create one with: tds key create --org ${org.id}`);
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
      async run(ctx, input) {
        const given = input.positionals[0]!;
        const store = await ctx.store();
        // A whole leaked key can be pasted instead of its id; it must be the real key, not only its id.
        const idFromRaw = keyIdOf(given);
        const found = await store.findApiKey(idFromRaw ?? given);
        if (!found || (idFromRaw !== null && !apiKeyMatches(given, found.key.hash))) {
          throw new CliError(idFromRaw === null ? `No API key with id ${quoted(given)}. See: tds key list --org ORG` : "That key is not a key of this service");
        }
        const revoked = await store.revokeApiKey(found.key.id, ctx.nowMs());
        const after = (await store.findApiKey(found.key.id))?.key ?? found.key;
        if (ctx.out.jsonMode) return ctx.out.json(apiKeyJson(after));
        const when = after.revokedAtMs === null ? "" : ` at ${isoTime(after.revokedAtMs)}`;
        ctx.out.line(
          revoked
            ? `Revoked API key ${describeKey(after)} of organization ${describeOrganization(found.org)}; requests with it now get 401.`
            : `API key ${describeKey(after)} was already revoked${when}.`,
        );
      },
    },
  ],
};
