import type { AdministrationStore } from "./administration.ts";
import type { BatchStore } from "./batches.ts";
import type { AccountStore, BookkeepingStore, Store } from "./store.ts";

/** What an adapter's accounts half serves: organizations and keys, their pages, and the audit log. */
export type AccountsPart = AccountStore & Pick<AdministrationStore, "listOrganizationsPage" | "listAudit">;
/**
 * What an adapter's bookkeeping half serves: the books, idempotent credit grants and usage totals; and, before the
 * store closes, the units of the service-wide preview counter it holds given back (see SharedBlock).
 */
export type BookkeepingPart = BookkeepingStore &
  Pick<AdministrationStore, "grantCreditsOnce" | "usageTotals"> & { returnHeldUnits(): Promise<void> };

/**
 * One Store from an adapter's capabilities (organizations and keys; the books; batch submissions) and its own lifecycle.
 * Every adapter composes itself here, so the method list is written once.
 */
export function composeStore<B extends Pick<Store, "dialect" | "close" | "classifyFailure" | "connectionStats">>(
  base: B,
  accounts: AccountsPart,
  books: BookkeepingPart,
  batches: BatchStore,
): B & Store {
  const closeBase = base.close.bind(base);
  const composed: AccountStore & BookkeepingStore & AdministrationStore & Pick<Store, "close" | "batches"> = {
    batches,
    async close() {
      // Not given back (the database is gone): they stay counted for their day, and the limit still holds.
      await books.returnHeldUnits().catch(() => undefined);
      return closeBase();
    },
    createOrganization: (input) => accounts.createOrganization(input),
    findOrganization: (idOrName) => accounts.findOrganization(idOrName),
    listOrganizations: () => accounts.listOrganizations(),
    countOrganizations: () => accounts.countOrganizations(),
    setOrganizationPaused: (orgId, paused, audit) => accounts.setOrganizationPaused(orgId, paused, audit),
    createApiKey: (input) => accounts.createApiKey(input),
    updateApiKey: (input) => accounts.updateApiKey(input),
    rotateApiKey: (input) => accounts.rotateApiKey(input),
    recordKeyUse: (uses) => accounts.recordKeyUse(uses),
    findApiKey: (keyId) => accounts.findApiKey(keyId),
    findApiKeyForRequest: (keyId) => accounts.findApiKeyForRequest(keyId),
    cacheKeyLookups: (ttlMs) => accounts.cacheKeyLookups(ttlMs),
    listApiKeys: (orgId) => accounts.listApiKeys(orgId),
    revokeApiKey: (keyId, nowMs, audit) => accounts.revokeApiKey(keyId, nowMs, audit),
    listOrganizationsPage: (query) => accounts.listOrganizationsPage(query),
    listAudit: (query) => accounts.listAudit(query),

    commitBatch: (batch) => books.commitBatch(batch),
    sweep: (input) => books.sweep(input),
    releaseOrphans: (input) => books.releaseOrphans(input),
    renewLease: (input) => books.renewLease(input),
    purge: (input) => books.purge(input),
    grantCredits: (input) => books.grantCredits(input),
    grantCreditsOnce: (input) => books.grantCreditsOnce(input),
    getBalance: (orgId) => books.getBalance(orgId),
    getReservation: (id) => books.getReservation(id),
    listLedger: (orgId) => books.listLedger(orgId),
    previewUsage: (orgId, day) => books.previewUsage(orgId, day),
    previewCount: (orgId, day) => books.previewCount(orgId, day),
    keySpend: (keyId, period) => books.keySpend(keyId, period),
    getUsage: (orgId, requestId) => books.getUsage(orgId, requestId),
    listUsage: (orgId, query) => books.listUsage(orgId, query),
    usageTotals: (query) => books.usageTotals(query),
  };
  return Object.assign(base, composed);
}
