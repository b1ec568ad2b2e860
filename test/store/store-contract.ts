/**
 * The Store contract: every adapter (SQLite now, PostgreSQL later) runs this suite unchanged.
 *
 *   describeStoreContract("sqlite (temp file)", async () => openSqliteStore(tempFile()));
 *
 * `makeStore` is called once per test and must return a new, empty store; the suite closes it.
 * Request ids in ordering tests use only [a-z0-9_], so any collation sorts them like JavaScript does.
 */
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";
import fc from "fast-check";
import { hashApiKey } from "../../src/gateway/api-keys.ts";
import { StoreInputError } from "../../src/store/store-errors.ts";
import { StoreConflictError, type Store, type UsageOutcome, type UsageQuery, type UsageRecord } from "../../src/store/store.ts";

const OUTCOMES: UsageOutcome[] = ["succeeded", "model_error", "context_rejected", "reservation_expired"];
const T0 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

export function usageRecord(overrides: Partial<UsageRecord> & Pick<UsageRecord, "requestId" | "orgId">): UsageRecord {
  return {
    keyId: "key_1",
    createdAtMs: T0,
    source: "api",
    model: "jev-1",
    mode: "paid",
    outcome: "succeeded",
    httpStatus: 200,
    inputTokens: 120,
    outputTokens: 7,
    costMicrousd: 60,
    latencyMs: 12.5,
    gatewayLatencyMs: 14.25,
    errorDetail: null,
    overReservation: false,
    ...overrides,
  };
}

/** Newest first, ties by request id descending: the order listUsage promises. */
function newestFirst(a: UsageRecord, b: UsageRecord): number {
  if (a.createdAtMs !== b.createdAtMs) return b.createdAtMs - a.createdAtMs;
  return a.requestId < b.requestId ? 1 : a.requestId > b.requestId ? -1 : 0;
}

/** Follows nextCursor to the end; fails if a page is over-full or paging does not end. */
async function listAll(store: Store, orgId: string, query: Omit<UsageQuery, "cursor">): Promise<{ records: UsageRecord[]; pages: number }> {
  const records: UsageRecord[] = [];
  let cursor: string | undefined;
  for (let pages = 1; pages <= 1000; pages++) {
    const page = await store.listUsage(orgId, { ...query, ...(cursor === undefined ? {} : { cursor }) });
    assert.ok(page.records.length <= query.limit, "a page never holds more than limit records");
    records.push(...page.records);
    if (page.nextCursor === null) return { records, pages };
    assert.equal(typeof page.nextCursor, "string");
    assert.equal(page.records.length, query.limit, "a page followed by more is full");
    cursor = page.nextCursor;
  }
  throw new Error("paging did not end");
}

function ids(records: UsageRecord[]): string[] {
  return records.map((r) => r.requestId);
}

