/**
 * Migration 009 stores the key under which organization names are unique (nameKey) with a unique index, on SQLite
 * and on PostgreSQL: its data step fills the key of the names there were (oldest first; a later name sharing a key
 * keeps none), a new name is refused against the key holder and against keyless names (written before the rule or
 * by an earlier version) with the same messages as before, the index refuses a second row with one key, and
 * simultaneous look-alike creations let exactly one through.
 */
import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import Database from "better-sqlite3";
import pg from "pg";
import { readMigrations } from "../../src/store/migration-files.ts";
import { NAME_CANDIDATES } from "../../src/store/organization-names.ts";
import { applyPostgresMigrations, POSTGRES_MIGRATIONS_DIR, readPostgresMigrations } from "../../src/store/postgres/postgres-migrations.ts";
import { openPostgresStore } from "../../src/store/postgres/postgres-store.ts";
import { applyMigrations, SQLITE_MIGRATIONS_DIR } from "../../src/store/sqlite/migrations.ts";
import { openSqliteStore, type SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store } from "../../src/store/store.ts";
import { StoreConflictError } from "../../src/store/store-errors.ts";
import { createTestDatabase } from "../support/postgres-db.ts";

/** Organizations of a database made before 009, oldest first, and the key 009 gives each. */
const BEFORE_009: [id: string, name: string, key: string | null][] = [
  ["org_1", "Acme", "acme"],
  ["org_2", "ACME", null],
  ["org_3", "ｄｅｆａｕｌｔ", "default"],
  ["org_4", "Zürich", "zürich"],
  ["org_5", "e\u0301cole", "école"],
  ["org_6", "\u00e9cole", null],
];

