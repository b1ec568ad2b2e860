/**
 * A key's own settings in the accounts store, on SQLite and on PostgreSQL (a fresh database on the test server,
 * TDS_TEST_POSTGRES_URL; skipped with TDS_SKIP_POSTGRES=1): the round trip of every setting, updates (absent kept,
 * null clears, audited), rotation in one transaction (all or nothing, once), and last use that never moves back.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { keyStatus } from "../../src/admin/key-status.ts";
import { StoreAdministration } from "../../src/admin/store-administration.ts";
import { hashApiKey } from "../../src/domain/api-keys.ts";
import type { AuditActor } from "../../src/domain/audit.ts";
import type { KeySettings } from "../../src/domain/organizations.ts";
import { openStore } from "../../src/store/open-store.ts";
import type { Store } from "../../src/store/store.ts";
import { StoreConflictError, StoreInputError } from "../../src/store/store-errors.ts";
import { createTestDatabase } from "../support/postgres-db.ts";

const T0 = 1_767_225_600_000;
const CLI: AuditActor = { source: "cli", client: "tester", remoteAddress: null };
const SETTINGS: KeySettings = {
  expiresAtMs: T0 + 86_400_000,
  models: ["decider", "helper"],
  requestsPerMinute: 42,
  budget: { limitMicrousd: 12_500_000, period: "month" },
};

interface Backend {
  name: string;
  open(): Promise<{ store: Store; close(): Promise<void> }>;
}

const backends: Backend[] = [
  {
    name: "SQLite",
    async open() {
      const dir = mkdtempSync(join(tmpdir(), "tds-key-settings-"));
      const store = await openStore(`sqlite:${join(dir, "tds.sqlite")}`);
      return {
        store,
        close: async () => {
          await store.close();
          rmSync(dir, { recursive: true, force: true });
        },
      };
    },
  },
  ...(process.env.TDS_SKIP_POSTGRES === "1"
    ? []
    : [
        {
          name: "PostgreSQL",
          async open() {
            const db = await createTestDatabase("tds_keyset");
            const store = await openStore(db.url);
            return {
              store,
              close: async () => {
                await store.close();
                await db.drop();
              },
            };
          },
        },
      ]),
];

for (const backend of backends) {
  describe(`key settings in the store (${backend.name})`, () => {
    let store: Store;
    let close: () => Promise<void>;
    let n = 0;
    before(async () => {
      ({ store, close } = await backend.open());
      await store.createOrganization({ id: "org_a", name: "Acme", nowMs: T0 });
    });
    after(async () => close?.());

    const key = (settings?: KeySettings, name: string | null = "k") => {
      const id = `key_${++n}`;
      return store.createApiKey({
        id,
        orgId: "org_a",
        name,
        hash: hashApiKey(`raw-${id}`),
        nowMs: T0 + n,
        ...(settings ? { settings } : {}),
      });
    };
    const auditOf = async (targetId: string) =>
      (await store.listAudit({ orgId: "org_a", limit: 100 })).entries.filter((e) => e.targetId === targetId);

    it("every setting round-trips through create, find and list; none by default", async () => {
      const created = await key(SETTINGS);
      assert.deepEqual(
        { ...created, hash: undefined },
        {
          id: created.id,
          orgId: "org_a",
          name: "k",
          hash: undefined,
          createdAtMs: created.createdAtMs,
          revokedAtMs: null,
          ...SETTINGS,
          lineageId: created.id,
          replacedBy: null,
          retiresAtMs: null,
          lastUsedAtMs: null,
        },
      );
      assert.deepEqual((await store.findApiKey(created.id))?.key, created);
      assert.deepEqual(
        (await store.listApiKeys("org_a")).find((k) => k.id === created.id),
        created,
      );
      const plain = await key();
      assert.deepEqual(
        [plain.expiresAtMs, plain.models, plain.requestsPerMinute, plain.budget, plain.replacedBy, plain.retiresAtMs, plain.lastUsedAtMs],
        [null, null, null, null, null, null, null],
      );
      assert.deepEqual((await store.findApiKey(plain.id))?.key, plain);
    });

    it("settings of a wrong shape are a StoreInputError, and nothing is written", async () => {
      const bad: unknown[] = [
        { ...SETTINGS, models: [] },
        { ...SETTINGS, models: ["a", "a"] },
        { ...SETTINGS, requestsPerMinute: 0 },
        { ...SETTINGS, budget: { limitMicrousd: -1, period: "day" } },
        { ...SETTINGS, budget: { limitMicrousd: 1, period: "week" } },
        { ...SETTINGS, expiresAtMs: 1.5 },
      ];
      const before = (await store.listApiKeys("org_a")).length;
      for (const settings of bad) await assert.rejects(key(settings as KeySettings), StoreInputError, JSON.stringify(settings));
      assert.equal((await store.listApiKeys("org_a")).length, before);
    });

    it("an update changes what is given, keeps what is absent, clears with null, and records the changed fields", async () => {
      const k = await key(SETTINGS, "app");
      const updated = await store.updateApiKey({
        keyId: k.id,
        changes: { requestsPerMinute: 7, budget: null, name: "renamed" },
        nowMs: T0 + 100,
        audit: CLI,
      });
      assert.deepEqual(updated, { ...k, requestsPerMinute: 7, budget: null, name: "renamed" });
      assert.deepEqual((await store.findApiKey(k.id))?.key, updated);
      const same = await store.updateApiKey({ keyId: k.id, changes: { requestsPerMinute: 7 }, nowMs: T0 + 101, audit: CLI });
      assert.deepEqual(same, updated, "no change");
      const entries = await auditOf(k.id);
      assert.deepEqual(
        entries.filter((e) => e.action === "key.updated").map((e) => e.details),
        [{ name: "renamed", requests_per_minute: 7, budget_microusd: null, budget_period: null }],
        "one entry: the update that changed nothing records nothing",
      );
      assert.equal(await store.updateApiKey({ keyId: "key_missing", changes: { requestsPerMinute: 1 }, nowMs: T0 }), null);
      await assert.rejects(store.updateApiKey({ keyId: k.id, changes: { requestsPerMinute: -3 }, nowMs: T0 }), StoreInputError);
      await store.revokeApiKey(k.id, T0 + 200);
      await assert.rejects(store.updateApiKey({ keyId: k.id, changes: { requestsPerMinute: 1 }, nowMs: T0 + 300 }), StoreConflictError);
    });

    it("a rotation makes the new key with the same organization, name and settings, and retires the old one, once", async () => {
      const old = await key(SETTINGS, "rotating");
      const rotated = await store.rotateApiKey({
        keyId: old.id,
        newId: "key_new",
        hash: hashApiKey("raw-new"),
        nowMs: T0 + 1000,
        retiresAtMs: T0 + 5000,
        audit: CLI,
      });
      assert.ok(rotated);
      assert.deepEqual(rotated.old, { ...old, replacedBy: "key_new", retiresAtMs: T0 + 5000 });
      assert.deepEqual(rotated.created, {
        ...old,
        id: "key_new",
        hash: hashApiKey("raw-new"),
        createdAtMs: T0 + 1000,
        lineageId: old.id,
      });
      assert.deepEqual((await store.findApiKey(old.id))?.key, rotated.old);
      assert.deepEqual((await store.findApiKey("key_new"))?.key, rotated.created);
      assert.deepEqual(
        (await auditOf(old.id)).filter((e) => e.action === "key.rotated").map((e) => e.details),
        [{ name: "rotating", new_key_id: "key_new", retires_at: new Date(T0 + 5000).toISOString() }],
      );
      const again = { keyId: old.id, newId: "key_new2", hash: hashApiKey("raw-new2"), nowMs: T0 + 2000, retiresAtMs: T0 + 2000 };
      await assert.rejects(store.rotateApiKey(again), StoreConflictError, "already rotated");
      assert.equal(await store.findApiKey("key_new2"), null);
      assert.equal(await store.rotateApiKey({ ...again, keyId: "key_missing" }), null);
      const revoked = await key();
      await store.revokeApiKey(revoked.id, T0);
      await assert.rejects(store.rotateApiKey({ ...again, keyId: revoked.id }), StoreConflictError, "revoked");
      await assert.rejects(store.rotateApiKey({ ...again, keyId: revoked.id, retiresAtMs: T0 }), StoreInputError, "retires before now");
    });

    it("a rotation whose new key cannot be written changes nothing (one transaction)", async () => {
      const old = await key(SETTINGS);
      const taken = await key();
      await assert.rejects(
        store.rotateApiKey({
          keyId: old.id,
          newId: taken.id,
          hash: hashApiKey("raw-fresh"),
          nowMs: T0 + 10,
          retiresAtMs: T0 + 20,
          audit: CLI,
        }),
        StoreConflictError,
      );
      await assert.rejects(
        store.rotateApiKey({ keyId: old.id, newId: "key_fresh", hash: taken.hash, nowMs: T0 + 10, retiresAtMs: T0 + 20, audit: CLI }),
        StoreConflictError,
      );
      assert.deepEqual((await store.findApiKey(old.id))?.key, old, "not marked replaced");
      assert.equal(await store.findApiKey("key_fresh"), null);
      assert.deepEqual(await auditOf(old.id).then((es) => es.filter((e) => e.action === "key.rotated")), []);
    });

    it("concurrent rotations of one key: exactly one succeeds", async () => {
      const old = await key();
      const results = await Promise.allSettled(
        Array.from({ length: 6 }, (_, i) =>
          store.rotateApiKey({ keyId: old.id, newId: `key_race_${i}`, hash: hashApiKey(`race-${i}`), nowMs: T0, retiresAtMs: T0 + 1 }),
        ),
      );
      const won = results.filter((r) => r.status === "fulfilled");
      assert.equal(won.length, 1, JSON.stringify(results.map((r) => r.status)));
      assert.ok(results.every((r) => r.status === "fulfilled" || r.reason instanceof StoreConflictError));
      const winner = (won[0] as PromiseFulfilledResult<Awaited<ReturnType<Store["rotateApiKey"]>>>).value!;
      assert.equal((await store.findApiKey(old.id))?.key.replacedBy, winner.created.id);
      const made = (await store.listApiKeys("org_a")).filter((k) => k.id.startsWith("key_race_"));
      assert.deepEqual(
        made.map((k) => k.id),
        [winner.created.id],
      );
    });

    it("a rotation also records key.created for the new key (rotated_from, its settings), in the same transaction", async () => {
      const old = await store.createApiKey({
        id: `key_${++n}`,
        orgId: "org_a",
        name: "audited",
        hash: hashApiKey(`raw-a${n}`),
        nowMs: T0,
        settings: SETTINGS,
        audit: CLI,
      });
      const newId = `key_audited_${n}`;
      await store.rotateApiKey({
        keyId: old.id,
        newId,
        hash: hashApiKey(`raw-${newId}`),
        nowMs: T0 + 3000,
        retiresAtMs: T0 + 4000,
        audit: CLI,
      });
      const created = await auditOf(newId);
      assert.deepEqual(
        created.map((e) => [e.action, e.atMs, { source: e.source, client: e.client, remoteAddress: e.remoteAddress }, e.details]),
        [
          [
            "key.created",
            T0 + 3000,
            CLI,
            {
              name: "audited",
              rotated_from: old.id,
              expires_at: new Date(SETTINGS.expiresAtMs!).toISOString(),
              models: JSON.stringify(SETTINGS.models),
              requests_per_minute: 42,
              budget_microusd: 12_500_000,
              budget_period: "month",
            },
          ],
        ],
      );
      assert.deepEqual(
        (await auditOf(old.id)).map((e) => e.action),
        ["key.rotated", "key.created"],
        "newest first: the old key's creation, then its rotation",
      );
    });

    it("an expired key is not rotated: StoreConflictError, nothing written", async () => {
      const expiring = await key({ ...SETTINGS, expiresAtMs: T0 + 500 }, "expired");
      assert.deepEqual(await auditOf(expiring.id), []);
      const rotation = { keyId: expiring.id, newId: `key_after_${n}`, hash: hashApiKey(`after-${n}`), retiresAtMs: T0 + 9000, audit: CLI };
      await assert.rejects(store.rotateApiKey({ ...rotation, nowMs: T0 + 500 }), (err: unknown) => {
        assert.ok(err instanceof StoreConflictError);
        assert.match(err.message, /has expired/);
        return true;
      });
      assert.deepEqual((await store.findApiKey(expiring.id))?.key, expiring, "not marked replaced");
      assert.equal(await store.findApiKey(rotation.newId), null);
      assert.deepEqual(await auditOf(expiring.id), []);
      const rotated = await store.rotateApiKey({ ...rotation, nowMs: T0 + 499 });
      assert.equal(rotated?.old.replacedBy, rotation.newId, "a moment before its expiry it is rotated");
    });

    it("a rotated key is not updated (StoreConflictError, nothing written) but can be revoked", async () => {
      const old = await key(SETTINGS, "replaced");
      const newId = `key_replacing_${n}`;
      await store.rotateApiKey({ keyId: old.id, newId, hash: hashApiKey(`raw-${newId}`), nowMs: T0 + 10, retiresAtMs: T0 + 99_000 });
      const before = (await store.findApiKey(old.id))?.key;
      await assert.rejects(
        store.updateApiKey({ keyId: old.id, changes: { requestsPerMinute: 1 }, nowMs: T0 + 20, audit: CLI }),
        (err: unknown) => {
          assert.ok(err instanceof StoreConflictError);
          assert.match(err.message, new RegExp(`was rotated \\(replaced by "${newId}"\\)`));
          return true;
        },
      );
      assert.deepEqual((await store.findApiKey(old.id))?.key, before, "nothing changed");
      assert.deepEqual(await auditOf(old.id), [], "no key.updated");
      assert.equal(await store.revokeApiKey(old.id, T0 + 30, CLI), true);
    });

    it("an organization's counts: active keys are those that work (StoreAdministration, by keyStatus)", async () => {
      await store.createOrganization({ id: "org_counts", name: "Counts", nowMs: T0 });
      const make = (id: string, expiresAtMs: number | null = null) =>
        store.createApiKey({
          id,
          orgId: "org_counts",
          name: null,
          hash: hashApiKey(`raw-${id}`),
          nowMs: T0,
          settings: { expiresAtMs, models: null, requestsPerMinute: null, budget: null },
        });
      const now = T0 + 10_000;
      await make("kc_active");
      await make("kc_expired", now);
      await make("kc_later", now + 1);
      await make("kc_retired");
      await store.rotateApiKey({ keyId: "kc_retired", newId: "kc_retired_new", hash: hashApiKey("kc-rn"), nowMs: T0, retiresAtMs: now });
      await make("kc_grace");
      await store.rotateApiKey({ keyId: "kc_grace", newId: "kc_grace_new", hash: hashApiKey("kc-gn"), nowMs: T0, retiresAtMs: now + 1 });
      await make("kc_revoked");
      await store.revokeApiKey("kc_revoked", T0);
      const admin = new StoreAdministration({ store, previewRequestLimit: 10, nowMs: () => now, actor: CLI });
      const org = await store.findOrganization("org_counts");
      // Working: kc_active, kc_later, kc_retired_new, kc_grace (within its grace), kc_grace_new.
      assert.deepEqual((await admin.status(org!)).keys, { active: 5, revoked: 1 });
      assert.deepEqual(
        (await store.listApiKeys("org_counts")).map((k) => [k.id, keyStatus(k, now)]),
        [
          ["kc_active", "active"],
          ["kc_expired", "expired"],
          ["kc_grace", "rotated"],
          ["kc_grace_new", "active"],
          ["kc_later", "active"],
          ["kc_retired", "retired"],
          ["kc_retired_new", "active"],
          ["kc_revoked", "revoked"],
        ],
      );
    });

    it("last use moves forward only, for many keys at once; unknown keys are skipped", async () => {
      const [a, b] = [await key(), await key()];
      await store.recordKeyUse([
        { keyId: a.id, atMs: T0 + 10 },
        { keyId: b.id, atMs: T0 + 5 },
        { keyId: a.id, atMs: T0 + 30 },
        { keyId: "key_unknown", atMs: T0 + 50 },
      ]);
      assert.equal((await store.findApiKey(a.id))?.key.lastUsedAtMs, T0 + 30, "the latest of the batch");
      assert.equal((await store.findApiKey(b.id))?.key.lastUsedAtMs, T0 + 5);
      await store.recordKeyUse([
        { keyId: a.id, atMs: T0 + 20 },
        { keyId: b.id, atMs: T0 + 40 },
      ]);
      assert.equal((await store.findApiKey(a.id))?.key.lastUsedAtMs, T0 + 30, "never back");
      assert.equal((await store.findApiKey(b.id))?.key.lastUsedAtMs, T0 + 40);
      await Promise.all([store.recordKeyUse([{ keyId: a.id, atMs: T0 + 100 }]), store.recordKeyUse([{ keyId: a.id, atMs: T0 + 90 }])]);
      assert.equal((await store.findApiKey(a.id))?.key.lastUsedAtMs, T0 + 100, "concurrent writers: the latest wins");
      await store.recordKeyUse([]);
      await assert.rejects(store.recordKeyUse([{ keyId: a.id, atMs: -1 }]), StoreInputError);
      assert.deepEqual((await store.listApiKeys("org_a")).find((k) => k.id === a.id)?.lastUsedAtMs, T0 + 100);
    });
  });
}