export function describeStoreContract(name: string, makeStore: () => Promise<Store>): void {
  describe(`Store contract: ${name}`, () => {
    let store: Store;
    let clock = T0;
    const now = () => (clock += 1000);

    beforeEach(async () => {
      store = await makeStore();
      clock = T0;
    });
    afterEach(async () => {
      await store.close();
    });

    async function org(id: string, orgName = `name of ${id}`) {
      return store.createOrganization({ id, name: orgName, nowMs: now() });
    }

    async function key(id: string, orgId: string, keyName: string | null = null) {
      return store.createApiKey({ id, orgId, name: keyName, hash: hashApiKey(`raw-${id}`), nowMs: now() });
    }

    describe("organizations", () => {
      it("an empty store has no organizations", async () => {
        assert.deepEqual(await store.listOrganizations(), []);
        assert.equal(await store.countOrganizations(), 0);
        assert.equal(await store.findOrganization("org_missing"), null);
        assert.equal(store.dialect === "sqlite" || store.dialect === "postgres", true);
      });

      it("creates an organization and finds it by id and by name", async () => {
        const created = await store.createOrganization({ id: "org_a", name: "Acme", nowMs: T0 + 5 });
        assert.deepEqual(created, { id: "org_a", name: "Acme", paused: false, createdAtMs: T0 + 5 });
        assert.deepEqual(await store.findOrganization("org_a"), created);
        assert.deepEqual(await store.findOrganization("Acme"), created);
        assert.equal(await store.findOrganization("acme"), null, "names match exactly");
        assert.equal(await store.findOrganization("Acme "), null);
        assert.equal(await store.findOrganization(""), null);
      });

      it("lists organizations in creation order and counts them", async () => {
        const a = await org("org_b", "Beta");
        const b = await org("org_a", "Alpha");
        const c = await org("org_c", "Gamma");
        assert.deepEqual(await store.listOrganizations(), [a, b, c]);
        assert.equal(await store.countOrganizations(), 3);
      });

      it("rejects a duplicate name with StoreConflictError and keeps the first", async () => {
        const first = await org("org_1", "Acme");
        await assert.rejects(store.createOrganization({ id: "org_2", name: "Acme", nowMs: now() }), StoreConflictError);
        assert.deepEqual(await store.findOrganization("Acme"), first);
        assert.equal(await store.findOrganization("org_2"), null);
        assert.equal(await store.countOrganizations(), 1);
      });

      it("rejects a duplicate id with StoreConflictError", async () => {
        await org("org_1", "Acme");
        await assert.rejects(store.createOrganization({ id: "org_1", name: "Other", nowMs: now() }), StoreConflictError);
        assert.equal(await store.findOrganization("Other"), null);
      });

      it("prefers an id match when a name equals another organization's id", async () => {
        const a = await org("org_x", "Plain");
        const b = await org("org_y", "org_x");
        assert.deepEqual(await store.findOrganization("org_x"), a);
        assert.deepEqual(await store.findOrganization("org_y"), b);
      });

      it("pauses and resumes; an unknown organization gives false", async () => {
        const a = await org("org_a");
        const b = await org("org_b");
        assert.equal(await store.setOrganizationPaused("org_a", true), true);
        assert.equal((await store.findOrganization("org_a"))?.paused, true);
        assert.equal((await store.findOrganization("org_b"))?.paused, false, "only that organization");
        assert.equal(await store.setOrganizationPaused("org_a", true), true, "pausing twice is fine");
        assert.equal((await store.findOrganization("org_a"))?.paused, true);
        assert.equal(await store.setOrganizationPaused("org_a", false), true);
        assert.deepEqual(await store.findOrganization("org_a"), a);
        assert.deepEqual(await store.listOrganizations(), [a, b]);
        assert.equal(await store.setOrganizationPaused("org_missing", true), false);
        assert.equal(await store.setOrganizationPaused("name of org_a", true), false, "by id only, not by name");
      });

      it("keeps ids like __proto__ and unicode names exactly", async () => {
        const names = ["__proto__", "constructor", "Zürich ☕ 組織 👩‍💻", "e\u0301cole", "école", "'; DROP TABLE organizations; --"];
        const created = [];
        for (const [i, n] of names.entries()) {
          created.push(await store.createOrganization({ id: i === 0 ? "__proto__" : i === 1 ? "hasOwnProperty" : `org_${i}`, name: n, nowMs: now() }));
        }
        for (const o of created) {
          assert.deepEqual(await store.findOrganization(o.id), o);
          assert.deepEqual(await store.findOrganization(o.name), o);
        }
        assert.equal((await store.findOrganization("__proto__"))?.id, "__proto__", "id match first");
        assert.deepEqual(await store.listOrganizations(), created);
        assert.equal(await store.countOrganizations(), names.length);
        assert.equal(await store.findOrganization("toString"), null);
      });
    });

    describe("API keys", () => {
      it("creates keys and finds each with its organization", async () => {
        const o = await org("org_a", "Acme");
        const created = await store.createApiKey({ id: "k1", orgId: "org_a", name: "ci", hash: hashApiKey("raw-1"), nowMs: T0 + 7 });
        assert.deepEqual(created, { id: "k1", orgId: "org_a", name: "ci", hash: hashApiKey("raw-1"), createdAtMs: T0 + 7, revokedAtMs: null });
        assert.deepEqual(await store.findApiKey("k1"), { key: created, org: o });
        assert.equal(await store.findApiKey("k2"), null);
        assert.equal(await store.findApiKey("org_a"), null);
      });

      it("the organization found with a key shows whether it is paused", async () => {
        await org("org_a");
        await key("k1", "org_a");
        await store.setOrganizationPaused("org_a", true);
        assert.equal((await store.findApiKey("k1"))?.org.paused, true);
      });

      it("lists an organization's keys in creation order, and only its own", async () => {
        await org("org_a");
        await org("org_b");
        const k1 = await key("k_z", "org_a", "first");
        const k2 = await key("k_b", "org_b", null);
        const k3 = await key("k_a", "org_a", null);
        assert.deepEqual(await store.listApiKeys("org_a"), [k1, k3]);
        assert.deepEqual(await store.listApiKeys("org_b"), [k2]);
        assert.deepEqual(await store.listApiKeys("org_missing"), []);
      });

      it("revokes a key once; a second revoke or an unknown key gives false", async () => {
        await org("org_a");
        const k = await key("k1", "org_a");
        await key("k2", "org_a");
        assert.equal(await store.revokeApiKey("k1", T0 + 50_000), true);
        assert.equal(await store.revokeApiKey("k1", T0 + 60_000), false);
        assert.equal(await store.revokeApiKey("k_missing", T0 + 60_000), false);
        const found = await store.findApiKey("k1");
        assert.deepEqual(found?.key, { ...k, revokedAtMs: T0 + 50_000 }, "a revoked key is still found, with the first revocation time");
        const listed = await store.listApiKeys("org_a");
        assert.deepEqual(listed.map((x) => [x.id, x.revokedAtMs]), [["k1", T0 + 50_000], ["k2", null]]);
      });

      it("rejects a key for an unknown organization", async () => {
        await assert.rejects(store.createApiKey({ id: "k1", orgId: "org_missing", name: null, hash: hashApiKey("x"), nowMs: now() }));
        assert.equal(await store.findApiKey("k1"), null);
      });

      it("rejects a duplicate key id with StoreConflictError", async () => {
        await org("org_a");
        await key("k1", "org_a");
        await assert.rejects(
          store.createApiKey({ id: "k1", orgId: "org_a", name: null, hash: hashApiKey("another"), nowMs: now() }),
          StoreConflictError,
        );
        assert.equal((await store.listApiKeys("org_a")).length, 1);
      });

      it("keeps ids like __proto__ and unicode key names", async () => {
        await store.createOrganization({ id: "__proto__", name: "__proto__", nowMs: now() });
        const k = await store.createApiKey({ id: "__proto__", orgId: "__proto__", name: "Schlüssel 🔑", hash: hashApiKey("p"), nowMs: now() });
        const found = await store.findApiKey("__proto__");
        assert.deepEqual(found?.key, k);
        assert.equal(found?.org.id, "__proto__");
        assert.deepEqual(await store.listApiKeys("__proto__"), [k]);
        assert.equal(await store.findApiKey("constructor"), null);
      });
    });

    describe("usage records", () => {
      it("stores a record and reads it back exactly", async () => {
        const full = usageRecord({
          requestId: "req_1",
          orgId: "org_a",
          keyId: "k1",
          source: "playground",
          mode: "preview",
          outcome: "model_error",
          httpStatus: 502,
          inputTokens: 0,
          outputTokens: 0,
          costMicrousd: 0,
          latencyMs: null,
          gatewayLatencyMs: 0.125,
          errorDetail: "model timed out after 30000 ms — “quoted” ✓",
          overReservation: false,
        });
        const paid = usageRecord({
          requestId: "req_2",
          orgId: "org_a",
          inputTokens: 40_000,
          outputTokens: 1234,
          costMicrousd: 9_007_199_254_740_991,
          latencyMs: 1234.5678,
          overReservation: true,
        });
        await store.insertUsage(full);
        await store.insertUsage(paid);
        assert.deepEqual(await store.getUsage("org_a", "req_1"), full);
        assert.deepEqual(await store.getUsage("org_a", "req_2"), paid);
        assert.equal(await store.getUsage("org_a", "req_3"), null);
      });

      it("getUsage is scoped to the organization", async () => {
        await store.insertUsage(usageRecord({ requestId: "req_1", orgId: "org_a" }));
        assert.equal(await store.getUsage("org_b", "req_1"), null);
        assert.notEqual(await store.getUsage("org_a", "req_1"), null);
      });

      it("rejects a duplicate request id with StoreConflictError, even from another organization", async () => {
        const first = usageRecord({ requestId: "req_1", orgId: "org_a" });
        await store.insertUsage(first);
        await assert.rejects(store.insertUsage({ ...first, outcome: "model_error", httpStatus: 502 }), StoreConflictError);
        await assert.rejects(store.insertUsage({ ...first, orgId: "org_b" }), StoreConflictError);
        assert.deepEqual(await store.getUsage("org_a", "req_1"), first);
        assert.equal(await store.getUsage("org_b", "req_1"), null);
      });

      it("rejects values outside the record's rules", async () => {
        const ok = usageRecord({ requestId: "req_ok", orgId: "org_a" });
        const bad: UsageRecord[] = [
          { ...ok, requestId: "r1", costMicrousd: -1 },
          { ...ok, requestId: "r2", inputTokens: -5 },
          { ...ok, requestId: "r3", outputTokens: 1.5 },
          { ...ok, requestId: "r4", outcome: "exploded" as UsageOutcome },
          { ...ok, requestId: "r5", mode: "free" as UsageRecord["mode"] },
          { ...ok, requestId: "r6", source: "cli" as UsageRecord["source"] },
          { ...ok, requestId: "r7", latencyMs: -0.5 },
          { ...ok, requestId: "r8", gatewayLatencyMs: -1 },
        ];
        for (const record of bad) {
          await assert.rejects(store.insertUsage(record), `${record.requestId} is rejected`);
          assert.equal(await store.getUsage("org_a", record.requestId), null);
        }
        await store.insertUsage(ok);
      });

      it("an organization without records lists an empty page", async () => {
        await store.insertUsage(usageRecord({ requestId: "req_1", orgId: "org_other" }));
        assert.deepEqual(await store.listUsage("org_a", { limit: 10 }), { records: [], nextCursor: null });
      });

      it("pages through more than two pages, newest first, ties by request id descending", async () => {
        const records: UsageRecord[] = [];
        for (let i = 0; i < 23; i++) {
          // Groups of three share a timestamp, and request ids do not follow insertion order.
          const id = `req_${String((i * 7) % 23).padStart(2, "0")}`;
          records.push(usageRecord({ requestId: id, orgId: "org_a", createdAtMs: T0 + Math.floor(i / 3) * 1000 }));
        }
        for (const r of records) await store.insertUsage(r);
        await store.insertUsage(usageRecord({ requestId: "req_zz_other_org", orgId: "org_b", createdAtMs: T0 + 500 }));
        const expected = [...records].sort(newestFirst);

        const first = await store.listUsage("org_a", { limit: 5 });
        assert.deepEqual(first.records, expected.slice(0, 5));
        assert.ok(first.nextCursor);

        const { records: all, pages } = await listAll(store, "org_a", { limit: 5 });
        assert.equal(pages, 5);
        assert.deepEqual(all, expected);

        const single = await listAll(store, "org_a", { limit: 1 });
        assert.equal(single.pages, 23);
        assert.deepEqual(ids(single.records), ids(expected));

        const whole = await store.listUsage("org_a", { limit: 200 });
        assert.deepEqual(whole, { records: expected, nextCursor: null });
      });

      it("gives no cursor when the last page is exactly full", async () => {
        for (let i = 0; i < 10; i++) await store.insertUsage(usageRecord({ requestId: `req_${i}`, orgId: "org_a", createdAtMs: T0 + i }));
        const p1 = await store.listUsage("org_a", { limit: 5 });
        assert.ok(p1.nextCursor);
        const p2 = await store.listUsage("org_a", { limit: 5, cursor: p1.nextCursor });
        assert.equal(p2.records.length, 5);
        assert.equal(p2.nextCursor, null);
        assert.deepEqual(ids(p2.records), ["req_4", "req_3", "req_2", "req_1", "req_0"]);
      });

      it("a cursor stays valid when newer records arrive: no record is repeated or skipped", async () => {
        for (let i = 0; i < 9; i++) await store.insertUsage(usageRecord({ requestId: `req_${i}`, orgId: "org_a", createdAtMs: T0 + i * 10 }));
        const p1 = await store.listUsage("org_a", { limit: 4 });
        await store.insertUsage(usageRecord({ requestId: "req_new", orgId: "org_a", createdAtMs: T0 + 1000 }));
        await store.insertUsage(usageRecord({ requestId: "req_4b", orgId: "org_a", createdAtMs: T0 + 40 }));
        const p2 = await store.listUsage("org_a", { limit: 4, cursor: p1.nextCursor! });
        assert.deepEqual(ids(p1.records), ["req_8", "req_7", "req_6", "req_5"]);
        assert.deepEqual(ids(p2.records), ["req_4b", "req_4", "req_3", "req_2"], "a record at an older position appears; the newer one does not");
      });

      it("filters by time: fromMs inclusive, toMs exclusive", async () => {
        for (let i = 0; i < 12; i++) await store.insertUsage(usageRecord({ requestId: `req_${String(i).padStart(2, "0")}`, orgId: "org_a", createdAtMs: T0 + i * 100 }));
        const window = async (q: Omit<UsageQuery, "limit" | "cursor">) => ids((await listAll(store, "org_a", { ...q, limit: 2 })).records);
        assert.deepEqual(await window({ fromMs: T0 + 900 }), ["req_11", "req_10", "req_09"]);
        assert.deepEqual(await window({ toMs: T0 + 200 }), ["req_01", "req_00"]);
        assert.deepEqual(await window({ fromMs: T0 + 300, toMs: T0 + 800 }), ["req_07", "req_06", "req_05", "req_04", "req_03"]);
        assert.deepEqual(await window({ fromMs: T0 + 301, toMs: T0 + 399 }), []);
        assert.deepEqual(await window({ fromMs: T0 + 500, toMs: T0 + 500 }), []);
        assert.deepEqual(await window({ fromMs: T0 + 500, toMs: T0 + 501 }), ["req_05"]);
        assert.deepEqual(await window({ fromMs: T0 + 800, toMs: T0 + 300 }), [], "an empty window, not an error");
      });

      it("filters by outcome, alone and with time, across pages", async () => {
        const records: UsageRecord[] = [];
        for (let i = 0; i < 20; i++) {
          const outcome = OUTCOMES[i % 3 === 0 ? 1 : 0]!;
          records.push(usageRecord({ requestId: `req_${String(i).padStart(2, "0")}`, orgId: "org_a", createdAtMs: T0 + i * 10, outcome }));
        }
        for (const r of records) await store.insertUsage(r);
        const expected = (pred: (r: UsageRecord) => boolean) => ids(records.filter(pred).sort(newestFirst));
        const failed = await listAll(store, "org_a", { outcome: "model_error", limit: 2 });
        assert.ok(failed.pages > 2);
        assert.deepEqual(ids(failed.records), expected((r) => r.outcome === "model_error"));
        const ok = await listAll(store, "org_a", { outcome: "succeeded", fromMs: T0 + 50, toMs: T0 + 150, limit: 3 });
        assert.deepEqual(ids(ok.records), expected((r) => r.outcome === "succeeded" && r.createdAtMs >= T0 + 50 && r.createdAtMs < T0 + 150));
        assert.deepEqual((await store.listUsage("org_a", { outcome: "reservation_expired", limit: 5 })).records, []);
      });

      it("rejects a malformed cursor with StoreInputError", async () => {
        await store.insertUsage(usageRecord({ requestId: "req_1", orgId: "org_a" }));
        const b64 = (s: string) => Buffer.from(s, "utf8").toString("base64url");
        const bad = ["", "!!!", "not a cursor", "abc=", b64("12345"), b64(":req_1"), b64("12:"), b64("-5:req_1"), b64("1.5:req_1"), b64("1e3:req_1"), b64("99999999999999999999:req_1"), "x".repeat(5000)];
        for (const cursor of bad) {
          await assert.rejects(store.listUsage("org_a", { limit: 10, cursor }), StoreInputError, `cursor ${JSON.stringify(cursor.slice(0, 40))}`);
        }
      });

      it("rejects a limit outside 1 to 200 with StoreInputError", async () => {
        for (const limit of [0, -1, 201, 1.5, Number.NaN]) {
          await assert.rejects(store.listUsage("org_a", { limit }), StoreInputError, `limit ${limit}`);
        }
        await store.listUsage("org_a", { limit: 1 });
        await store.listUsage("org_a", { limit: 200 });
      });

      it("keeps request ids like __proto__ and unicode text", async () => {
        const odd = ["__proto__", "constructor", "req:with:colons", "請求-✓-👩‍💻", "a b\tc"];
        for (const [i, requestId] of odd.entries()) {
          await store.insertUsage(usageRecord({ requestId, orgId: "__proto__", keyId: "__proto__", model: "modèle ☃", createdAtMs: T0 + i }));
        }
        for (const requestId of odd) assert.equal((await store.getUsage("__proto__", requestId))?.requestId, requestId);
        assert.equal(await store.getUsage("__proto__", "toString"), null);
        const all = await listAll(store, "__proto__", { limit: 2 });
        assert.deepEqual(ids(all.records), [...odd].reverse(), "distinct times: newest first; cursors carry any request id");
        assert.equal(all.records[0]?.model, "modèle ☃");
      });

      it("paging returns exactly the filtered records in order (property)", async () => {
        let run = 0;
        const recordArb = fc.record({
          suffix: fc.stringMatching(/^[a-z0-9]{1,6}$/),
          at: fc.integer({ min: 0, max: 30 }),
          outcome: fc.constantFrom(...OUTCOMES),
        });
        await fc.assert(
          fc.asyncProperty(
            fc.uniqueArray(recordArb, { selector: (r) => r.suffix, maxLength: 40 }),
            fc.integer({ min: 1, max: 7 }),
            fc.option(fc.integer({ min: 0, max: 30 }), { nil: undefined }),
            fc.option(fc.integer({ min: 0, max: 31 }), { nil: undefined }),
            fc.option(fc.constantFrom(...OUTCOMES), { nil: undefined }),
            async (specs, limit, fromOffset, toOffset, outcome) => {
              const orgId = `org_prop_${run++}`;
              const records = specs.map((s) =>
                usageRecord({ requestId: `${orgId}_${s.suffix}`, orgId, createdAtMs: T0 + s.at, outcome: s.outcome }),
              );
              for (const r of records) await store.insertUsage(r);
              const fromMs = fromOffset === undefined ? undefined : T0 + fromOffset;
              const toMs = toOffset === undefined ? undefined : T0 + toOffset;
              const query = { limit, ...(fromMs === undefined ? {} : { fromMs }), ...(toMs === undefined ? {} : { toMs }), ...(outcome ? { outcome } : {}) };
              const got = await listAll(store, orgId, query);
              const want = records
                .filter((r) => (fromMs === undefined || r.createdAtMs >= fromMs) && (toMs === undefined || r.createdAtMs < toMs))
                .filter((r) => outcome === undefined || r.outcome === outcome)
                .sort(newestFirst);
              assert.deepEqual(got.records, want);
              assert.equal(got.pages, Math.max(1, Math.ceil(want.length / limit)));
            },
          ),
          { numRuns: 40 },
        );
      });
    });

    it("close can be called twice", async () => {
      await store.close();
      await store.close();
    });
  });
}