const dirs: string[] = [];
after(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** A folder with the shipped migrations before 009. */
function migrationsBefore009(shipped: string): string {
  const dir = mkdtempSync(join(tmpdir(), "tds-name-keys-"));
  dirs.push(dir);
  for (const file of readdirSync(shipped).filter((f) => /^00[1-8]_.*\.sql$/.test(f))) copyFileSync(join(shipped, file), join(dir, file));
  return dir;
}

const insertSql = (rows: [string, string][], at: number, paused: string) =>
  `INSERT INTO organizations (id, name, paused, created_at_ms) VALUES ${rows.map(([id, name], i) => `('${id}', '${name}', ${paused}, ${at + i})`).join(", ")}`;

interface Opened {
  store: Store;
  /** Runs SQL as an earlier version of the service would. */
  exec(sql: string): Promise<void>;
  keys(): Promise<Record<string, string | null>>;
  close(): Promise<void>;
}

const dialects: { name: string; open(): Promise<Opened> }[] = [
  {
    name: "sqlite",
    async open() {
      const file = join(migrationsBefore009(SQLITE_MIGRATIONS_DIR), "store.sqlite");
      const old = new Database(file);
      applyMigrations(old, readMigrations(migrationsBefore009(SQLITE_MIGRATIONS_DIR)));
      old.exec(
        insertSql(
          BEFORE_009.map(([id, name]) => [id, name]),
          1,
          "0",
        ),
      );
      old.close();
      const store: SqliteStore = openSqliteStore(file);
      return {
        store,
        exec: async (sql) => void store.db.exec(sql),
        keys: async () =>
          Object.fromEntries(store.db.prepare<[], [string, string | null]>("SELECT id, name_key FROM organizations").raw().all()),
        close: () => store.close(),
      };
    },
  },
  {
    name: "postgres",
    async open() {
      const db = await createTestDatabase("tds_name_keys");
      const client = new pg.Client({ connectionString: db.url });
      await client.connect();
      await applyPostgresMigrations(client, readPostgresMigrations(migrationsBefore009(POSTGRES_MIGRATIONS_DIR)));
      await client.query(
        insertSql(
          BEFORE_009.map(([id, name]) => [id, name]),
          1,
          "false",
        ),
      );
      const store = await openPostgresStore(db.url);
      assert.deepEqual(store.migrations.applied[0], { version: 9, name: "organization_name_keys" });
      return {
        store,
        exec: async (sql) => void (await client.query(sql)),
        keys: async () =>
          Object.fromEntries(
            (await client.query<{ id: string; name_key: string | null }>("SELECT id, name_key FROM organizations")).rows.map((r) => [
              r.id,
              r.name_key,
            ]),
          ),
        async close() {
          await client.end();
          await store.close();
          await db.drop();
        },
      };
    },
  },
];

const taken = (existing: string, caseOnly = true) =>
  `An organization named ${JSON.stringify(existing)} already exists${caseOnly ? " (names are unique regardless of case)" : ""}`;

for (const dialect of dialects) {
  describe(`organization name keys on ${dialect.name}`, () => {
    it("009 fills the keys of the names there were, oldest first; a later name sharing a key keeps none", async () => {
      const db = await dialect.open();
      try {
        assert.deepEqual(await db.keys(), Object.fromEntries(BEFORE_009.map(([id, , key]) => [id, key])));
        assert.deepEqual(
          (await db.store.listOrganizations()).map((o) => o.name),
          BEFORE_009.map(([, name]) => name),
        );
        assert.equal((await db.store.findOrganization("ACME"))?.id, "org_2", "lookups by name stay exact");
      } finally {
        await db.close();
      }
    });

    it("refuses a new name against the key holder and keyless names, with the same messages; stores the key of a new one", async () => {
      const db = await dialect.open();
      try {
        const refused = async (name: string, message: string) => {
          await assert.rejects(db.store.createOrganization({ id: `org_${name}`, name, nowMs: 100 }), (err: unknown) => {
            assert.ok(err instanceof StoreConflictError);
            assert.equal(err.message, message);
            return true;
          });
        };
        await refused("aCmE", taken("Acme"));
        await refused("ACME", taken("Acme"));
        await refused("Acme", taken("Acme", false));
        await refused("DEFAULT", taken("ｄｅｆａｕｌｔ"));
        await refused("ÉCOLE", taken("e\u0301cole"));
        // A name written without a key, as by an earlier version of the service.
        await db.exec(insertSql([["org_legacy", "Gamma"]], 50, dialect.name === "sqlite" ? "0" : "false"));
        await refused("ＧＡＭＭＡ", taken("Gamma"));
        await db.store.createOrganization({ id: "org_beta", name: "Beta", nowMs: 200 });
        assert.equal((await db.keys()).org_beta, "beta");
        await assert.rejects(db.exec("UPDATE organizations SET name_key = 'beta' WHERE id = 'org_legacy'"), /unique/i);
        await assert.rejects(db.store.createOrganization({ id: "org_beta", name: "Delta", nowMs: 300 }), {
          message: 'An organization with id "org_beta" already exists',
        });
      } finally {
        await db.close();
      }
    });

    it("lets exactly one of simultaneous look-alike creations through; the others name it", async () => {
      const db = await dialect.open();
      try {
        const names = ["Omega", "OMEGA", "omega", "ＯＭＥＧＡ", "oMeGa", "Omega"];
        const results = await Promise.allSettled(
          names.map((name, i) => db.store.createOrganization({ id: `org_o${i}`, name, nowMs: 400 })),
        );
        const created = results.flatMap((r) => (r.status === "fulfilled" ? [r.value.name] : []));
        assert.equal(created.length, 1);
        for (const [i, r] of results.entries()) {
          if (r.status === "fulfilled") continue;
          assert.ok(r.reason instanceof StoreConflictError, String(r.reason));
          assert.equal(r.reason.message, taken(created[0]!, created[0] !== names[i]));
        }
      } finally {
        await db.close();
      }
    });
  });
}

describe("the name check on sqlite", () => {
  it("reads the key holder and the keyless names through organizations_by_name_key, not by a scan", async () => {
    const store = openSqliteStore(":memory:");
    try {
      const plan = store.db.prepare(`EXPLAIN QUERY PLAN ${NAME_CANDIDATES}`).all("acme") as { detail: string }[];
      const details = plan.map((p) => p.detail).join("\n");
      assert.match(details, /organizations_by_name_key/);
      assert.doesNotMatch(details, /SCAN organizations\b(?! USING)/);
    } finally {
      await store.close();
    }
  });
});
