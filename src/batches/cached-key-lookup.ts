import type { Clock } from "../domain/clock.ts";
import type { ApiKeyRecord, Organization } from "../domain/organizations.ts";
import type { Store } from "../store/store.ts";

/** How long a batch's key and organization are reused before they are read again (a revoke or a pause shows within it). */
export const KEY_LOOKUP_TTL_MS = 1000;

/**
 * The key a batch was submitted with and its organization, read at most once a KEY_LOOKUP_TTL_MS per key: its
 * requests run in the key's name, refused as the API would refuse them once the key is revoked, expired or retired
 * or the organization paused, within the key's own limits (models, budget) as they are then. Concurrent lookups of
 * one key share one read.
 */
export function cachedKeyLookup(
  store: Pick<Store, "findApiKey">,
  clock: Clock,
): (keyId: string) => Promise<{ org: Organization; key: ApiKeyRecord } | null> {
  const cache = new Map<string, { atMs: number; found: Promise<{ org: Organization; key: ApiKeyRecord } | null> }>();
  return (keyId) => {
    const now = clock.nowMs();
    const hit = cache.get(keyId);
    if (hit && now - hit.atMs < KEY_LOOKUP_TTL_MS) return hit.found;
    if (cache.size > 1000) cache.clear();
    const found = store.findApiKey(keyId);
    cache.set(keyId, { atMs: now, found });
    // A failed read is not kept.
    found.catch(() => {
      if (cache.get(keyId)?.found === found) cache.delete(keyId);
    });
    return found;
  };
}
