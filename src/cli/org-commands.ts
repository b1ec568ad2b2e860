import { newOrganizationId } from "../gateway/api-keys.ts";
import { StoreConflictError, type Organization, type Store } from "../store/store.ts";
import { CliError, UsageError, type CommandGroup } from "./command.ts";
import { isoTime, quoted } from "./output.ts";

export const MAX_NAME_LENGTH = 100;

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

/** Finds an organization by id or unique name, or fails with exit code 1. */
export async function findOrganizationOrFail(store: Store, idOrName: string): Promise<Organization> {
  const org = await store.findOrganization(idOrName);
  if (!org) throw new CliError(`No organization with id or name ${quoted(idOrName)}. See: tds org list`);
  return org;
}

/** A name for an organization or key: trimmed, 1 to 100 characters, no control characters. */
export function checkName(label: string, raw: string): string {
  const name = raw.trim();
  if (name.length === 0) throw new UsageError(`${label} must not be empty`);
  if ([...name].length > MAX_NAME_LENGTH) throw new UsageError(`${label} must be at most ${MAX_NAME_LENGTH} characters`);
  if (/[\p{Cc}\u2028\u2029]/u.test(name)) throw new UsageError(`${label} must not contain control characters`);
  return name;
}

const ORG_ID_SHAPE = /^org_[a-z0-9]{12}$/;

async function setPaused(store: Store, idOrName: string, paused: boolean): Promise<{ org: Organization; changed: boolean }> {
  const org = await findOrganizationOrFail(store, idOrName);
  if (org.paused === paused) return { org, changed: false };
  if (!(await store.setOrganizationPaused(org.id, paused))) throw new CliError(`Organization ${describeOrganization(org)} no longer exists`);
  return { org: { ...org, paused }, changed: true };
}

export const orgCommands: CommandGroup = {
  name: "org",
  summary: "Organizations: create, list, pause, resume",
  commands: [
    {
      name: "create",
      positionals: ["NAME"],
      summary: "Create an organization (names are unique)",
      async run(ctx, input) {
        const name = checkName("The organization name", input.positionals[0]!);
        if (ORG_ID_SHAPE.test(name)) throw new UsageError("The organization name must not look like an organization id (org_ and 12 characters)");
        const store = await ctx.store();
        let org: Organization;
        try {
          org = await store.createOrganization({ id: newOrganizationId(), name, nowMs: ctx.nowMs() });
        } catch (err) {
          if (err instanceof StoreConflictError) throw new CliError(`An organization named ${quoted(name)} already exists`);
          throw err;
        }
        if (ctx.out.jsonMode) ctx.out.json(organizationJson(org));
        else ctx.out.line(`Created organization ${describeOrganization(org)}.`, `Create an API key with: tds key create --org ${org.id}`);
      },
    },
    {
      name: "list",
      positionals: [],
      summary: "List organizations, oldest first",
      async run(ctx) {
        const orgs = await (await ctx.store()).listOrganizations();
        if (ctx.out.jsonMode) return ctx.out.json(orgs.map(organizationJson));
        if (orgs.length === 0) return ctx.out.line("No organizations yet. Create one with: tds org create NAME");
        ctx.out.table(
          ["ID", "NAME", "STATUS", "CREATED"],
          orgs.map((o) => [o.id, o.name, o.paused ? "paused" : "active", isoTime(o.createdAtMs)]),
        );
      },
    },
    {
      name: "pause",
      positionals: ["ORG"],
      summary: "Pause an organization: its decision requests get 403 until resumed",
      async run(ctx, input) {
        const { org, changed } = await setPaused(await ctx.store(), input.positionals[0]!, true);
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
        const { org, changed } = await setPaused(await ctx.store(), input.positionals[0]!, false);
        if (ctx.out.jsonMode) return ctx.out.json(organizationJson(org));
        ctx.out.line(changed ? `Resumed organization ${describeOrganization(org)}.` : `Organization ${describeOrganization(org)} was not paused.`);
      },
    },
  ],
};
