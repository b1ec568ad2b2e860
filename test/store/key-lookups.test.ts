/**
 * The key lookups of one event-loop turn share statements of 1, 2, 4 … 256 ids (a list padded to a power of two, a
 * longer one in several): on SQLite and on PostgreSQL, 300 lookups at once, of keys that exist and keys that do not,
 * each get their own key and organization.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { hashApiKey } from "../../src/domain/api-keys.ts";
import { openPostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";
import { createTestDatabase } from "../support/postgres-db.ts";

const dialects: { name: string; open(): Promise<{ store: Store; close(): Promise<void> }> }[] = [
  {
    name: "sqlite",
    async open() {
      const store = openSqliteStore(":memory:");
      return { store, close: () => store.close() };
    },
  },
  {
    name: "postgres",
    async open() {
      const db = await createTestDatabase("tds_key_lookups");
      const store = await openPostgresStore(db.url);
      return {
        store,
        async close() {
          await store.close();
          await db.drop();
        },
      };
    },
  },
];

for (const dialect of dialects) {
  describe(`key lookups on ${dialect.name}`, () => {
    it("answers 300 lookups of one turn, each with its own key and organization, and null for unknown keys", async () => {
      const { store, close } = await dialect.open();
      try {
        for (const org of ["org_a", "org_b"]) await store.createOrganization({ id: org, name: org, nowMs: 1 });
        await store.setOrganizationPaused("org_b", true);
        for (let i = 0; i < 250; i++) {
          await store.createApiKey({ id: `k${i}`, orgId: i % 2 ? "org_b" : "org_a", name: null, hash: hashApiKey(`raw-${i}`), nowMs: 2 });
        }
        const ids = Array.from({ length: 300 }, (_, i) => `k${299 - i}`);
        const found = await Promise.all(ids.map((id) => store.findApiKey(id)));
        for (const [i, id] of ids.entries()) {
          const n = Number(id.slice(1));
          if (n >= 250) {
            assert.equal(found[i], null, id);
            continue;
          }
          assert.equal(found[i]?.key.id, id);
          assert.deepEqual(found[i]?.org, {
            id: n % 2 ? "org_b" : "org_a",
            name: n % 2 ? "org_b" : "org_a",
            paused: n % 2 === 1,
            createdAtMs: 1,
          });
        }
        assert.deepEqual(
          (await Promise.all(["k3", "k3", "nope"].map((id) => store.findApiKey(id)))).map((f) => f?.key.id ?? null),
          ["k3", "k3", null],
        );
      } finally {
        await close();
      }
    });
  });
}
