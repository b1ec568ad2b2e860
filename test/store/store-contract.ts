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
import {
  StoreConflictError,
  type Balance,
  type Reservation,
  type ReservationStatus,
  type Store,
  type StoredResponse,
  type UsageOutcome,
  type UsageQuery,
  type UsageRecord,
} from "../../src/store/store.ts";

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

const ZERO_BALANCE: Balance = { available: 0, reserved: 0, spent: 0, granted: 0 };

/**
 * Invariant 1 for one organization: available ≥ 0, reserved ≥ 0, granted − spent = available + reserved,
 * and the ledger summed per column equals the balance. Returns the balance.
 */
export async function checkBalanceInvariants(store: Store, orgId: string): Promise<Balance> {
  const balance = await store.getBalance(orgId);
  for (const value of Object.values(balance)) assert.ok(Number.isSafeInteger(value), `balance amounts are integers: ${JSON.stringify(balance)}`);
  assert.ok(balance.available >= 0, `available ≥ 0: ${JSON.stringify(balance)}`);
  assert.ok(balance.reserved >= 0, `reserved ≥ 0: ${JSON.stringify(balance)}`);
  assert.ok(balance.spent >= 0 && balance.granted >= 0, `spent, granted ≥ 0: ${JSON.stringify(balance)}`);
  assert.equal(balance.granted - balance.spent, balance.available + balance.reserved, `granted − spent = available + reserved: ${JSON.stringify(balance)}`);
  const sums = { ...ZERO_BALANCE };
  let lastId = -Infinity;
  for (const entry of await store.listLedger(orgId)) {
    assert.equal(entry.orgId, orgId);
    assert.ok(entry.id > lastId, "ledger oldest first");
    lastId = entry.id;
    sums.available += entry.availableDelta;
    sums.reserved += entry.reservedDelta;
    sums.spent += entry.spentDelta;
    sums.granted += entry.grantedDelta;
  }
  assert.deepEqual(sums, balance, "the ledger sums to the balance");
  return balance;
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

    describe("credits", () => {
      const HOUR = 3_600_000;

      /** An organization with `amount` microUSD granted (none when 0). */
      async function funded(id: string, amount: number) {
        await org(id);
        if (amount > 0) await store.grantCredits({ orgId: id, amountMicrousd: amount, nowMs: now() });
      }

      async function reserve(id: string, orgId: string, amount: number, options: { nowMs?: number; expiresAtMs?: number } = {}) {
        const nowMs = options.nowMs ?? now();
        return store.reserveCredits({
          reservationId: id,
          orgId,
          requestId: `req_${id}`,
          amountMicrousd: amount,
          nowMs,
          expiresAtMs: options.expiresAtMs ?? nowMs + HOUR,
        });
      }

      /** Everything about an organization's credits, to show that a call changed nothing. */
      async function snapshot(orgId: string, reservationIds: string[]) {
        return {
          balance: await store.getBalance(orgId),
          ledger: await store.listLedger(orgId),
          reservations: await Promise.all(reservationIds.map((id) => store.getReservation(id))),
          usage: await store.listUsage(orgId, { limit: 200 }),
        };
      }

      it("an organization without credits has a zero balance and an empty ledger", async () => {
        await org("org_a");
        assert.deepEqual(await store.getBalance("org_a"), ZERO_BALANCE);
        assert.deepEqual(await store.getBalance("org_missing"), ZERO_BALANCE);
        assert.deepEqual(await store.listLedger("org_a"), []);
        assert.equal(await store.getReservation("res_missing"), null);
      });

      it("grants add up, each with a grant ledger entry", async () => {
        await org("org_a");
        await org("org_b");
        const first = await store.grantCredits({ orgId: "org_a", amountMicrousd: 12_500_000, nowMs: T0 + 1, note: "welcome ✓" });
        assert.deepEqual(first, { available: 12_500_000, reserved: 0, spent: 0, granted: 12_500_000 });
        const second = await store.grantCredits({ orgId: "org_a", amountMicrousd: 1, nowMs: T0 + 2 });
        assert.deepEqual(second, { available: 12_500_001, reserved: 0, spent: 0, granted: 12_500_001 });
        assert.deepEqual(await store.getBalance("org_a"), second);
        assert.deepEqual(await store.getBalance("org_b"), ZERO_BALANCE, "only that organization");
        const ledger = await store.listLedger("org_a");
        assert.deepEqual(
          ledger.map(({ id: _id, ...rest }) => rest),
          [
            { orgId: "org_a", kind: "grant", reservationId: null, availableDelta: 12_500_000, reservedDelta: 0, spentDelta: 0, grantedDelta: 12_500_000, createdAtMs: T0 + 1, note: "welcome ✓" },
            { orgId: "org_a", kind: "grant", reservationId: null, availableDelta: 1, reservedDelta: 0, spentDelta: 0, grantedDelta: 1, createdAtMs: T0 + 2, note: null },
          ],
        );
        assert.ok(Number.isInteger(ledger[0]!.id) && ledger[1]!.id > ledger[0]!.id);
        assert.deepEqual(await store.listLedger("org_b"), []);
        await checkBalanceInvariants(store, "org_a");
      });

      it("rejects a grant that is not a whole amount above 0, or for an unknown organization, with StoreInputError", async () => {
        await funded("org_a", 100);
        for (const amountMicrousd of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 53]) {
          await assert.rejects(store.grantCredits({ orgId: "org_a", amountMicrousd, nowMs: now() }), StoreInputError, `amount ${amountMicrousd}`);
        }
        await assert.rejects(store.grantCredits({ orgId: "org_missing", amountMicrousd: 5, nowMs: now() }), StoreInputError);
        assert.deepEqual(await store.getBalance("org_a"), { available: 100, reserved: 0, spent: 0, granted: 100 });
        assert.equal((await store.listLedger("org_a")).length, 1);
        assert.deepEqual(await store.listLedger("org_missing"), []);
      });

      it("reserves exactly the available amount; one more microUSD is insufficient and changes nothing", async () => {
        await funded("org_a", 1000);
        const before = await snapshot("org_a", ["res_big"]);
        assert.equal(await reserve("res_big", "org_a", 1001), "insufficient");
        assert.deepEqual(await snapshot("org_a", ["res_big"]), before);

        assert.equal(await reserve("res_1", "org_a", 1000, { nowMs: T0 + 50, expiresAtMs: T0 + 50 + HOUR }), "reserved");
        assert.deepEqual(await store.getBalance("org_a"), { available: 0, reserved: 1000, spent: 0, granted: 1000 });
        assert.deepEqual(await store.getReservation("res_1"), {
          id: "res_1",
          orgId: "org_a",
          requestId: "req_res_1",
          amountMicrousd: 1000,
          status: "pending",
          costMicrousd: null,
          createdAtMs: T0 + 50,
          expiresAtMs: T0 + 50 + HOUR,
          resolvedAtMs: null,
        } satisfies Reservation);
        const last = (await store.listLedger("org_a")).at(-1);
        assert.deepEqual(
          { kind: last?.kind, reservationId: last?.reservationId, a: last?.availableDelta, r: last?.reservedDelta, s: last?.spentDelta, g: last?.grantedDelta, at: last?.createdAtMs },
          { kind: "reserve", reservationId: "res_1", a: -1000, r: 1000, s: 0, g: 0, at: T0 + 50 },
        );

        const full = await snapshot("org_a", ["res_1", "res_2"]);
        assert.equal(await reserve("res_2", "org_a", 1), "insufficient");
        assert.deepEqual(await snapshot("org_a", ["res_1", "res_2"]), full);
        await checkBalanceInvariants(store, "org_a");
      });

      it("an organization that never had credits can reserve 0 but not 1; an unknown organization neither", async () => {
        await org("org_a");
        assert.equal(await reserve("res_1", "org_a", 1), "insufficient");
        assert.equal(await store.getReservation("res_1"), null);
        assert.equal(await reserve("res_0", "org_a", 0), "reserved");
        assert.equal((await store.getReservation("res_0"))?.status, "pending");
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), ZERO_BALANCE);
        assert.equal(await reserve("res_x", "org_missing", 1), "insufficient");
        assert.equal(await reserve("res_y", "org_missing", 0), "insufficient");
        assert.equal(await store.getReservation("res_y"), null);
      });

      it("rejects a duplicate reservation id with StoreConflictError and changes nothing", async () => {
        await funded("org_a", 1000);
        assert.equal(await reserve("res_1", "org_a", 100), "reserved");
        const before = await snapshot("org_a", ["res_1"]);
        await assert.rejects(reserve("res_1", "org_a", 200), StoreConflictError);
        assert.deepEqual(await snapshot("org_a", ["res_1"]), before);
      });

      it("rejects a negative or fractional reservation with StoreInputError", async () => {
        await funded("org_a", 1000);
        for (const amount of [-1, 0.5, Number.NaN]) {
          await assert.rejects(reserve("res_1", "org_a", amount), StoreInputError, `amount ${amount}`);
        }
        assert.equal(await store.getReservation("res_1"), null);
        assert.deepEqual(await store.getBalance("org_a"), { available: 1000, reserved: 0, spent: 0, granted: 1000 });
      });

      it("settles for less than reserved: charges the cost, returns the rest, writes the usage record", async () => {
        await funded("org_a", 1000);
        await reserve("res_1", "org_a", 300);
        const usage = usageRecord({ requestId: "req_res_1", orgId: "org_a", costMicrousd: 120 });
        assert.equal(await store.settleReservation({ reservationId: "res_1", costMicrousd: 120, nowMs: T0 + 7000, usage }), "settled");
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 880, reserved: 0, spent: 120, granted: 1000 });
        const r = await store.getReservation("res_1");
        assert.deepEqual([r?.status, r?.costMicrousd, r?.resolvedAtMs], ["settled", 120, T0 + 7000]);
        const last = (await store.listLedger("org_a")).at(-1);
        assert.deepEqual(
          { kind: last?.kind, reservationId: last?.reservationId, a: last?.availableDelta, r: last?.reservedDelta, s: last?.spentDelta, g: last?.grantedDelta, at: last?.createdAtMs },
          { kind: "settle", reservationId: "res_1", a: 180, r: -300, s: 120, g: 0, at: T0 + 7000 },
        );
        assert.deepEqual(await store.getUsage("org_a", "req_res_1"), usage);
      });

      it("settles for exactly the reservation, and for 0", async () => {
        await funded("org_a", 1000);
        await reserve("res_1", "org_a", 300);
        await reserve("res_2", "org_a", 200);
        assert.equal(await store.settleReservation({ reservationId: "res_1", costMicrousd: 300, nowMs: now(), usage: usageRecord({ requestId: "r1", orgId: "org_a" }) }), "settled");
        assert.equal(await store.settleReservation({ reservationId: "res_2", costMicrousd: 0, nowMs: now(), usage: usageRecord({ requestId: "r2", orgId: "org_a" }) }), "settled");
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 700, reserved: 0, spent: 300, granted: 1000 });
        assert.equal((await store.getReservation("res_1"))?.costMicrousd, 300);
        assert.equal((await store.getReservation("res_2"))?.costMicrousd, 0);
      });

      it("a cost above the reservation throws RangeError and changes nothing; a bad cost is StoreInputError", async () => {
        await funded("org_a", 1000);
        await reserve("res_1", "org_a", 300);
        const usage = usageRecord({ requestId: "req_res_1", orgId: "org_a" });
        const before = await snapshot("org_a", ["res_1"]);
        await assert.rejects(store.settleReservation({ reservationId: "res_1", costMicrousd: 301, nowMs: now(), usage }), RangeError);
        for (const costMicrousd of [-1, 1.5, Number.NaN]) {
          await assert.rejects(store.settleReservation({ reservationId: "res_1", costMicrousd, nowMs: now(), usage }), StoreInputError);
        }
        assert.deepEqual(await snapshot("org_a", ["res_1"]), before);
        assert.equal(await store.getUsage("org_a", "req_res_1"), null);
        assert.equal(await store.settleReservation({ reservationId: "res_1", costMicrousd: 300, nowMs: now(), usage }), "settled", "still pending");
      });

      it("settling at or after the expiry time expires it instead: funds back, an expire entry, no usage", async () => {
        await funded("org_a", 1000);
        await reserve("res_1", "org_a", 300, { nowMs: T0, expiresAtMs: T0 + 5000 });
        await reserve("res_2", "org_a", 100, { nowMs: T0, expiresAtMs: T0 + 5000 });
        const usage = usageRecord({ requestId: "req_res_1", orgId: "org_a" });
        assert.equal(await store.settleReservation({ reservationId: "res_1", costMicrousd: 50, nowMs: T0 + 5000, usage }), "expired", "expiresAtMs ≤ nowMs");
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 900, reserved: 100, spent: 0, granted: 1000 });
        const r = await store.getReservation("res_1");
        assert.deepEqual([r?.status, r?.costMicrousd, r?.resolvedAtMs], ["expired", null, T0 + 5000]);
        const last = (await store.listLedger("org_a")).at(-1);
        assert.deepEqual([last?.kind, last?.reservationId, last?.availableDelta, last?.reservedDelta, last?.spentDelta], ["expire", "res_1", 300, -300, 0]);
        assert.equal(await store.getUsage("org_a", "req_res_1"), null);
        assert.equal(
          await store.settleReservation({ reservationId: "res_2", costMicrousd: 50, nowMs: T0 + 4999, usage: usageRecord({ requestId: "req_res_2", orgId: "org_a" }) }),
          "settled",
          "one millisecond before the expiry time",
        );
      });

      it("a second settle, a settle after release and a settle of an unknown reservation give not_pending and change nothing", async () => {
        await funded("org_a", 1000);
        await reserve("res_1", "org_a", 300);
        await reserve("res_2", "org_a", 200);
        const usage = usageRecord({ requestId: "req_res_1", orgId: "org_a" });
        assert.equal(await store.settleReservation({ reservationId: "res_1", costMicrousd: 100, nowMs: now(), usage }), "settled");
        assert.equal(await store.releaseReservation({ reservationId: "res_2", nowMs: now(), usage: null }), "released");
        const before = await snapshot("org_a", ["res_1", "res_2"]);
        const again = usageRecord({ requestId: "req_res_1_again", orgId: "org_a" });
        assert.equal(await store.settleReservation({ reservationId: "res_1", costMicrousd: 100, nowMs: now(), usage }), "not_pending", "duplicate delivery");
        assert.equal(await store.settleReservation({ reservationId: "res_1", costMicrousd: 200, nowMs: now(), usage: again }), "not_pending");
        assert.equal(await store.settleReservation({ reservationId: "res_2", costMicrousd: 0, nowMs: now(), usage: again }), "not_pending");
        assert.equal(await store.settleReservation({ reservationId: "res_missing", costMicrousd: 0, nowMs: now(), usage: again }), "not_pending");
        assert.deepEqual(await snapshot("org_a", ["res_1", "res_2"]), before);
        assert.equal(await store.getUsage("org_a", "req_res_1_again"), null);
      });

      it("release returns the whole amount and writes the usage record; a second release changes nothing", async () => {
        await funded("org_a", 1000);
        await reserve("res_1", "org_a", 300);
        const usage = usageRecord({ requestId: "req_res_1", orgId: "org_a", outcome: "model_error", httpStatus: 502, costMicrousd: 0 });
        assert.equal(await store.releaseReservation({ reservationId: "res_1", nowMs: T0 + 9000, usage }), "released");
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 1000, reserved: 0, spent: 0, granted: 1000 });
        const r = await store.getReservation("res_1");
        assert.deepEqual([r?.status, r?.costMicrousd, r?.resolvedAtMs], ["released", null, T0 + 9000]);
        const last = (await store.listLedger("org_a")).at(-1);
        assert.deepEqual([last?.kind, last?.reservationId, last?.availableDelta, last?.reservedDelta, last?.createdAtMs], ["release", "res_1", 300, -300, T0 + 9000]);
        assert.deepEqual(await store.getUsage("org_a", "req_res_1"), usage);
        const before = await snapshot("org_a", ["res_1"]);
        assert.equal(await store.releaseReservation({ reservationId: "res_1", nowMs: now(), usage: null }), "not_pending");
        assert.deepEqual(await snapshot("org_a", ["res_1"]), before);
      });

      it("release writes the usage record even when the reservation already expired", async () => {
        await funded("org_a", 1000);
        await reserve("res_1", "org_a", 300, { nowMs: T0, expiresAtMs: T0 + 10 });
        assert.equal(await store.expireReservations({ nowMs: T0 + 10, limit: 10 }), 1);
        const balance = await store.getBalance("org_a");
        const usage = usageRecord({ requestId: "req_res_1", orgId: "org_a", outcome: "model_error", httpStatus: 502, costMicrousd: 0 });
        assert.equal(await store.releaseReservation({ reservationId: "res_1", nowMs: T0 + 20, usage }), "not_pending");
        assert.deepEqual(await store.getUsage("org_a", "req_res_1"), usage);
        assert.deepEqual(await store.getBalance("org_a"), balance);
        assert.equal((await store.getReservation("res_1"))?.status, "expired");
        const other = usageRecord({ requestId: "req_unknown", orgId: "org_a", outcome: "model_error", httpStatus: 502, costMicrousd: 0 });
        assert.equal(await store.releaseReservation({ reservationId: "res_missing", nowMs: T0 + 30, usage: other }), "not_pending");
        assert.deepEqual(await store.getUsage("org_a", "req_unknown"), other, "whatever the reservation's state");
      });

      it("settle or release whose usage record is a duplicate fails with StoreConflictError and changes nothing", async () => {
        await funded("org_a", 1000);
        await reserve("res_1", "org_a", 300);
        await reserve("res_2", "org_a", 200);
        const existing = usageRecord({ requestId: "req_taken", orgId: "org_a" });
        await store.insertUsage(existing);
        const before = await snapshot("org_a", ["res_1", "res_2"]);
        await assert.rejects(store.settleReservation({ reservationId: "res_1", costMicrousd: 10, nowMs: now(), usage: { ...existing, costMicrousd: 10 } }), StoreConflictError);
        await assert.rejects(store.releaseReservation({ reservationId: "res_2", nowMs: now(), usage: { ...existing, outcome: "model_error" } }), StoreConflictError);
        assert.deepEqual(await snapshot("org_a", ["res_1", "res_2"]), before, "all or nothing: the reservations stay pending");
      });

      it("settle or release with another organization's usage record fails with StoreInputError and changes nothing", async () => {
        await funded("org_a", 1000);
        await org("org_b");
        await reserve("res_1", "org_a", 300);
        const before = await snapshot("org_a", ["res_1"]);
        const foreign = usageRecord({ requestId: "req_res_1", orgId: "org_b" });
        await assert.rejects(store.settleReservation({ reservationId: "res_1", costMicrousd: 10, nowMs: now(), usage: foreign }), StoreInputError);
        await assert.rejects(store.releaseReservation({ reservationId: "res_1", nowMs: now(), usage: foreign }), StoreInputError);
        assert.deepEqual(await snapshot("org_a", ["res_1"]), before);
        assert.equal(await store.getUsage("org_b", "req_res_1"), null);
      });

      it("expireReservations expires only due pending reservations, at most `limit` per call", async () => {
        await funded("org_a", 10_000);
        await funded("org_b", 10_000);
        await reserve("a_due1", "org_a", 100, { nowMs: T0, expiresAtMs: T0 + 10 });
        await reserve("a_due2", "org_a", 200, { nowMs: T0, expiresAtMs: T0 + 20 });
        await reserve("b_due", "org_b", 400, { nowMs: T0, expiresAtMs: T0 + 15 });
        await reserve("a_later", "org_a", 800, { nowMs: T0, expiresAtMs: T0 + 21 });
        await reserve("a_settled", "org_a", 1600, { nowMs: T0, expiresAtMs: T0 + 5 });
        await reserve("a_released", "org_a", 3200, { nowMs: T0, expiresAtMs: T0 + 5 });
        assert.equal(await store.settleReservation({ reservationId: "a_settled", costMicrousd: 1, nowMs: T0 + 1, usage: usageRecord({ requestId: "u1", orgId: "org_a" }) }), "settled");
        assert.equal(await store.releaseReservation({ reservationId: "a_released", nowMs: T0 + 1, usage: null }), "released");
        const resolvedBefore = [await store.getReservation("a_settled"), await store.getReservation("a_released")];
        const due = ["a_due1", "a_due2", "b_due"];
        const status = async (id: string) => (await store.getReservation(id))?.status;

        assert.equal(await store.expireReservations({ nowMs: T0 + 20, limit: 0 }), 0);
        assert.equal(await store.expireReservations({ nowMs: T0 + 20, limit: 2 }), 2);
        const statuses = await Promise.all(due.map(status));
        assert.equal(statuses.filter((s) => s === "expired").length, 2);
        assert.equal(statuses.filter((s) => s === "pending").length, 1);
        assert.equal(await store.expireReservations({ nowMs: T0 + 20, limit: 2 }), 1);
        assert.equal(await store.expireReservations({ nowMs: T0 + 20, limit: 2 }), 0);
        for (const id of due) {
          const r = await store.getReservation(id);
          assert.deepEqual([r?.status, r?.resolvedAtMs, r?.costMicrousd], ["expired", T0 + 20, null], id);
        }
        assert.equal(await status("a_later"), "pending", "not due yet: expiresAtMs > nowMs");
        assert.deepEqual([await store.getReservation("a_settled"), await store.getReservation("a_released")], resolvedBefore);
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 10_000 - 800 - 1, reserved: 800, spent: 1, granted: 10_000 });
        assert.deepEqual(await checkBalanceInvariants(store, "org_b"), { available: 10_000, reserved: 0, spent: 0, granted: 10_000 });
        const expireEntries = (await store.listLedger("org_a")).filter((e) => e.kind === "expire");
        assert.deepEqual(expireEntries.map((e) => [e.reservationId, e.availableDelta, e.reservedDelta]).sort(), [["a_due1", 100, -100], ["a_due2", 200, -200]]);
        assert.equal(await store.expireReservations({ nowMs: T0 + 21, limit: 10 }), 1);
        assert.equal(await status("a_later"), "expired");
        await assert.rejects(store.expireReservations({ nowMs: T0, limit: -1 }), StoreInputError);
        await assert.rejects(store.expireReservations({ nowMs: T0, limit: 1.5 }), StoreInputError);
      });

      it("the ledger of a busy organization sums to its balance", async () => {
        await funded("org_a", 5000);
        await reserve("r1", "org_a", 1000);
        await reserve("r2", "org_a", 1500);
        await reserve("r3", "org_a", 700, { nowMs: T0, expiresAtMs: T0 + 1 });
        await store.grantCredits({ orgId: "org_a", amountMicrousd: 250, nowMs: now() });
        await store.settleReservation({ reservationId: "r1", costMicrousd: 333, nowMs: now(), usage: usageRecord({ requestId: "u1", orgId: "org_a" }) });
        await store.releaseReservation({ reservationId: "r2", nowMs: now(), usage: null });
        await store.expireReservations({ nowMs: now(), limit: 10 });
        const balance = await checkBalanceInvariants(store, "org_a");
        assert.deepEqual(balance, { available: 5250 - 333, reserved: 0, spent: 333, granted: 5250 });
        assert.deepEqual(
          (await store.listLedger("org_a")).map((e) => e.kind),
          ["grant", "reserve", "reserve", "reserve", "grant", "settle", "release", "expire"],
        );
      });

      it("keeps invariants 1–3 under random interleavings, duplicate deliveries and expiry (property)", async () => {
        type Cmd =
          | { t: "grant"; org: number; amount: number }
          | { t: "reserve"; org: number; amount: number; ttl: number }
          | { t: "settle"; pick: number; costPercent: number }
          | { t: "release"; pick: number; withUsage: boolean }
          | { t: "tick"; advance: number }
          | { t: "expire"; advance: number; limit: number }
          | { t: "duplicate"; pick: number; op: "settle" | "release" | "expire"; costPercent: number };
        const orgIdx = fc.integer({ min: 0, max: 1 });
        const cmd: fc.Arbitrary<Cmd> = fc.oneof(
          { arbitrary: fc.record({ t: fc.constant("grant" as const), org: orgIdx, amount: fc.integer({ min: 1, max: 1000 }) }), weight: 2 },
          { arbitrary: fc.record({ t: fc.constant("reserve" as const), org: orgIdx, amount: fc.integer({ min: 0, max: 400 }), ttl: fc.integer({ min: 0, max: 12 }) }), weight: 3 },
          { arbitrary: fc.record({ t: fc.constant("settle" as const), pick: fc.nat(), costPercent: fc.integer({ min: 0, max: 100 }) }), weight: 2 },
          fc.record({ t: fc.constant("release" as const), pick: fc.nat(), withUsage: fc.boolean() }),
          fc.record({ t: fc.constant("tick" as const), advance: fc.integer({ min: 1, max: 8 }) }),
          fc.record({ t: fc.constant("expire" as const), advance: fc.integer({ min: 0, max: 8 }), limit: fc.integer({ min: 1, max: 3 }) }),
          fc.record({ t: fc.constant("duplicate" as const), pick: fc.nat(), op: fc.constantFrom("settle" as const, "release" as const, "expire" as const), costPercent: fc.integer({ min: 0, max: 100 }) }),
        );

        interface ModelReservation {
          id: string;
          orgId: string;
          requestId: string;
          amount: number;
          expiresAtMs: number;
          status: ReservationStatus;
          cost: number | null;
          /** The stored reservation once resolved: it must never change again. */
          resolved: Reservation | null;
        }

        let runs = 0;
        await fc.assert(
          fc.asyncProperty(fc.array(cmd, { minLength: 1, maxLength: 40, size: "max" }), async (cmds) => {
            // One store for all runs: each run has its own organizations and ids, and ends by expiring
            // everything it left pending, so the global expiry sweep of a later run sees only its own.
            const s = store;
            const run = runs++;
            try {
              const orgIds = [`org_r${run}_0`, `org_r${run}_1`];
              let t = T0;
              for (const id of orgIds) await s.createOrganization({ id, name: id, nowMs: t });
              const balances = new Map<string, Balance>(orgIds.map((id) => [id, { ...ZERO_BALANCE }]));
              const reservations: ModelReservation[] = [];
              const usage = new Set<string>();
              const bal = (orgId: string) => balances.get(orgId)!;
              const record = (r: ModelReservation, cost: number) => usageRecord({ requestId: r.requestId, orgId: r.orgId, createdAtMs: t, costMicrousd: cost });

              const giveBack = (r: ModelReservation, status: "released" | "expired") => {
                r.status = status;
                bal(r.orgId).available += r.amount;
                bal(r.orgId).reserved -= r.amount;
              };

              const settle = async (r: ModelReservation, costPercent: number) => {
                const cost = Math.floor((r.amount * costPercent) / 100);
                const got = await s.settleReservation({ reservationId: r.id, costMicrousd: cost, nowMs: t, usage: record(r, cost) });
                if (r.status !== "pending") return assert.equal(got, "not_pending");
                if (r.expiresAtMs <= t) {
                  assert.equal(got, "expired");
                  return giveBack(r, "expired");
                }
                assert.equal(got, "settled");
                r.status = "settled";
                r.cost = cost;
                const b = bal(r.orgId);
                b.available += r.amount - cost;
                b.reserved -= r.amount;
                b.spent += cost;
                usage.add(r.requestId);
              };

              const release = async (r: ModelReservation, withUsage: boolean) => {
                const call = s.releaseReservation({ reservationId: r.id, nowMs: t, usage: withUsage ? record(r, 0) : null });
                if (withUsage && usage.has(r.requestId)) {
                  // The record exists already: the whole call fails, the reservation stays as it was.
                  return await assert.rejects(call, StoreConflictError);
                }
                const got = await call;
                if (withUsage) usage.add(r.requestId);
                if (r.status !== "pending") return assert.equal(got, "not_pending");
                assert.equal(got, "released");
                giveBack(r, "released");
              };

              const expire = async (limit: number) => {
                const due = reservations.filter((r) => r.status === "pending" && r.expiresAtMs <= t);
                const n = await s.expireReservations({ nowMs: t, limit });
                assert.equal(n, Math.min(limit, due.length));
                for (const r of due) if ((await s.getReservation(r.id))?.status === "expired") giveBack(r, "expired");
                assert.equal(due.filter((r) => r.status === "expired").length, n, "exactly the expired count were due");
              };

              const check = async () => {
                for (const orgId of orgIds) {
                  const balance = await checkBalanceInvariants(s, orgId);
                  assert.deepEqual(balance, bal(orgId), "the balance the model expects");
                  const pending = reservations.filter((r) => r.orgId === orgId && r.status === "pending").reduce((sum, r) => sum + r.amount, 0);
                  assert.equal(balance.reserved, pending, "reserved = sum of pending reservations");
                }
                for (const r of reservations) {
                  const got = await s.getReservation(r.id);
                  assert.ok(got, r.id);
                  assert.equal(got.status, r.status, r.id);
                  assert.equal(got.amountMicrousd, r.amount);
                  assert.equal(got.costMicrousd, r.cost);
                  if (got.costMicrousd !== null) assert.ok(got.costMicrousd <= got.amountMicrousd);
                  if (r.resolved) assert.deepEqual(got, r.resolved, "a resolved reservation never changes");
                  else if (r.status !== "pending") r.resolved = got;
                  assert.equal((await s.getUsage(r.orgId, r.requestId)) !== null, usage.has(r.requestId), `usage of ${r.requestId}`);
                }
              };

              // Time moves only with tick and expire, so calls often land exactly on an expiry time.
              for (const c of cmds) {
                const pick = (n: number, from: ModelReservation[]) => (from.length === 0 ? undefined : from[n % from.length]);
                switch (c.t) {
                  case "grant": {
                    const orgId = orgIds[c.org]!;
                    const got = await s.grantCredits({ orgId, amountMicrousd: c.amount, nowMs: t });
                    bal(orgId).available += c.amount;
                    bal(orgId).granted += c.amount;
                    assert.deepEqual(got, bal(orgId));
                    break;
                  }
                  case "reserve": {
                    const orgId = orgIds[c.org]!;
                    const r: ModelReservation = { id: `res_r${run}_${reservations.length}`, orgId, requestId: `req_r${run}_${reservations.length}`, amount: c.amount, expiresAtMs: t + c.ttl, status: "pending", cost: null, resolved: null };
                    const got = await s.reserveCredits({ reservationId: r.id, orgId, requestId: r.requestId, amountMicrousd: r.amount, nowMs: t, expiresAtMs: r.expiresAtMs });
                    const b = bal(orgId);
                    if (b.available >= c.amount) {
                      assert.equal(got, "reserved");
                      b.available -= c.amount;
                      b.reserved += c.amount;
                      reservations.push(r);
                    } else {
                      assert.equal(got, "insufficient");
                      assert.equal(await s.getReservation(r.id), null);
                    }
                    break;
                  }
                  case "settle": {
                    const r = pick(c.pick, reservations);
                    if (r) await settle(r, c.costPercent);
                    break;
                  }
                  case "release": {
                    const r = pick(c.pick, reservations);
                    if (r) await release(r, c.withUsage);
                    break;
                  }
                  case "tick":
                    t += c.advance;
                    break;
                  case "expire":
                    t += c.advance;
                    await expire(c.limit);
                    break;
                  case "duplicate": {
                    const r = pick(c.pick, reservations.filter((x) => x.status !== "pending"));
                    if (!r) break;
                    if (c.op === "settle") await settle(r, c.costPercent);
                    else if (c.op === "release") await release(r, false);
                    else await expire(1000);
                    break;
                  }
                }
                await check();
              }
              t += 1000;
              await expire(1000);
              await check();
              assert.ok(reservations.every((r) => r.status !== "pending"));
            } finally {
              // After a failure too (fast-check then shrinks, re-running on this store): leave nothing pending.
              await s.expireReservations({ nowMs: Number.MAX_SAFE_INTEGER, limit: 100_000 });
            }
          }),
          { numRuns: 100 },
        );
      });
    });

    describe("preview quotas", () => {
      const DAY = "2026-01-01";
      const consume = (orgId: string, orgLimit: number, globalLimit: number, day = DAY) => store.consumePreviewQuota({ orgId, day, orgLimit, globalLimit });

      it("counts up to the organization's limit, then says org_exhausted and counts nothing", async () => {
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 0, global: 0 });
        assert.equal(await consume("org_a", 2, 10), "ok");
        assert.equal(await consume("org_a", 2, 10), "ok");
        assert.equal(await consume("org_a", 2, 10), "org_exhausted");
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 2, global: 2 });
        assert.equal(await consume("org_b", 2, 10), "ok", "another organization has its own count");
        assert.deepEqual(await store.previewUsage("org_b", DAY), { org: 1, global: 3 });
        assert.equal(await consume("org_a", 3, 10), "ok", "a higher limit allows more");
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 3, global: 4 });
      });

      it("the service-wide limit counts every organization; a refused call counts nothing", async () => {
        assert.equal(await consume("org_a", 10, 3), "ok");
        assert.equal(await consume("org_b", 10, 3), "ok");
        assert.equal(await consume("org_a", 10, 3), "ok");
        assert.equal(await consume("org_b", 10, 3), "global_exhausted");
        assert.equal(await consume("org_c", 10, 3), "global_exhausted");
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 2, global: 3 });
        assert.deepEqual(await store.previewUsage("org_b", DAY), { org: 1, global: 3 });
        assert.deepEqual(await store.previewUsage("org_c", DAY), { org: 0, global: 3 });
      });

      it("reports the organization's limit first when both are reached", async () => {
        assert.equal(await consume("org_a", 1, 1), "ok");
        assert.equal(await consume("org_a", 1, 1), "org_exhausted");
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 1, global: 1 });
      });

      it("a limit of 0 allows nothing", async () => {
        assert.equal(await consume("org_a", 0, 10), "org_exhausted");
        assert.equal(await consume("org_a", 10, 0), "global_exhausted");
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 0, global: 0 });
      });

      it("each UTC day has its own counters", async () => {
        assert.equal(await consume("org_a", 1, 1, "2026-01-01"), "ok");
        assert.equal(await consume("org_a", 1, 1, "2026-01-01"), "org_exhausted");
        assert.equal(await consume("org_a", 1, 1, "2026-01-02"), "ok");
        assert.equal(await consume("org_b", 5, 1, "2025-12-31"), "ok");
        assert.deepEqual(await store.previewUsage("org_a", "2026-01-01"), { org: 1, global: 1 });
        assert.deepEqual(await store.previewUsage("org_a", "2026-01-02"), { org: 1, global: 1 });
        assert.deepEqual(await store.previewUsage("org_a", "2025-12-31"), { org: 0, global: 1 });
        assert.deepEqual(await store.previewUsage("org_a", "2026-01-03"), { org: 0, global: 0 });
      });

      it("rejects a malformed day or limit with StoreInputError", async () => {
        for (const day of ["2026-1-1", "01/01/2026", "2026-01-01T00:00:00Z", "", "2026-13-01"]) {
          await assert.rejects(consume("org_a", 5, 5, day), StoreInputError, day);
        }
        await assert.rejects(consume("org_a", -1, 5), StoreInputError);
        await assert.rejects(consume("org_a", 5, 1.5), StoreInputError);
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 0, global: 0 });
      });
    });

    describe("idempotency keys", () => {
      const MINUTE = 60_000;
      const DAY_MS = 86_400_000;
      const claim = (requestId: string, nowMs: number, options: { key?: string; orgId?: string; hash?: string; lockMs?: number; ttlMs?: number } = {}) =>
        store.claimIdempotencyKey({
          orgId: options.orgId ?? "org_a",
          key: options.key ?? "key-1",
          requestHash: options.hash ?? "hash-1",
          requestId,
          nowMs,
          lockUntilMs: nowMs + (options.lockMs ?? MINUTE),
          expiresAtMs: nowMs + (options.ttlMs ?? DAY_MS),
        });
      const response = (requestId: string): StoredResponse => ({ status: 200, body: `{"request_id":"${requestId}","answers":{"q":"✓"}}`, requestId });
      const complete = (requestId: string, options: { key?: string; orgId?: string } = {}) =>
        store.completeIdempotencyKey({ orgId: options.orgId ?? "org_a", key: options.key ?? "key-1", requestId, response: response(requestId) });
      const release = (requestId: string) => store.releaseIdempotencyKey({ orgId: "org_a", key: "key-1", requestId });

      it("claims a new key; while it runs, another claim is in_progress whatever its body", async () => {
        assert.deepEqual(await claim("req_1", T0), { kind: "claimed" });
        assert.deepEqual(await claim("req_2", T0 + 1000), { kind: "in_progress" });
        assert.deepEqual(await claim("req_3", T0 + 1000, { hash: "hash-2" }), { kind: "in_progress" });
        assert.deepEqual(await claim("req_4", T0 + MINUTE - 1), { kind: "in_progress" }, "the lock holds until lockUntilMs");
      });

      it("replays the completed response for the same body, and says mismatch for another body", async () => {
        await claim("req_1", T0);
        await complete("req_1");
        assert.deepEqual(await claim("req_2", T0 + 1000), { kind: "replay", response: response("req_1") });
        assert.deepEqual(await claim("req_3", T0 + 2 * MINUTE), { kind: "replay", response: response("req_1") }, "long after the lock");
        assert.deepEqual(await claim("req_4", T0 + 1000, { hash: "hash-2" }), { kind: "mismatch" });
        assert.deepEqual(await claim("req_5", T0 + DAY_MS - 1), { kind: "replay", response: response("req_1") }, "until expiresAtMs");
      });

      it("keys are scoped to the organization", async () => {
        await claim("req_1", T0);
        await complete("req_1");
        assert.deepEqual(await claim("req_2", T0 + 1, { orgId: "org_b" }), { kind: "claimed" });
        assert.deepEqual(await claim("req_3", T0 + 1, { key: "key-2" }), { kind: "claimed" });
        assert.deepEqual(await claim("req_4", T0 + 2, { orgId: "org_b" }), { kind: "in_progress" });
      });

      it("only the owner completes or releases the claim", async () => {
        await claim("req_1", T0);
        await complete("req_other");
        await release("req_other");
        assert.deepEqual(await claim("req_2", T0 + 1), { kind: "in_progress" }, "a stranger changed nothing");
        await release("req_1");
        assert.deepEqual(await claim("req_3", T0 + 2), { kind: "claimed" }, "released: a retry runs anew");
        await complete("req_1");
        assert.deepEqual(await claim("req_4", T0 + 3), { kind: "in_progress" }, "the old owner cannot complete the new claim");
        await complete("req_3");
        assert.deepEqual(await claim("req_5", T0 + 4), { kind: "replay", response: response("req_3") });
      });

      it("a completed response is kept: a later complete or release by its owner changes nothing", async () => {
        await claim("req_1", T0);
        await complete("req_1");
        await store.completeIdempotencyKey({ orgId: "org_a", key: "key-1", requestId: "req_1", response: { status: 200, body: "{}", requestId: "req_1" } });
        await release("req_1");
        assert.deepEqual(await claim("req_2", T0 + 1), { kind: "replay", response: response("req_1") });
      });

      it("takes over a claim whose lock passed; the old owner can no longer complete or release it", async () => {
        await claim("req_1", T0);
        assert.deepEqual(await claim("req_2", T0 + MINUTE, { hash: "hash-2" }), { kind: "claimed" }, "lockUntilMs ≤ nowMs: the lock passed");
        await complete("req_1");
        await release("req_1");
        assert.deepEqual(await claim("req_3", T0 + MINUTE + 1, { hash: "hash-2" }), { kind: "in_progress" });
        await complete("req_2");
        assert.deepEqual(await claim("req_4", T0 + MINUTE + 2, { hash: "hash-2" }), { kind: "replay", response: response("req_2") });
        assert.deepEqual(await claim("req_5", T0 + MINUTE + 2), { kind: "mismatch" }, "the new claim's body counts now");
      });

      it("takes over an expired entry, completed or not", async () => {
        await claim("req_1", T0, { ttlMs: 10 * MINUTE });
        await complete("req_1");
        assert.deepEqual(await claim("req_2", T0 + 10 * MINUTE, { hash: "hash-2" }), { kind: "claimed" }, "expiresAtMs ≤ nowMs");
        await complete("req_2");
        assert.deepEqual(await claim("req_3", T0 + 10 * MINUTE + 1, { hash: "hash-2" }), { kind: "replay", response: response("req_2") });

        await claim("req_a", T0, { key: "key-2", lockMs: DAY_MS, ttlMs: MINUTE });
        assert.deepEqual(await claim("req_b", T0 + MINUTE, { key: "key-2" }), { kind: "claimed" }, "expired although its lock had not passed");
      });

      it("replays a stored body byte for byte", async () => {
        const body = '{"z":1,"a":"é\\u00e9 👩‍💻","n":1.50}';
        await claim("req_1", T0);
        await store.completeIdempotencyKey({ orgId: "org_a", key: "key-1", requestId: "req_1", response: { status: 200, body, requestId: "req_1" } });
        const got = await claim("req_2", T0 + 1);
        assert.equal(got.kind, "replay");
        assert.equal(got.kind === "replay" ? got.response.body : null, body);
      });
    });

    it("close can be called twice", async () => {
      await store.close();
      await store.close();
    });
  });
}
