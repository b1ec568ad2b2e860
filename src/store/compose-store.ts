import type { AccountStore, BookkeepingStore, Store } from "./store.ts";

/**
 * One Store from an adapter's two capabilities (organizations and keys; the books) and its own lifecycle.
 * Every adapter composes itself here, so the method list is written once.
 */
export function composeStore<B extends Pick<Store, "dialect" | "close" | "connectionStats">>(
  base: B,
  accounts: AccountStore,
  books: BookkeepingStore,
): B & Store {
  const composed: AccountStore & BookkeepingStore = {
    createOrganization: (input) => accounts.createOrganization(input),
    findOrganization: (idOrName) => accounts.findOrganization(idOrName),
    listOrganizations: () => accounts.listOrganizations(),
    countOrganizations: () => accounts.countOrganizations(),
    setOrganizationPaused: (orgId, paused) => accounts.setOrganizationPaused(orgId, paused),
    createApiKey: (input) => accounts.createApiKey(input),
    findApiKey: (keyId) => accounts.findApiKey(keyId),
    listApiKeys: (orgId) => accounts.listApiKeys(orgId),
    revokeApiKey: (keyId, nowMs) => accounts.revokeApiKey(keyId, nowMs),

    commitBatch: (batch) => books.commitBatch(batch),
    sweep: (input) => books.sweep(input),
    purge: (input) => books.purge(input),
    grantCredits: (input) => books.grantCredits(input),
    getBalance: (orgId) => books.getBalance(orgId),
    getReservation: (id) => books.getReservation(id),
    listLedger: (orgId) => books.listLedger(orgId),
    previewUsage: (orgId, day) => books.previewUsage(orgId, day),
    getUsage: (orgId, requestId) => books.getUsage(orgId, requestId),
    listUsage: (orgId, query) => books.listUsage(orgId, query),
  };
  return Object.assign(base, composed);
}
