import { dirname, join, resolve } from "node:path";
import { osOperator } from "./admin/operator.ts";
import { generateApiKey, newOrganizationId } from "./domain/api-keys.ts";
import type { AuditActor } from "./domain/audit.ts";
import { type PendingPrivateFile, preparePrivateFile } from "./private-files.ts";
import { StartupFailure } from "./startup/failures.ts";
import type { Store } from "./store/store.ts";

export const DEFAULT_ORGANIZATION_NAME = "default";
export const BOOTSTRAP_KEY_FILE_NAME = "bootstrap-key.txt";

export interface BootstrappedKey {
  orgId: string;
  keyId: string;
  rawKey: string;
}

/**
 * Who the audit log says made the first start's changes: a local change like the CLI's on the database (source
 * "cli"), with the client `bootstrap:` and the OS user that started the server.
 */
export function bootstrapActor(operator: string = osOperator()): AuditActor {
  return { source: "cli", client: `bootstrap:${operator}`, remoteAddress: null };
}

/**
 * First start with an empty database: create the "default" organization and one key (both in the audit log), and
 * return the raw key so the caller can show it once. Returns null when any organization exists.
 */
export async function bootstrapFirstKey(
  store: Store,
  nowMs: number,
  actor: AuditActor = bootstrapActor(),
): Promise<BootstrappedKey | null> {
  if ((await store.countOrganizations()) > 0) return null;
  const org = await store.createOrganization({ id: newOrganizationId(), name: DEFAULT_ORGANIZATION_NAME, nowMs, audit: actor });
  const key = generateApiKey();
  await store.createApiKey({ id: key.id, orgId: org.id, name: "bootstrap", hash: key.hash, nowMs, audit: actor });
  return { orgId: org.id, keyId: key.id, rawKey: key.raw };
}

/** TDS_BOOTSTRAP_KEY_FILE when set, else bootstrap-key.txt next to the SQLite file, else ./data/bootstrap-key.txt. */
export function bootstrapKeyFilePath(setting: string | null, store: Store): string {
  if (setting) return resolve(setting);
  const sqlitePath = store.dialect === "sqlite" && "path" in store && typeof store.path === "string" ? store.path : null;
  if (sqlitePath !== null && sqlitePath !== ":memory:") return join(dirname(sqlitePath), BOOTSTRAP_KEY_FILE_NAME);
  return resolve("data", BOOTSTRAP_KEY_FILE_NAME);
}

export interface KeyDelivery {
  /** The terminal to print the key on, or null: then it goes to `keyFile` (mode 0600) and never to any stream. */
  terminal: { write(text: string): unknown } | null;
  keyFile: string;
  log: { info(obj: object, msg: string): void };
  nowMs: () => number;
  /** Recorded in the audit log; default bootstrapActor(). */
  actor?: AuditActor;
}

/**
 * Bootstraps the first key and hands it over: printed on a terminal, else written to a private file with one
 * log line saying where (logs reach files and shippers; the key must not). The file is prepared before anything
 * is created, so a folder that cannot be written stops the start with nothing created.
 */
export async function bootstrapAndDeliver(store: Store, delivery: KeyDelivery): Promise<BootstrappedKey | null> {
  if ((await store.countOrganizations()) > 0) return null;
  let pending: PendingPrivateFile | null = null;
  if (!delivery.terminal) {
    try {
      pending = preparePrivateFile(delivery.keyFile);
    } catch (err) {
      throw new StartupFailure(
        `Cannot write the first API key to ${delivery.keyFile} (${(err as Error).message}); nothing was created. ` +
          `Set TDS_BOOTSTRAP_KEY_FILE to a path this user can write, or run in a terminal`,
      );
    }
  }
  const actor = delivery.actor ?? bootstrapActor();
  let created: BootstrappedKey | null;
  try {
    created = await bootstrapFirstKey(store, delivery.nowMs(), actor);
  } catch (err) {
    pending?.discard();
    throw err;
  }
  if (!created) {
    pending?.discard();
    return null;
  }
  if (!pending) {
    delivery.terminal?.write(
      `\nCreated organization "${DEFAULT_ORGANIZATION_NAME}" (${created.orgId}) and its first API key (${created.keyId}).\n` +
        `Save it now; it is not shown again:\n\n    ${created.rawKey}\n\n`,
    );
    return created;
  }
  try {
    pending.commit(`${created.rawKey}\n`);
  } catch (err) {
    await store.revokeApiKey(created.keyId, delivery.nowMs(), actor);
    throw new StartupFailure(
      `Cannot write the first API key to ${pending.path} (${(err as Error).message}); the key was revoked. ` +
        `Create one with: npx tds key create --org ${DEFAULT_ORGANIZATION_NAME}`,
    );
  }
  delivery.log.info(
    { file: pending.path, org_id: created.orgId, key_id: created.keyId },
    `Created organization "${DEFAULT_ORGANIZATION_NAME}" (${created.orgId}) and its first API key (${created.keyId}). ` +
      `The key is in ${pending.path}, readable only by this user: keep it somewhere safe, then delete the file.`,
  );
  return created;
}
