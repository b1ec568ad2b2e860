import { generateApiKey, newOrganizationId } from "./gateway/api-keys.ts";
import type { Store } from "./store/store.ts";

export const DEFAULT_ORGANIZATION_NAME = "default";

/**
 * First start with an empty database: create the "default" organization and one key, and return
 * the raw key so the caller can show it once. Returns null when any organization exists.
 */
export async function bootstrapFirstKey(store: Store, nowMs: number): Promise<{ orgId: string; keyId: string; rawKey: string } | null> {
  if ((await store.countOrganizations()) > 0) return null;
  const org = await store.createOrganization({ id: newOrganizationId(), name: DEFAULT_ORGANIZATION_NAME, nowMs });
  const key = generateApiKey();
  await store.createApiKey({ id: key.id, orgId: org.id, name: "bootstrap", hash: key.hash, nowMs });
  return { orgId: org.id, keyId: key.id, rawKey: key.raw };
}
