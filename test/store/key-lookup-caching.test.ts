/**
 * A store told to keep key lookups (cacheKeyLookups), on SQLite and on PostgreSQL, beside a second store on the same
 * database (another instance, or the tds command): what the second one changes is not seen by a request's lookup
 * (findApiKeyForRequest) while it is kept, though findApiKey (the administration's) sees it; what the caching store
 * itself changes (revoke, settings, rotation, pause) is seen at once; with 0 nothing is kept.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { hashApiKey } from "../../src/domain/api-keys.ts";
import { openStore } from "../../src/store/open-store.ts";
import type { Store } from "../../src/store/store.ts";
import { createTestDatabase } from "../support/postgres-db.ts";

const dialects: { name: string; open(): Promise<{ url: string; drop(): Promise<void> }> }[] = [
  {
    name: "sqlite",
    async open() {
      const dir = mkdtempSync(join(tmpdir(), "tds-key-cache-"));
      return { url: `sqlite:${join(dir, "keys.sqlite")}`, drop: async () => rmSync(dir, { recursive: true, force: true }) };
    },
  },
  { name: "postgres", open: () => createTestDatabase("tds_key_cache") },
];

const T = 1_700_000_000_000;

async function withStores(
  dialect: (typeof dialects)[number],
  ttlMs: number,
  fn: (serving: Store, other: Store) => Promise<void>,
): Promise<void> {
  const db = await dialect.open();
  const serving = await openStore(db.url);
  const other = await openStore(db.url);
  try {
    serving.cacheKeyLookups(ttlMs);
    await other.createOrganization({ id: "org_a", name: "a", nowMs: T });
    for (const id of ["k1", "k2", "k3", "k4"]) {
      await other.createApiKey({ id, orgId: "org_a", name: null, hash: hashApiKey(`raw-${id}`), nowMs: T });
    }
    await fn(serving, other);
  } finally {
    await serving.close();
    await other.close();
    await db.drop();
  }
}

for (const dialect of dialects) {
  describe(`kept key lookups on ${dialect.name}`, () => {
    it("a change made through another store is not seen while the lookup is kept; findApiKey reads it", async () => {
      await withStores(dialect, 60_000, async (serving, other) => {
        assert.equal((await serving.findApiKeyForRequest("k1"))?.key.revokedAtMs, null);
        assert.equal(await other.revokeApiKey("k1", T + 1), true);
        assert.equal((await serving.findApiKeyForRequest("k1"))?.key.revokedAtMs, null, "kept: not read again");
        assert.equal((await serving.findApiKey("k1"))?.key.revokedAtMs, T + 1, "findApiKey reads the database");
        assert.equal(await serving.findApiKeyForRequest("k_unknown"), null);
        await other.createApiKey({ id: "k_unknown", orgId: "org_a", name: null, hash: hashApiKey("raw-new"), nowMs: T });
        assert.equal((await serving.findApiKeyForRequest("k_unknown"))?.key.id, "k_unknown", "a key not found is not kept");
      });
    });

    it("a revocation, a settings change, a rotation and a pause made through the caching store are seen at once", async () => {
      await withStores(dialect, 60_000, async (serving, other) => {
        // Each key is kept first: a rename through the other store is not seen, until the caching store changes something.
        const keptThenChanged = async (keyId: string, change: () => Promise<unknown>) => {
          assert.equal((await serving.findApiKeyForRequest(keyId))?.key.name, null);
          await other.updateApiKey({ keyId, changes: { name: `renamed-${keyId}` }, nowMs: T + 1 });
          assert.equal((await serving.findApiKeyForRequest(keyId))?.key.name, null, `${keyId} is kept`);
          await change();
          const found = await serving.findApiKeyForRequest(keyId);
          assert.equal(found?.key.name, `renamed-${keyId}`, `${keyId} is read again after the change`);
          return found!;
        };
        assert.equal((await keptThenChanged("k1", () => serving.revokeApiKey("k1", T + 2))).key.revokedAtMs, T + 2);
        const updated = await keptThenChanged("k2", () =>
          serving.updateApiKey({ keyId: "k2", changes: { requestsPerMinute: 7 }, nowMs: T + 2 }),
        );
        assert.equal(updated.key.requestsPerMinute, 7);
        const rotated = await keptThenChanged("k3", () =>
          serving.rotateApiKey({ keyId: "k3", newId: "k3b", hash: hashApiKey("raw-k3b"), nowMs: T + 3, retiresAtMs: T + 4 }),
        );
        assert.equal(rotated.key.replacedBy, "k3b");
        assert.equal((await keptThenChanged("k4", () => serving.setOrganizationPaused("org_a", true))).org.paused, true);
      });
    });

    it("keeps nothing with 0: a change made through another store is seen at once", async () => {
      await withStores(dialect, 0, async (serving, other) => {
        assert.equal((await serving.findApiKeyForRequest("k1"))?.key.revokedAtMs, null);
        await other.revokeApiKey("k1", T + 1);
        assert.equal((await serving.findApiKeyForRequest("k1"))?.key.revokedAtMs, T + 1);
      });
    });
  });
}
