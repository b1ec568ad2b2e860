/**
 * The Store contract: every adapter runs this suite unchanged.
 *
 *   describeStoreContract("sqlite (temp file)", async () => openSqliteStore(tempFile()));
 *
 * `makeStore` is called once per test and must return a new, empty store; the suite closes it.
 * Request ids in ordering tests use only [a-z0-9_], so any collation sorts them like JavaScript does.
 * Usage records, reservations, preview counters and idempotency entries are written only through the two steps
 * of a request (admission and completion, committed by `commitBatch`) and by the sweep.
 */
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";
import fc from "fast-check";
import { hashApiKey } from "../../src/domain/api-keys.ts";
import type { AuditActor, AuditEntry } from "../../src/domain/audit.ts";
import type { AdmitCommand, AdmitResult, CompleteCommand, CompleteResult, StoredResponse } from "../../src/domain/bookkeeping.ts";
import { MAX_KEPT_RESPONSE_BYTES } from "../../src/domain/bookkeeping.ts";
import type { Balance, LedgerEntry, Reservation, ReservationStatus } from "../../src/domain/credits.ts";
import type { FinalOutcome, UsageOutcome, UsageRecord } from "../../src/domain/usage-records.ts";
import { ADMIN_IDEMPOTENCY_TTL_MS, type OrganizationPage } from "../../src/store/administration.ts";
import { ABANDONED_DETAIL, EXPIRED_DETAIL } from "../../src/store/bookkeeping/programs.ts";
import type { PostgresStore } from "../../src/store/postgres/postgres-store.ts";
import type { SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { Store, UsageQuery } from "../../src/store/store.ts";
import { StoreConflictError, StoreInputError } from "../../src/store/store-errors.ts";
import { pendingReserved } from "../support/books.ts";

const OUTCOMES: UsageOutcome[] = ["in_flight", "succeeded", "model_error", "context_rejected", "reservation_expired", "gateway_error"];
export const T0 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const HOUR = 3_600_000;
const MINUTE = 60_000;
const DAY_MS = 86_400_000;
const STATUS_OF: Record<FinalOutcome, number> = {
  succeeded: 200,
  model_error: 502,
  context_rejected: 422,
  reservation_expired: 409,
  gateway_error: 500,
};

/** An admission with nothing to claim, count or reserve unless overridden. */
export function admission(overrides: Partial<AdmitCommand> & Pick<AdmitCommand, "requestId" | "orgId">): AdmitCommand {
  return {
    keyId: "key_1",
    source: "api",
    model: "jev-1",
    mode: overrides.quota ? "preview" : "paid",
    nowMs: T0,
    idempotency: null,
    quota: null,
    reservation: null,
    ...overrides,
  };
}

/** A successful completion that charges nothing and holds no reservation or key unless overridden. */
export function completion(overrides: Partial<CompleteCommand> & Pick<CompleteCommand, "requestId" | "orgId">): CompleteCommand {
  return {
    nowMs: T0,
    outcome: "succeeded",
    httpStatus: 200,
    inputTokens: 120,
    outputTokens: 7,
    costMicrousd: 0,
    latencyMs: 12.5,
    gatewayLatencyMs: 14.25,
    errorDetail: null,
    overReservation: false,
    deployment: "svc-a",
    attempts: 1,
    reserved: false,
    idempotency: null,
    ...overrides,
  };
}

/** A usage record as `recordUsage` writes it: final (or in flight) with the fields its outcome implies. */
export function usageRecord(overrides: Partial<UsageRecord> & Pick<UsageRecord, "requestId" | "orgId">): UsageRecord {
  const outcome = overrides.outcome ?? "succeeded";
  const createdAtMs = overrides.createdAtMs ?? T0;
  const common = { keyId: "key_1", createdAtMs, source: "api" as const, model: "jev-1", mode: "paid" as const };
  if (outcome === "in_flight") {
    return {
      ...common,
      completedAtMs: null,
      outcome,
      httpStatus: null,
      inputTokens: 0,
      outputTokens: 0,
      costMicrousd: 0,
      latencyMs: null,
      gatewayLatencyMs: 0,
      errorDetail: null,
      overReservation: false,
      deployment: null,
      attempts: 0,
      ...overrides,
    };
  }
  return {
    ...common,
    completedAtMs: createdAtMs + 250,
    outcome,
    httpStatus: STATUS_OF[outcome],
    inputTokens: 120,
    outputTokens: 7,
    costMicrousd: 0,
    latencyMs: 12.5,
    gatewayLatencyMs: 14.25,
    errorDetail: outcome === "succeeded" ? null : outcome === "reservation_expired" ? EXPIRED_DETAIL : `${outcome} ✗`,
    overReservation: false,
    deployment: "svc-a",
    attempts: 1,
    ...overrides,
  };
}

/**
 * Writes usage records exactly as given, through one batch of admissions and one of completions. A record that
 * charges something (or says reservation_expired) is admitted with a reservation: its organization is created when
 * missing and granted the costs first.
 */
export async function recordUsage(store: Store, records: readonly UsageRecord[]): Promise<void> {
  const paid = new Set(records.filter((r) => r.costMicrousd > 0 || r.outcome === "reservation_expired"));
  for (const orgId of new Set([...paid].map((r) => r.orgId))) {
    if ((await store.findOrganization(orgId))?.id !== orgId)
      await store.createOrganization({ id: orgId, name: `usage of ${orgId}`, nowMs: T0 });
    const costs = [...paid].filter((r) => r.orgId === orgId).reduce((sum, r) => sum + r.costMicrousd, 0);
    if (costs > 0) await store.grantCredits({ orgId, amountMicrousd: costs, nowMs: T0 });
  }
  const admissions = records.map((r) =>
    admission({
      requestId: r.requestId,
      orgId: r.orgId,
      keyId: r.keyId,
      source: r.source,
      model: r.model,
      mode: r.mode,
      nowMs: r.createdAtMs,
      reservation: paid.has(r)
        ? { amountMicrousd: r.costMicrousd, expiresAtMs: r.outcome === "reservation_expired" ? r.completedAtMs! : r.createdAtMs + HOUR }
        : null,
    }),
  );
  const admitted = await store.commitBatch({ admissions, completions: [] });
  assert.deepEqual(
    admitted.admissions,
    records.map(() => ({ kind: "admitted" })),
  );
  const final = records.filter((r) => r.outcome !== "in_flight");
  const completions = final.map((r) => {
    assert.ok(r.completedAtMs !== null && r.httpStatus !== null, `${r.requestId}: a completion needs completedAtMs and httpStatus`);
    return completion({
      requestId: r.requestId,
      orgId: r.orgId,
      nowMs: r.completedAtMs,
      outcome: r.outcome === "reservation_expired" || r.outcome === "in_flight" ? "succeeded" : r.outcome,
      httpStatus: r.httpStatus,
      inputTokens: r.inputTokens,
      outputTokens: r.outputTokens,
      costMicrousd: r.costMicrousd,
      latencyMs: r.latencyMs,
      gatewayLatencyMs: r.gatewayLatencyMs,
      errorDetail: r.errorDetail,
      overReservation: r.overReservation,
      deployment: r.deployment,
      attempts: r.attempts,
      reserved: paid.has(r),
    });
  });
  const completed = await store.commitBatch({ admissions: [], completions });
  assert.deepEqual(
    completed.completions,
    final.map((r) => ({ kind: r.outcome === "reservation_expired" ? "reservation_expired" : "completed" })),
  );
}

/** Newest first, ties by request id descending: the order listUsage promises. */
function newestFirst(a: UsageRecord, b: UsageRecord): number {
  if (a.createdAtMs !== b.createdAtMs) return b.createdAtMs - a.createdAtMs;
  return a.requestId < b.requestId ? 1 : a.requestId > b.requestId ? -1 : 0;
}

/** Follows nextCursor to the end; fails if a page is over-full or paging does not end. */
export async function listAll(
  store: Store,
  orgId: string,
  query: Omit<UsageQuery, "cursor">,
): Promise<{ records: UsageRecord[]; pages: number }> {
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
 * Invariant 1 for one organization: available ≥ 0, reserved ≥ 0, granted − spent = available + reserved, reserved
 * is the sum of the pending reservations (each held by a request in flight), and the ledger (an entry per grant and
 * per resolved reservation) sums to what is final: Σ granted = granted, Σ spent = spent, Σ available = available +
 * reserved, Σ reserved = 0. Returns the balance.
 */
export async function checkBalanceInvariants(store: Store, orgId: string): Promise<Balance> {
  const balance = await store.getBalance(orgId);
  for (const value of Object.values(balance))
    assert.ok(Number.isSafeInteger(value), `balance amounts are integers: ${JSON.stringify(balance)}`);
  assert.ok(balance.available >= 0, `available ≥ 0: ${JSON.stringify(balance)}`);
  assert.ok(balance.reserved >= 0, `reserved ≥ 0: ${JSON.stringify(balance)}`);
  assert.ok(balance.spent >= 0 && balance.granted >= 0, `spent, granted ≥ 0: ${JSON.stringify(balance)}`);
  assert.equal(
    balance.granted - balance.spent,
    balance.available + balance.reserved,
    `granted − spent = available + reserved: ${JSON.stringify(balance)}`,
  );
  assert.equal(await pendingReserved(store, orgId), balance.reserved, "reserved = the sum of the pending reservations");
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
  assert.deepEqual(
    sums,
    { ...balance, available: balance.available + balance.reserved, reserved: 0 },
    "the ledger sums to the balance once the pending reservations are back in available",
  );
  return balance;
}

/** The ledger entry without its id, as [kind, reservationId, available, reserved, spent, granted, createdAtMs]. */
function entryOf(e: LedgerEntry | undefined): unknown[] {
  return e ? [e.kind, e.reservationId, e.availableDelta, e.reservedDelta, e.spentDelta, e.grantedDelta, e.createdAtMs] : [];
}

const utcDay = (ms: number) => new Date(ms).toISOString().slice(0, 10);
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

    const admit = async (...admissions: AdmitCommand[]): Promise<AdmitResult[]> =>
      (await store.commitBatch({ admissions, completions: [] })).admissions;
    const complete = async (...completions: CompleteCommand[]): Promise<CompleteResult[]> =>
      (await store.commitBatch({ admissions: [], completions })).completions;

    /** An organization with `amount` microUSD granted (none when 0). */
    async function funded(id: string, amount: number) {
      await org(id);
      if (amount > 0) await store.grantCredits({ orgId: id, amountMicrousd: amount, nowMs: now() });
    }

    /** A paid admission: its reservation (whose id is the request id) expires an hour after nowMs unless told. */
    function paid(requestId: string, orgId: string, amount: number, options: { nowMs?: number; expiresAtMs?: number } = {}): AdmitCommand {
      const nowMs = options.nowMs ?? T0;
      return admission({
        requestId,
        orgId,
        nowMs,
        reservation: { amountMicrousd: amount, expiresAtMs: options.expiresAtMs ?? nowMs + HOUR },
      });
    }

    const DAY = "2026-01-01";

    function preview(requestId: string, orgId: string, orgLimit: number, globalLimit: number, day = DAY): AdmitCommand {
      return admission({ requestId, orgId, quota: { day, orgLimit, globalLimit } });
    }

    /** Everything a request can change in an organization's books, to show that a call changed nothing. */
    async function books(orgId: string, requestIds: string[] = [], day = DAY) {
      return {
        balance: await store.getBalance(orgId),
        ledger: await store.listLedger(orgId),
        reservations: await Promise.all(requestIds.map((id) => store.getReservation(id))),
        usage: await store.listUsage(orgId, { limit: 200 }),
        preview: await store.previewUsage(orgId, day),
      };
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
        // Kept exactly as given (not normalised); "e\u0301cole" and "école" would be one name (nameKey), so "ecole" stands beside it.
        const names = ["__proto__", "constructor", "Zürich ☕ 組織 👩‍💻", "e\u0301cole", "ecole", "'; DROP TABLE organizations; --"];
        const created = [];
        for (const [i, n] of names.entries()) {
          created.push(
            await store.createOrganization({ id: i === 0 ? "__proto__" : i === 1 ? "hasOwnProperty" : `org_${i}`, name: n, nowMs: now() }),
          );
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
        assert.deepEqual(created, {
          id: "k1",
          orgId: "org_a",
          name: "ci",
          hash: hashApiKey("raw-1"),
          createdAtMs: T0 + 7,
          revokedAtMs: null,
          expiresAtMs: null,
          models: null,
          requestsPerMinute: null,
          budget: null,
          lineageId: "k1",
          replacedBy: null,
          retiresAtMs: null,
          lastUsedAtMs: null,
        });
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
        assert.deepEqual(
          listed.map((x) => [x.id, x.revokedAtMs]),
          [
            ["k1", T0 + 50_000],
            ["k2", null],
          ],
        );
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
        const k = await store.createApiKey({
          id: "__proto__",
          orgId: "__proto__",
          name: "Schlüssel 🔑",
          hash: hashApiKey("p"),
          nowMs: now(),
        });
        const found = await store.findApiKey("__proto__");
        assert.deepEqual(found?.key, k);
        assert.equal(found?.org.id, "__proto__");
        assert.deepEqual(await store.listApiKeys("__proto__"), [k]);
        assert.equal(await store.findApiKey("constructor"), null);
      });
    });

    describe("usage records", () => {
      it("stores records through admission and completion and reads them back exactly", async () => {
        const full = usageRecord({
          requestId: "req_1",
          orgId: "org_a",
          keyId: "k1",
          createdAtMs: T0 + 1,
          completedAtMs: T0 + 30_002,
          source: "playground",
          mode: "preview",
          outcome: "model_error",
          httpStatus: 502,
          inputTokens: 0,
          outputTokens: 0,
          latencyMs: null,
          gatewayLatencyMs: 0.125,
          errorDetail: "model timed out after 30000 ms — “quoted” ✓",
        });
        const charged = usageRecord({
          requestId: "req_2",
          orgId: "org_a",
          inputTokens: 40_000,
          outputTokens: 1234,
          costMicrousd: 9_007_199_254_740_991,
          latencyMs: 1234.5678,
          overReservation: true,
        });
        const batched = usageRecord({ requestId: "req_batch", orgId: "org_a", source: "batch", mode: "preview" });
        await recordUsage(store, [full, charged, batched]);
        assert.deepEqual(await store.getUsage("org_a", "req_1"), full);
        assert.deepEqual(await store.getUsage("org_a", "req_2"), charged);
        assert.deepEqual(await store.getUsage("org_a", "req_batch"), batched);
        assert.equal(await store.getUsage("org_a", "req_3"), null);
      });

      it("getUsage is scoped to the organization", async () => {
        await recordUsage(store, [usageRecord({ requestId: "req_1", orgId: "org_a" })]);
        assert.equal(await store.getUsage("org_b", "req_1"), null);
        assert.notEqual(await store.getUsage("org_a", "req_1"), null);
      });

      it("admitting a request id that exists fails with StoreConflictError, even from another organization, and changes nothing", async () => {
        const first = usageRecord({ requestId: "req_1", orgId: "org_a" });
        await recordUsage(store, [first]);
        await assert.rejects(admit(admission({ requestId: "req_1", orgId: "org_a" })), StoreConflictError);
        await assert.rejects(admit(admission({ requestId: "req_1", orgId: "org_b", mode: "preview" })), StoreConflictError);
        assert.deepEqual(await store.getUsage("org_a", "req_1"), first);
        assert.equal(await store.getUsage("org_b", "req_1"), null);
      });

      it("refuses values outside the record's rules and writes nothing", async () => {
        const inFlight = usageRecord({ requestId: "req_live", orgId: "org_a", outcome: "in_flight" });
        await recordUsage(store, [inFlight]);
        const badAdmissions = [
          admission({ requestId: "r1", orgId: "org_a", mode: "free" as AdmitCommand["mode"] }),
          admission({ requestId: "r2", orgId: "org_a", source: "cli" as AdmitCommand["source"] }),
        ];
        for (const command of badAdmissions) {
          await assert.rejects(admit(command), `${command.requestId} is refused`);
          assert.equal(await store.getUsage("org_a", command.requestId), null);
        }
        const live = { requestId: "req_live", orgId: "org_a" };
        const badCompletions = [
          completion({ ...live, outcome: "exploded" as CompleteCommand["outcome"] }),
          completion({ ...live, outcome: "in_flight" as CompleteCommand["outcome"] }),
          completion({ ...live, latencyMs: -0.5 }),
          completion({ ...live, gatewayLatencyMs: -1 }),
        ];
        for (const command of badCompletions) {
          await assert.rejects(complete(command), JSON.stringify(command));
          assert.deepEqual(await store.getUsage("org_a", "req_live"), inFlight, "still in flight");
        }
        assert.deepEqual(await complete(completion({ ...live, nowMs: T0 + 250 })), [{ kind: "completed" }]);
        assert.deepEqual(await store.getUsage("org_a", "req_live"), usageRecord(live));
      });

      it("an organization without records lists an empty page", async () => {
        await recordUsage(store, [usageRecord({ requestId: "req_1", orgId: "org_other" })]);
        assert.deepEqual(await store.listUsage("org_a", { limit: 10 }), { records: [], nextCursor: null });
      });

      it("pages through more than two pages, newest first, ties by request id descending", async () => {
        const records: UsageRecord[] = [];
        for (let i = 0; i < 23; i++) {
          // Groups of three share a timestamp, and request ids do not follow insertion order.
          const id = `req_${String((i * 7) % 23).padStart(2, "0")}`;
          records.push(usageRecord({ requestId: id, orgId: "org_a", createdAtMs: T0 + Math.floor(i / 3) * 1000 }));
        }
        await recordUsage(store, [...records, usageRecord({ requestId: "req_zz_other_org", orgId: "org_b", createdAtMs: T0 + 500 })]);
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
        await recordUsage(
          store,
          Array.from({ length: 10 }, (_, i) => usageRecord({ requestId: `req_${i}`, orgId: "org_a", createdAtMs: T0 + i })),
        );
        const p1 = await store.listUsage("org_a", { limit: 5 });
        assert.ok(p1.nextCursor);
        const p2 = await store.listUsage("org_a", { limit: 5, cursor: p1.nextCursor });
        assert.equal(p2.records.length, 5);
        assert.equal(p2.nextCursor, null);
        assert.deepEqual(ids(p2.records), ["req_4", "req_3", "req_2", "req_1", "req_0"]);
      });

      it("a cursor stays valid when newer records arrive: no record is repeated or skipped", async () => {
        await recordUsage(
          store,
          Array.from({ length: 9 }, (_, i) => usageRecord({ requestId: `req_${i}`, orgId: "org_a", createdAtMs: T0 + i * 10 })),
        );
        const p1 = await store.listUsage("org_a", { limit: 4 });
        await recordUsage(store, [
          usageRecord({ requestId: "req_new", orgId: "org_a", createdAtMs: T0 + 1000 }),
          usageRecord({ requestId: "req_4b", orgId: "org_a", createdAtMs: T0 + 40, outcome: "in_flight" }),
        ]);
        const p2 = await store.listUsage("org_a", { limit: 4, cursor: p1.nextCursor! });
        assert.deepEqual(ids(p1.records), ["req_8", "req_7", "req_6", "req_5"]);
        assert.deepEqual(
          ids(p2.records),
          ["req_4b", "req_4", "req_3", "req_2"],
          "a record at an older position appears; the newer one does not",
        );
      });

      it("filters by time: fromMs inclusive, toMs exclusive", async () => {
        await recordUsage(
          store,
          Array.from({ length: 12 }, (_, i) =>
            usageRecord({ requestId: `req_${String(i).padStart(2, "0")}`, orgId: "org_a", createdAtMs: T0 + i * 100 }),
          ),
        );
        const window = async (q: Omit<UsageQuery, "limit" | "cursor">) => ids((await listAll(store, "org_a", { ...q, limit: 2 })).records);
        assert.deepEqual(await window({ fromMs: T0 + 900 }), ["req_11", "req_10", "req_09"]);
        assert.deepEqual(await window({ toMs: T0 + 200 }), ["req_01", "req_00"]);
        assert.deepEqual(await window({ fromMs: T0 + 300, toMs: T0 + 800 }), ["req_07", "req_06", "req_05", "req_04", "req_03"]);
        assert.deepEqual(await window({ fromMs: T0 + 301, toMs: T0 + 399 }), []);
        assert.deepEqual(await window({ fromMs: T0 + 500, toMs: T0 + 500 }), []);
        assert.deepEqual(await window({ fromMs: T0 + 500, toMs: T0 + 501 }), ["req_05"]);
        assert.deepEqual(await window({ fromMs: T0 + 800, toMs: T0 + 300 }), [], "an empty window, not an error");
      });

      it("filters by every outcome, in flight too, alone and with time, across pages", async () => {
        const records: UsageRecord[] = [];
        for (let i = 0; i < 24; i++) {
          records.push(
            usageRecord({
              requestId: `req_${String(i).padStart(2, "0")}`,
              orgId: "org_a",
              createdAtMs: T0 + i * 10,
              outcome: OUTCOMES[(i * 5) % 6]!,
            }),
          );
        }
        await recordUsage(store, records);
        const expected = (pred: (r: UsageRecord) => boolean) => records.filter(pred).sort(newestFirst);
        for (const outcome of OUTCOMES) {
          const got = await listAll(store, "org_a", { outcome, limit: 1 });
          assert.equal(got.pages, 4, outcome);
          assert.deepEqual(
            got.records,
            expected((r) => r.outcome === outcome),
            outcome,
          );
        }
        const inFlight = await listAll(store, "org_a", { outcome: "in_flight", fromMs: T0 + 60, toMs: T0 + 180, limit: 1 });
        assert.deepEqual(ids(inFlight.records), ["req_12", "req_06"]);
        const ok = await listAll(store, "org_a", { outcome: "succeeded", fromMs: T0 + 50, toMs: T0 + 190, limit: 3 });
        assert.deepEqual(ids(ok.records), ["req_17", "req_11", "req_05"]);
        assert.deepEqual((await store.listUsage("org_b", { outcome: "reservation_expired", limit: 5 })).records, []);
      });

      it("rejects a malformed cursor with StoreInputError", async () => {
        await recordUsage(store, [usageRecord({ requestId: "req_1", orgId: "org_a" })]);
        const b64 = (s: string) => Buffer.from(s, "utf8").toString("base64url");
        const bad = [
          "",
          "!!!",
          "not a cursor",
          "abc=",
          b64("12345"),
          b64(":req_1"),
          b64("12:"),
          b64("-5:req_1"),
          b64("1.5:req_1"),
          b64("1e3:req_1"),
          b64("99999999999999999999:req_1"),
          "x".repeat(5000),
        ];
        for (const cursor of bad) {
          await assert.rejects(
            store.listUsage("org_a", { limit: 10, cursor }),
            StoreInputError,
            `cursor ${JSON.stringify(cursor.slice(0, 40))}`,
          );
        }
      });

      it("rejects a limit outside 1 to 200 or an unknown outcome with StoreInputError", async () => {
        for (const limit of [0, -1, 201, 1.5, Number.NaN]) {
          await assert.rejects(store.listUsage("org_a", { limit }), StoreInputError, `limit ${limit}`);
        }
        await assert.rejects(store.listUsage("org_a", { limit: 5, outcome: "exploded" as UsageOutcome }), StoreInputError);
        await store.listUsage("org_a", { limit: 1 });
        await store.listUsage("org_a", { limit: 200 });
      });

      it("keeps request ids like __proto__ and unicode text", async () => {
        const odd = ["__proto__", "constructor", "req:with:colons", "請求-✓-👩‍💻", "a b\tc"];
        await recordUsage(
          store,
          odd.map((requestId, i) =>
            usageRecord({ requestId, orgId: "__proto__", keyId: "__proto__", model: "modèle ☃", createdAtMs: T0 + i }),
          ),
        );
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
              await recordUsage(store, records);
              const fromMs = fromOffset === undefined ? undefined : T0 + fromOffset;
              const toMs = toOffset === undefined ? undefined : T0 + toOffset;
              const query = {
                limit,
                ...(fromMs === undefined ? {} : { fromMs }),
                ...(toMs === undefined ? {} : { toMs }),
                ...(outcome ? { outcome } : {}),
              };
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

    describe("admission and completion", () => {
      const claimOf = (key: string, requestHash = "hash-1", nowMs = T0) => ({
        key,
        requestHash,
        lockUntilMs: nowMs + MINUTE,
        expiresAtMs: nowMs + DAY_MS,
      });

      it("an admitted request is in flight: getUsage and listUsage find its record before completion", async () => {
        await funded("org_a", 1000);
        const command = admission({
          requestId: "req_1",
          orgId: "org_a",
          keyId: "k9",
          source: "playground",
          model: "jev-2",
          nowMs: T0 + 5,
          reservation: { amountMicrousd: 300, expiresAtMs: T0 + HOUR },
        });
        assert.deepEqual(await admit(command), [{ kind: "admitted" }]);
        const inFlight: UsageRecord = {
          requestId: "req_1",
          orgId: "org_a",
          keyId: "k9",
          createdAtMs: T0 + 5,
          completedAtMs: null,
          deployment: null,
          attempts: 0,
          source: "playground",
          model: "jev-2",
          mode: "paid",
          outcome: "in_flight",
          httpStatus: null,
          inputTokens: 0,
          outputTokens: 0,
          costMicrousd: 0,
          latencyMs: null,
          gatewayLatencyMs: 0,
          errorDetail: null,
          overReservation: false,
        };
        assert.deepEqual(await store.getUsage("org_a", "req_1"), inFlight);
        assert.deepEqual(await store.listUsage("org_a", { limit: 10, outcome: "in_flight" }), { records: [inFlight], nextCursor: null });
        assert.deepEqual((await store.listUsage("org_a", { limit: 10, outcome: "succeeded" })).records, []);
        assert.equal((await store.getReservation("req_1"))?.status, "pending");
      });

      it("a completion makes the record final exactly once: a second completion is not_in_flight and changes nothing", async () => {
        await funded("org_a", 1000);
        await admit(paid("req_1", "org_a", 300));
        assert.deepEqual(
          await complete(completion({ requestId: "req_1", orgId: "org_a", nowMs: T0 + 250, costMicrousd: 100, reserved: true })),
          [{ kind: "completed" }],
        );
        assert.deepEqual(await store.getUsage("org_a", "req_1"), usageRecord({ requestId: "req_1", orgId: "org_a", costMicrousd: 100 }));
        const before = await books("org_a", ["req_1"]);
        assert.deepEqual(
          await complete(
            completion({ requestId: "req_1", orgId: "org_a", nowMs: T0 + 1000, costMicrousd: 100, reserved: true }),
            completion({ requestId: "req_1", orgId: "org_a", nowMs: T0 + 1000, outcome: "model_error", httpStatus: 502, reserved: true }),
            completion({
              requestId: "req_1",
              orgId: "org_a",
              nowMs: T0 + 1000,
              outcome: "gateway_error",
              httpStatus: 500,
              reserved: false,
            }),
          ),
          [{ kind: "not_in_flight" }, { kind: "not_in_flight" }, { kind: "not_in_flight" }],
        );
        assert.deepEqual(await books("org_a", ["req_1"]), before);
      });

      it("two completions of one request in one batch: the first completes it, the second is not_in_flight", async () => {
        await funded("org_a", 1000);
        await admit(paid("req_1", "org_a", 300));
        assert.deepEqual(
          await complete(
            completion({ requestId: "req_1", orgId: "org_a", nowMs: T0 + 250, costMicrousd: 100, reserved: true }),
            completion({ requestId: "req_1", orgId: "org_a", nowMs: T0 + 250, outcome: "model_error", httpStatus: 502, reserved: true }),
          ),
          [{ kind: "completed" }, { kind: "not_in_flight" }],
        );
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 900, reserved: 0, spent: 100, granted: 1000 });
        assert.deepEqual(await store.getUsage("org_a", "req_1"), usageRecord({ requestId: "req_1", orgId: "org_a", costMicrousd: 100 }));
        assert.deepEqual(
          (await store.listLedger("org_a")).map((e) => e.kind),
          ["grant", "settle"],
        );
      });

      it("a completion of an unknown request, or under another organization's id, is not_in_flight and writes nothing", async () => {
        await funded("org_a", 1000);
        await funded("org_b", 1000);
        await admit(paid("req_1", "org_a", 300));
        const before = [await books("org_a", ["req_1"]), await books("org_b", ["req_1"])];
        assert.deepEqual(
          await complete(
            completion({ requestId: "req_missing", orgId: "org_a", reserved: true }),
            completion({ requestId: "req_1", orgId: "org_b", costMicrousd: 10, reserved: true }),
          ),
          [{ kind: "not_in_flight" }, { kind: "not_in_flight" }],
        );
        assert.deepEqual([await books("org_a", ["req_1"]), await books("org_b", ["req_1"])], before);
        assert.equal((await store.getUsage("org_a", "req_1"))?.outcome, "in_flight");
        assert.equal(await store.getUsage("org_b", "req_1"), null);
        assert.equal(await store.getUsage("org_a", "req_missing"), null);
      });

      it("a rejected admission writes nothing at all: no usage record, reservation, counter or claim", async () => {
        await funded("org_a", 100);
        assert.deepEqual(await admit({ ...preview("req_seen", "org_a", 1, 10) }), [{ kind: "admitted" }]);
        assert.deepEqual(await admit(admission({ requestId: "req_held", orgId: "org_a", idempotency: claimOf("k-held") })), [
          { kind: "admitted" },
        ]);
        await admit(admission({ requestId: "req_done", orgId: "org_a", idempotency: claimOf("k-done") }));
        const kept: StoredResponse = { status: 200, body: '{"request_id":"req_done"}', requestId: "req_done" };
        await complete(completion({ requestId: "req_done", orgId: "org_a", idempotency: { key: "k-done", response: kept } }));
        const rejected = ["req_org", "req_global", "req_credits", "req_in_progress", "req_mismatch", "req_replay"];
        const before = await books("org_a", rejected);
        assert.deepEqual(
          await admit(
            { ...preview("req_org", "org_a", 1, 10), idempotency: claimOf("k-org") },
            { ...preview("req_global", "org_a", 5, 1), idempotency: claimOf("k-global") },
            { ...paid("req_credits", "org_a", 101), idempotency: claimOf("k-credits") },
            { ...paid("req_in_progress", "org_a", 10), idempotency: claimOf("k-held") },
            { ...paid("req_mismatch", "org_a", 10), idempotency: claimOf("k-done", "hash-2") },
            { ...paid("req_replay", "org_a", 10), idempotency: claimOf("k-done") },
          ),
          [
            { kind: "quota_exhausted", scope: "org" },
            { kind: "quota_exhausted", scope: "global" },
            { kind: "insufficient_credits", availableMicrousd: 100 },
            { kind: "idempotency_in_progress" },
            { kind: "idempotency_mismatch" },
            { kind: "replay", response: kept },
          ],
        );
        assert.deepEqual(await books("org_a", rejected), before);
        assert.deepEqual(before.reservations, [null, null, null, null, null, null]);
        assert.deepEqual(ids(before.usage.records).sort(), ["req_done", "req_held", "req_seen"]);
        // No claim was taken: each key is free for another body, while the keys that were held still are.
        assert.deepEqual(
          await admit(
            admission({ requestId: "req_x1", orgId: "org_a", idempotency: claimOf("k-org", "hash-9") }),
            admission({ requestId: "req_x2", orgId: "org_a", idempotency: claimOf("k-global", "hash-9") }),
            admission({ requestId: "req_x3", orgId: "org_a", idempotency: claimOf("k-credits", "hash-9") }),
            admission({ requestId: "req_x4", orgId: "org_a", idempotency: claimOf("k-held", "hash-9") }),
            admission({ requestId: "req_x5", orgId: "org_a", idempotency: claimOf("k-done") }),
          ),
          [
            { kind: "admitted" },
            { kind: "admitted" },
            { kind: "admitted" },
            { kind: "idempotency_in_progress" },
            { kind: "replay", response: kept },
          ],
        );
      });

      it("decides each command of a batch on its own and answers in command order", async () => {
        await funded("org_a", 500);
        await org("org_b");
        assert.deepEqual(
          await admit(
            paid("req_1", "org_a", 300),
            paid("req_2", "org_a", 300),
            preview("req_3", "org_b", 1, 10),
            preview("req_4", "org_b", 1, 10),
            paid("req_5", "org_a", 200),
            paid("req_6", "org_b", 1),
            preview("req_7", "org_a", 5, 2),
          ),
          [
            { kind: "admitted" },
            { kind: "insufficient_credits", availableMicrousd: 200 },
            { kind: "admitted" },
            { kind: "quota_exhausted", scope: "org" },
            { kind: "admitted" },
            { kind: "insufficient_credits", availableMicrousd: 0 },
            { kind: "admitted" },
          ],
        );
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 0, reserved: 500, spent: 0, granted: 500 });
        assert.deepEqual(ids((await store.listUsage("org_a", { limit: 10 })).records).sort(), ["req_1", "req_5", "req_7"]);
        assert.deepEqual(ids((await store.listUsage("org_b", { limit: 10 })).records), ["req_3"]);
        assert.deepEqual(await store.previewUsage("org_b", DAY), { org: 1, global: 2 });
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 1, global: 2 });
      });

      it("within one batch, a second admission with the same Idempotency-Key is idempotency_in_progress", async () => {
        const withKey = (requestId: string, orgId: string, hash: string) =>
          admission({ requestId, orgId, idempotency: claimOf("k", hash) });
        assert.deepEqual(
          await admit(
            withKey("req_1", "org_a", "h"),
            withKey("req_2", "org_a", "h"),
            withKey("req_3", "org_a", "h2"),
            withKey("req_4", "org_b", "h"),
          ),
          [{ kind: "admitted" }, { kind: "idempotency_in_progress" }, { kind: "idempotency_in_progress" }, { kind: "admitted" }],
        );
        assert.equal(await store.getUsage("org_a", "req_2"), null);
        assert.equal(await store.getUsage("org_a", "req_3"), null);
        const response: StoredResponse = { status: 200, body: "{}", requestId: "req_1" };
        await complete(completion({ requestId: "req_1", orgId: "org_a", idempotency: { key: "k", response } }));
        assert.deepEqual(await admit(withKey("req_5", "org_a", "h")), [{ kind: "replay", response }]);
      });

      it("within one batch, completions come first: the funds they return are available to the admissions", async () => {
        await funded("org_a", 1000);
        await admit(paid("req_1", "org_a", 600), paid("req_2", "org_a", 400));
        const result = await store.commitBatch({
          admissions: [paid("req_3", "org_a", 500), paid("req_4", "org_a", 350), paid("req_5", "org_a", 51)],
          completions: [
            completion({ requestId: "req_1", orgId: "org_a", costMicrousd: 100, reserved: true }),
            completion({ requestId: "req_2", orgId: "org_a", outcome: "model_error", httpStatus: 502, reserved: true }),
          ],
        });
        assert.deepEqual(result, {
          admissions: [{ kind: "admitted" }, { kind: "admitted" }, { kind: "insufficient_credits", availableMicrousd: 50 }],
          completions: [{ kind: "completed" }, { kind: "completed" }],
        });
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 50, reserved: 850, spent: 100, granted: 1000 });
        assert.deepEqual(
          (await store.listLedger("org_a")).map((e) => [e.kind, e.reservationId]),
          [
            ["grant", null],
            ["settle", "req_1"],
            ["release", "req_2"],
          ],
        );
      });

      it("within one batch, completions come first: a request admitted in it is not yet in flight, a claim dropped in it is free", async () => {
        await admit(admission({ requestId: "req_1", orgId: "org_a", idempotency: claimOf("k") }));
        const result = await store.commitBatch({
          admissions: [
            admission({ requestId: "req_2", orgId: "org_a", idempotency: claimOf("k", "hash-2") }),
            admission({ requestId: "req_3", orgId: "org_a" }),
          ],
          completions: [
            completion({
              requestId: "req_1",
              orgId: "org_a",
              outcome: "model_error",
              httpStatus: 502,
              idempotency: { key: "k", response: null },
            }),
            completion({ requestId: "req_3", orgId: "org_a" }),
          ],
        });
        assert.deepEqual(result, {
          admissions: [{ kind: "admitted" }, { kind: "admitted" }],
          completions: [{ kind: "completed" }, { kind: "not_in_flight" }],
        });
        assert.equal((await store.getUsage("org_a", "req_3"))?.outcome, "in_flight");
        assert.equal((await store.getUsage("org_a", "req_1"))?.outcome, "model_error");
        assert.deepEqual(await admit(admission({ requestId: "req_4", orgId: "org_a", idempotency: claimOf("k", "hash-2") })), [
          { kind: "idempotency_in_progress" },
        ]);
      });

      it("a batch with a duplicate request id fails with StoreConflictError and writes nothing of it", async () => {
        await funded("org_a", 1000);
        await admit({ ...paid("req_live", "org_a", 300), idempotency: claimOf("k-live") });
        await recordUsage(store, [usageRecord({ requestId: "req_done", orgId: "org_a", createdAtMs: T0 - 1000, completedAtMs: T0 - 900 })]);
        const touched = ["req_live", "req_new", "req_prev", "req_idem", "req_twice"];
        const before = await books("org_a", touched);
        const response: StoredResponse = { status: 200, body: "{}", requestId: "req_live" };
        await assert.rejects(
          store.commitBatch({
            admissions: [
              paid("req_new", "org_a", 200),
              preview("req_prev", "org_a", 5, 5),
              admission({ requestId: "req_idem", orgId: "org_a", idempotency: claimOf("k-new") }),
              admission({ requestId: "req_done", orgId: "org_a" }),
            ],
            completions: [
              completion({
                requestId: "req_live",
                orgId: "org_a",
                costMicrousd: 100,
                reserved: true,
                idempotency: { key: "k-live", response },
              }),
            ],
          }),
          StoreConflictError,
        );
        assert.deepEqual(await books("org_a", touched), before);
        await assert.rejects(
          admit(paid("req_twice", "org_a", 100), admission({ requestId: "req_twice", orgId: "org_a" })),
          StoreConflictError,
        );
        assert.deepEqual(await books("org_a", touched), before);
        assert.deepEqual(
          await admit(
            admission({ requestId: "req_k1", orgId: "org_a", idempotency: claimOf("k-new", "hash-2") }),
            admission({ requestId: "req_k2", orgId: "org_a", idempotency: claimOf("k-live") }),
          ),
          [{ kind: "admitted" }, { kind: "idempotency_in_progress" }],
          "the failed batch claimed no key and completed none",
        );
        assert.deepEqual(await complete(completion({ requestId: "req_live", orgId: "org_a", costMicrousd: 100, reserved: true })), [
          { kind: "completed" },
        ]);
      });

      it("an empty batch does nothing", async () => {
        assert.deepEqual(await store.commitBatch({ admissions: [], completions: [] }), { admissions: [], completions: [] });
      });
    });

    describe("credits", () => {
      it("an organization without credits has a zero balance and an empty ledger", async () => {
        await org("org_a");
        assert.deepEqual(await store.getBalance("org_a"), ZERO_BALANCE);
        assert.deepEqual(await store.getBalance("org_missing"), ZERO_BALANCE);
        assert.deepEqual(await store.listLedger("org_a"), []);
        assert.equal(await store.getReservation("req_missing"), null);
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
            {
              orgId: "org_a",
              kind: "grant",
              reservationId: null,
              availableDelta: 12_500_000,
              reservedDelta: 0,
              spentDelta: 0,
              grantedDelta: 12_500_000,
              createdAtMs: T0 + 1,
              note: "welcome ✓",
            },
            {
              orgId: "org_a",
              kind: "grant",
              reservationId: null,
              availableDelta: 1,
              reservedDelta: 0,
              spentDelta: 0,
              grantedDelta: 1,
              createdAtMs: T0 + 2,
              note: null,
            },
          ],
        );
        assert.ok(Number.isInteger(ledger[0]!.id) && ledger[1]!.id > ledger[0]!.id);
        assert.deepEqual(await store.listLedger("org_b"), []);
        await checkBalanceInvariants(store, "org_a");
      });

      it("rejects a grant that is not a whole amount above 0, or for an unknown organization, with StoreInputError", async () => {
        await funded("org_a", 100);
        for (const amountMicrousd of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 53]) {
          await assert.rejects(
            store.grantCredits({ orgId: "org_a", amountMicrousd, nowMs: now() }),
            StoreInputError,
            `amount ${amountMicrousd}`,
          );
        }
        await assert.rejects(
          store.grantCredits({ orgId: "org_a", amountMicrousd: Number.MAX_SAFE_INTEGER, nowMs: now() }),
          StoreInputError,
          "beyond the safe integer range",
        );
        await assert.rejects(store.grantCredits({ orgId: "org_missing", amountMicrousd: 5, nowMs: now() }), StoreInputError);
        assert.deepEqual(await store.getBalance("org_a"), { available: 100, reserved: 0, spent: 0, granted: 100 });
        assert.equal((await store.listLedger("org_a")).length, 1);
        assert.deepEqual(await store.listLedger("org_missing"), []);
      });

      it("reserves exactly the available amount at admission; one more microUSD is insufficient_credits and writes nothing", async () => {
        await funded("org_a", 1000);
        const before = await books("org_a", ["req_big"]);
        assert.deepEqual(await admit(paid("req_big", "org_a", 1001)), [{ kind: "insufficient_credits", availableMicrousd: 1000 }]);
        assert.deepEqual(await books("org_a", ["req_big"]), before);

        assert.deepEqual(await admit(paid("req_1", "org_a", 1000, { nowMs: T0 + 50, expiresAtMs: T0 + 50 + HOUR })), [
          { kind: "admitted" },
        ]);
        assert.deepEqual(await store.getBalance("org_a"), { available: 0, reserved: 1000, spent: 0, granted: 1000 });
        assert.deepEqual(await store.getReservation("req_1"), {
          id: "req_1",
          orgId: "org_a",
          requestId: "req_1",
          amountMicrousd: 1000,
          status: "pending",
          costMicrousd: null,
          createdAtMs: T0 + 50,
          expiresAtMs: T0 + 50 + HOUR,
          resolvedAtMs: null,
        } satisfies Reservation);
        assert.deepEqual(
          (await store.listLedger("org_a")).map((e) => e.kind),
          ["grant"],
          "no ledger entry while pending",
        );

        const full = await books("org_a", ["req_1", "req_2"]);
        assert.deepEqual(await admit(paid("req_2", "org_a", 1)), [{ kind: "insufficient_credits", availableMicrousd: 0 }]);
        assert.deepEqual(await books("org_a", ["req_1", "req_2"]), full);
        await checkBalanceInvariants(store, "org_a");
      });

      it("an organization that never had credits can reserve 0 but not 1", async () => {
        await org("org_a");
        assert.deepEqual(await admit(paid("req_1", "org_a", 1)), [{ kind: "insufficient_credits", availableMicrousd: 0 }]);
        assert.equal(await store.getReservation("req_1"), null);
        assert.deepEqual(await admit(paid("req_0", "org_a", 0)), [{ kind: "admitted" }]);
        assert.equal((await store.getReservation("req_0"))?.status, "pending");
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), ZERO_BALANCE);
      });

      it("an unknown organization cannot reserve, not even 0, and its admission fails nothing else", async () => {
        await funded("org_a", 100);
        assert.deepEqual(await admit(paid("req_x", "org_missing", 1), paid("req_a", "org_a", 10)), [
          { kind: "insufficient_credits", availableMicrousd: 0 },
          { kind: "admitted" },
        ]);
        assert.deepEqual(await admit(paid("req_y", "org_missing", 0), paid("req_b", "org_a", 10)), [
          { kind: "insufficient_credits", availableMicrousd: 0 },
          { kind: "admitted" },
        ]);
        assert.equal(await store.getReservation("req_x"), null);
        assert.equal(await store.getReservation("req_y"), null);
        assert.equal(await store.getUsage("org_missing", "req_y"), null);
        assert.deepEqual(await store.getBalance("org_missing"), ZERO_BALANCE);
      });

      it("admitting a request id that exists fails with StoreConflictError and changes nothing", async () => {
        await funded("org_a", 1000);
        await funded("org_b", 1000);
        assert.deepEqual(await admit(paid("req_1", "org_a", 100)), [{ kind: "admitted" }]);
        const before = [await books("org_a", ["req_1"]), await books("org_b", ["req_1"])];
        await assert.rejects(admit(paid("req_1", "org_a", 200)), StoreConflictError);
        await assert.rejects(admit(paid("req_1", "org_b", 200)), StoreConflictError);
        await assert.rejects(admit(preview("req_1", "org_a", 5, 5)), StoreConflictError);
        assert.deepEqual([await books("org_a", ["req_1"]), await books("org_b", ["req_1"])], before);
      });

      it("rejects a negative or fractional reservation with StoreInputError", async () => {
        await funded("org_a", 1000);
        for (const amount of [-1, 0.5, Number.NaN]) {
          await assert.rejects(admit(paid("req_1", "org_a", amount)), StoreInputError, `amount ${amount}`);
        }
        assert.equal(await store.getReservation("req_1"), null);
        assert.equal(await store.getUsage("org_a", "req_1"), null);
        assert.deepEqual(await store.getBalance("org_a"), { available: 1000, reserved: 0, spent: 0, granted: 1000 });
      });

      it("a successful completion settles for less than reserved: charges the cost, returns the rest, writes the final record", async () => {
        await funded("org_a", 1000);
        await admit(paid("req_1", "org_a", 300, { nowMs: T0 + 10 }));
        const done = completion({
          requestId: "req_1",
          orgId: "org_a",
          nowMs: T0 + 7000,
          inputTokens: 40,
          outputTokens: 3,
          costMicrousd: 120,
          latencyMs: 812.5,
          gatewayLatencyMs: 830.25,
          overReservation: true,
          reserved: true,
        });
        assert.deepEqual(await complete(done), [{ kind: "completed" }]);
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 880, reserved: 0, spent: 120, granted: 1000 });
        const r = await store.getReservation("req_1");
        assert.deepEqual([r?.status, r?.costMicrousd, r?.resolvedAtMs], ["settled", 120, T0 + 7000]);
        assert.deepEqual(entryOf((await store.listLedger("org_a")).at(-1)), ["settle", "req_1", -120, 0, 120, 0, T0 + 7000]);
        assert.deepEqual(await store.getUsage("org_a", "req_1"), {
          requestId: "req_1",
          orgId: "org_a",
          keyId: "key_1",
          createdAtMs: T0 + 10,
          completedAtMs: T0 + 7000,
          source: "api",
          model: "jev-1",
          mode: "paid",
          outcome: "succeeded",
          httpStatus: 200,
          inputTokens: 40,
          outputTokens: 3,
          costMicrousd: 120,
          latencyMs: 812.5,
          gatewayLatencyMs: 830.25,
          errorDetail: null,
          overReservation: true,
          deployment: "svc-a",
          attempts: 1,
        } satisfies UsageRecord);
      });

      it("settles for exactly the reservation, and for 0", async () => {
        await funded("org_a", 1000);
        await admit(paid("req_1", "org_a", 300), paid("req_2", "org_a", 200));
        assert.deepEqual(
          await complete(
            completion({ requestId: "req_1", orgId: "org_a", costMicrousd: 300, reserved: true }),
            completion({ requestId: "req_2", orgId: "org_a", costMicrousd: 0, reserved: true }),
          ),
          [{ kind: "completed" }, { kind: "completed" }],
        );
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 700, reserved: 0, spent: 300, granted: 1000 });
        assert.equal((await store.getReservation("req_1"))?.costMicrousd, 300);
        assert.equal((await store.getReservation("req_2"))?.costMicrousd, 0);
        assert.equal((await store.getReservation("req_2"))?.status, "settled");
      });

      it("a cost above the reservation throws RangeError and the batch writes nothing; a bad cost is StoreInputError", async () => {
        await funded("org_a", 1000);
        await admit(paid("req_1", "org_a", 300), paid("req_2", "org_a", 100));
        const before = await books("org_a", ["req_1", "req_2", "req_3"]);
        await assert.rejects(
          store.commitBatch({
            admissions: [paid("req_3", "org_a", 50)],
            completions: [
              completion({ requestId: "req_2", orgId: "org_a", costMicrousd: 10, reserved: true }),
              completion({ requestId: "req_1", orgId: "org_a", costMicrousd: 301, reserved: true }),
            ],
          }),
          RangeError,
        );
        for (const costMicrousd of [-1, 1.5, Number.NaN]) {
          await assert.rejects(complete(completion({ requestId: "req_1", orgId: "org_a", costMicrousd, reserved: true })), StoreInputError);
        }
        assert.deepEqual(await books("org_a", ["req_1", "req_2", "req_3"]), before);
        assert.deepEqual(
          await complete(completion({ requestId: "req_1", orgId: "org_a", costMicrousd: 300, reserved: true })),
          [{ kind: "completed" }],
          "still in flight",
        );
      });

      it("a success at or after the reservation's expiry is reservation_expired: funds back, an expire entry, nothing charged", async () => {
        await funded("org_a", 1000);
        await admit(
          paid("req_1", "org_a", 300, { nowMs: T0, expiresAtMs: T0 + 5000 }),
          paid("req_2", "org_a", 100, { nowMs: T0, expiresAtMs: T0 + 5000 }),
        );
        const late = completion({
          requestId: "req_1",
          orgId: "org_a",
          nowMs: T0 + 5000,
          costMicrousd: 50,
          overReservation: true,
          reserved: true,
        });
        assert.deepEqual(await complete(late), [{ kind: "reservation_expired" }], "expiresAtMs ≤ nowMs");
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 900, reserved: 100, spent: 0, granted: 1000 });
        const r = await store.getReservation("req_1");
        assert.deepEqual([r?.status, r?.costMicrousd, r?.resolvedAtMs], ["expired", null, T0 + 5000]);
        assert.deepEqual(entryOf((await store.listLedger("org_a")).at(-1)), ["expire", "req_1", 0, 0, 0, 0, T0 + 5000]);
        assert.deepEqual(
          await store.getUsage("org_a", "req_1"),
          usageRecord({
            requestId: "req_1",
            orgId: "org_a",
            completedAtMs: T0 + 5000,
            outcome: "reservation_expired",
            httpStatus: 409,
            costMicrousd: 0,
            errorDetail: EXPIRED_DETAIL,
          }),
        );
        assert.deepEqual(await complete(late), [{ kind: "not_in_flight" }]);
        assert.deepEqual(
          await complete(completion({ requestId: "req_2", orgId: "org_a", nowMs: T0 + 4999, costMicrousd: 50, reserved: true })),
          [{ kind: "completed" }],
          "one millisecond before the expiry time",
        );
        assert.equal((await store.getReservation("req_2"))?.status, "settled");
      });

      it("a failed completion releases the whole amount, charges nothing and records the failure", async () => {
        await funded("org_a", 1000);
        await admit(paid("req_1", "org_a", 300));
        const failed = completion({
          requestId: "req_1",
          orgId: "org_a",
          nowMs: T0 + 9000,
          outcome: "model_error",
          httpStatus: 502,
          inputTokens: 80,
          outputTokens: 0,
          costMicrousd: 50,
          latencyMs: 30_000,
          errorDetail: "model timed out",
          reserved: true,
        });
        assert.deepEqual(await complete(failed), [{ kind: "completed" }]);
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 1000, reserved: 0, spent: 0, granted: 1000 });
        const r = await store.getReservation("req_1");
        assert.deepEqual([r?.status, r?.costMicrousd, r?.resolvedAtMs], ["released", null, T0 + 9000]);
        assert.deepEqual(entryOf((await store.listLedger("org_a")).at(-1)), ["release", "req_1", 0, 0, 0, 0, T0 + 9000]);
        assert.deepEqual(
          await store.getUsage("org_a", "req_1"),
          usageRecord({
            requestId: "req_1",
            orgId: "org_a",
            completedAtMs: T0 + 9000,
            outcome: "model_error",
            httpStatus: 502,
            inputTokens: 80,
            outputTokens: 0,
            costMicrousd: 0,
            latencyMs: 30_000,
            errorDetail: "model timed out",
          }),
        );
      });

      it("a failed completion after the reservation's expiry time still releases it: it stays pending while its request is in flight", async () => {
        await funded("org_a", 1000);
        await admit(paid("req_1", "org_a", 300, { nowMs: T0, expiresAtMs: T0 + 10 }));
        assert.deepEqual(await store.sweep({ nowMs: T0 + 20, inFlightBeforeMs: T0, limit: 10 }), { abandoned: 0 });
        assert.equal((await store.getReservation("req_1"))?.status, "pending");
        assert.deepEqual(
          await complete(
            completion({
              requestId: "req_1",
              orgId: "org_a",
              nowMs: T0 + 20,
              outcome: "context_rejected",
              httpStatus: 422,
              reserved: true,
            }),
          ),
          [{ kind: "completed" }],
        );
        assert.equal((await store.getReservation("req_1"))?.status, "released");
        assert.equal((await store.getUsage("org_a", "req_1"))?.outcome, "context_rejected");
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 1000, reserved: 0, spent: 0, granted: 1000 });
      });

      it("the ledger of a busy organization sums to its balance", async () => {
        await funded("org_a", 5000);
        await admit(paid("r1", "org_a", 1000), paid("r2", "org_a", 1500), paid("r3", "org_a", 700, { nowMs: T0, expiresAtMs: T0 + 1 }));
        await store.grantCredits({ orgId: "org_a", amountMicrousd: 250, nowMs: now() });
        await complete(
          completion({ requestId: "r1", orgId: "org_a", costMicrousd: 333, reserved: true }),
          completion({ requestId: "r2", orgId: "org_a", outcome: "model_error", httpStatus: 502, reserved: true }),
        );
        assert.deepEqual(await store.sweep({ nowMs: T0 + 10, inFlightBeforeMs: T0 + 10, limit: 10 }), { abandoned: 1 });
        const balance = await checkBalanceInvariants(store, "org_a");
        assert.deepEqual(balance, { available: 5250 - 333, reserved: 0, spent: 333, granted: 5250 });
        assert.deepEqual(
          (await store.listLedger("org_a")).map((e) => e.kind),
          ["grant", "grant", "settle", "release", "expire"],
          "one entry per paid request, at its resolution",
        );
      });

      it("N paid requests write exactly N ledger entries besides the grants, one each, whatever their outcome", async () => {
        await funded("org_a", 100_000);
        const N = 12;
        const ids = Array.from({ length: N }, (_, i) => `req_${i}`);
        await admit(...ids.map((id, i) => paid(id, "org_a", 1000 + i, { nowMs: T0, expiresAtMs: T0 + (i % 4 === 3 ? 5 : HOUR) })));
        assert.deepEqual(
          (await store.listLedger("org_a")).map((e) => e.kind),
          ["grant"],
          "admissions write no entry",
        );
        const outcome = (i: number) => (i % 4 === 1 ? { outcome: "model_error" as const, httpStatus: 502 } : {});
        // Released every fourth from the second; expired every fourth from the fourth (past expiry at completion, and the last by the sweep).
        await complete(
          ...ids
            .slice(0, N - 1)
            .map((id, i) =>
              completion({ requestId: id, orgId: "org_a", nowMs: T0 + 10, costMicrousd: i * 10, reserved: true, ...outcome(i) }),
            ),
        );
        assert.deepEqual(await store.sweep({ nowMs: T0 + 20, inFlightBeforeMs: T0 + 1, limit: 10 }), { abandoned: 1 });
        const entries = (await store.listLedger("org_a")).filter((e) => e.kind !== "grant");
        assert.equal(entries.length, N, "one entry per paid request");
        assert.deepEqual(entries.map((e) => e.reservationId).sort(), [...ids].sort(), "each for its own request");
        const kinds = (i: number) => (i === N - 1 ? "expire" : i % 4 === 3 ? "expire" : i % 4 === 1 ? "release" : "settle");
        assert.deepEqual(
          ids.map((id) => entries.find((e) => e.reservationId === id)?.kind),
          ids.map((_, i) => kinds(i)),
        );
        const spent = ids.reduce((sum, _, i) => sum + (kinds(i) === "settle" ? i * 10 : 0), 0);
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), {
          available: 100_000 - spent,
          reserved: 0,
          spent,
          granted: 100_000,
        });
      });
    });

    describe("preview quotas", () => {
      let n = 0;
      const consume = async (orgId: string, orgLimit: number, globalLimit: number, day = DAY) =>
        (await admit(preview(`req_p${++n}`, orgId, orgLimit, globalLimit, day)))[0];
      const ADMITTED = { kind: "admitted" };
      const ORG = { kind: "quota_exhausted", scope: "org" };
      const GLOBAL = { kind: "quota_exhausted", scope: "global" };

      it("counts up to the organization's limit, then says quota_exhausted org and counts nothing", async () => {
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 0, global: 0 });
        assert.deepEqual(await consume("org_a", 2, 10), ADMITTED);
        assert.deepEqual(await consume("org_a", 2, 10), ADMITTED);
        assert.deepEqual(await consume("org_a", 2, 10), ORG);
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 2, global: 2 });
        assert.equal(await store.getUsage("org_a", `req_p${n}`), null, "a refused request has no usage record");
        assert.deepEqual(await consume("org_b", 2, 10), ADMITTED, "another organization has its own count");
        assert.deepEqual(await store.previewUsage("org_b", DAY), { org: 1, global: 3 });
        assert.deepEqual(await consume("org_a", 3, 10), ADMITTED, "a higher limit allows more");
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 3, global: 4 });
        assert.equal((await store.listUsage("org_a", { limit: 10 })).records.length, 3, "one usage record per counted request");
        // The one-key read of the organization's own count agrees; another day, and an organization with none, count 0.
        assert.deepEqual(
          [await store.previewCount("org_a", DAY), await store.previewCount("org_b", DAY), await store.previewCount("org_a", "2026-01-09")],
          [3, 1, 0],
        );
        assert.equal(await store.previewCount("org_none", DAY), 0);
      });

      it("the service-wide limit counts every organization; a refused request counts nothing", async () => {
        assert.deepEqual(await consume("org_a", 10, 3), ADMITTED);
        assert.deepEqual(await consume("org_b", 10, 3), ADMITTED);
        assert.deepEqual(await consume("org_a", 10, 3), ADMITTED);
        assert.deepEqual(await consume("org_b", 10, 3), GLOBAL);
        assert.deepEqual(await consume("org_c", 10, 3), GLOBAL);
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 2, global: 3 });
        assert.deepEqual(await store.previewUsage("org_b", DAY), { org: 1, global: 3 });
        assert.deepEqual(await store.previewUsage("org_c", DAY), { org: 0, global: 3 });
        assert.deepEqual((await store.listUsage("org_c", { limit: 10 })).records, []);
      });

      it("reports the organization's limit first when both are reached", async () => {
        assert.deepEqual(await consume("org_a", 1, 1), ADMITTED);
        assert.deepEqual(await consume("org_a", 1, 1), ORG);
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 1, global: 1 });
      });

      it("a limit of 0 allows nothing", async () => {
        assert.deepEqual(await consume("org_a", 0, 10), ORG);
        assert.deepEqual(await consume("org_a", 10, 0), GLOBAL);
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 0, global: 0 });
      });

      it("each UTC day has its own counters", async () => {
        assert.deepEqual(await consume("org_a", 1, 1, "2026-01-01"), ADMITTED);
        assert.deepEqual(await consume("org_a", 1, 1, "2026-01-01"), ORG);
        assert.deepEqual(await consume("org_a", 1, 1, "2026-01-02"), ADMITTED);
        assert.deepEqual(await consume("org_b", 5, 1, "2025-12-31"), ADMITTED);
        assert.deepEqual(await store.previewUsage("org_a", "2026-01-01"), { org: 1, global: 1 });
        assert.deepEqual(await store.previewUsage("org_a", "2026-01-02"), { org: 1, global: 1 });
        assert.deepEqual(await store.previewUsage("org_a", "2025-12-31"), { org: 0, global: 1 });
        assert.deepEqual(await store.previewUsage("org_a", "2026-01-03"), { org: 0, global: 0 });
      });

      it("the quota stays consumed when the request fails or is abandoned: it has a usage record", async () => {
        await admit(preview("req_1", "org_a", 2, 10), preview("req_2", "org_a", 2, 10));
        await complete(completion({ requestId: "req_1", orgId: "org_a", outcome: "model_error", httpStatus: 502 }));
        assert.deepEqual(await store.sweep({ nowMs: T0 + HOUR, inFlightBeforeMs: T0 + 1, limit: 10 }), { abandoned: 1 });
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 2, global: 2 });
        assert.deepEqual(await consume("org_a", 2, 10), ORG);
        assert.deepEqual((await store.listUsage("org_a", { limit: 10 })).records.map((r) => r.outcome).sort(), [
          "gateway_error",
          "model_error",
        ]);
      });

      it("rejects a malformed day or limit, or the organization id *, with StoreInputError", async () => {
        for (const day of ["2026-1-1", "01/01/2026", "2026-01-01T00:00:00Z", "", "2026-13-01"]) {
          await assert.rejects(consume("org_a", 5, 5, day), StoreInputError, day);
          await assert.rejects(store.previewUsage("org_a", day), StoreInputError, day);
        }
        await assert.rejects(consume("org_a", -1, 5), StoreInputError);
        await assert.rejects(consume("org_a", 5, 1.5), StoreInputError);
        await assert.rejects(consume("*", 5, 5), StoreInputError);
        await assert.rejects(store.previewUsage("*", DAY), StoreInputError);
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 0, global: 0 });
        assert.deepEqual((await store.listUsage("org_a", { limit: 10 })).records, []);
      });
    });

    describe("idempotency keys", () => {
      let n = 0;
      const claim = async (
        nowMs: number,
        options: { key?: string; orgId?: string; hash?: string; lockMs?: number; ttlMs?: number; requestId?: string } = {},
      ) => {
        const requestId = options.requestId ?? `req_${++n}`;
        const orgId = options.orgId ?? "org_a";
        const idempotency = {
          key: options.key ?? "key-1",
          requestHash: options.hash ?? "hash-1",
          lockUntilMs: nowMs + (options.lockMs ?? MINUTE),
          expiresAtMs: nowMs + (options.ttlMs ?? DAY_MS),
        };
        return (await admit(admission({ requestId, orgId, nowMs, idempotency })))[0];
      };
      const response = (requestId: string, body = `{"request_id":"${requestId}","answers":{"q":"✓"}}`): StoredResponse => ({
        status: 200,
        body,
        requestId,
      });
      const succeed = async (requestId: string, options: { key?: string; orgId?: string; body?: string; nowMs?: number } = {}) =>
        (
          await complete(
            completion({
              requestId,
              orgId: options.orgId ?? "org_a",
              nowMs: options.nowMs ?? T0,
              idempotency: { key: options.key ?? "key-1", response: response(requestId, options.body) },
            }),
          )
        )[0];
      const fail = async (requestId: string, key = "key-1") =>
        (
          await complete(
            completion({
              requestId,
              orgId: "org_a",
              outcome: "model_error",
              httpStatus: 502,
              idempotency: { key, response: { status: 502, body: "{}", requestId } },
            }),
          )
        )[0];
      const ADMITTED = { kind: "admitted" };
      const IN_PROGRESS = { kind: "idempotency_in_progress" };
      const MISMATCH = { kind: "idempotency_mismatch" };

      it("claims a new key; while it runs, another admission is idempotency_in_progress whatever its body", async () => {
        assert.deepEqual(await claim(T0, { requestId: "req_1" }), ADMITTED);
        assert.deepEqual(await claim(T0 + 1000), IN_PROGRESS);
        assert.deepEqual(await claim(T0 + 1000, { hash: "hash-2" }), IN_PROGRESS);
        assert.deepEqual(await claim(T0 + MINUTE - 1), IN_PROGRESS, "the lock holds until lockUntilMs");
        assert.deepEqual(ids((await store.listUsage("org_a", { limit: 10 })).records), ["req_1"], "only the admitted request is recorded");
      });

      it("replays the completed response for the same body, and says mismatch for another body", async () => {
        await claim(T0, { requestId: "req_1" });
        assert.deepEqual(await succeed("req_1"), { kind: "completed" });
        assert.deepEqual(await claim(T0 + 1000), { kind: "replay", response: response("req_1") });
        assert.deepEqual(await claim(T0 + 2 * MINUTE), { kind: "replay", response: response("req_1") }, "long after the lock");
        assert.deepEqual(await claim(T0 + 1000, { hash: "hash-2" }), MISMATCH);
        assert.deepEqual(await claim(T0 + DAY_MS - 1), { kind: "replay", response: response("req_1") }, "until expiresAtMs");
        assert.deepEqual(ids((await store.listUsage("org_a", { limit: 10 })).records), ["req_1"], "a replay is not a new request");
      });

      it("keeps a response of up to MAX_KEPT_RESPONSE_BYTES UTF-8 bytes; for a larger one says replay_not_kept with its request id", async () => {
        const exact = JSON.stringify("é".repeat((MAX_KEPT_RESPONSE_BYTES - 2) / 2));
        const over = JSON.stringify(`${"é".repeat((MAX_KEPT_RESPONSE_BYTES - 2) / 2)}x`);
        assert.equal(Buffer.byteLength(exact, "utf8"), MAX_KEPT_RESPONSE_BYTES);
        assert.equal(Buffer.byteLength(over, "utf8"), MAX_KEPT_RESPONSE_BYTES + 1);
        await claim(T0, { requestId: "req_exact", key: "k-exact" });
        await claim(T0, { requestId: "req_over", key: "k-over" });
        await succeed("req_exact", { key: "k-exact", body: exact });
        await succeed("req_over", { key: "k-over", body: over });
        assert.deepEqual(await claim(T0 + 1, { key: "k-exact" }), { kind: "replay", response: response("req_exact", exact) });
        assert.deepEqual(await claim(T0 + 1, { key: "k-over" }), { kind: "replay_not_kept", requestId: "req_over" });
        assert.deepEqual(await claim(T0 + 2, { key: "k-over", hash: "hash-2" }), MISMATCH, "the body still counts");
        assert.deepEqual(await claim(T0 + DAY_MS, { key: "k-over", hash: "hash-2" }), ADMITTED, "until it expires");
      });

      it("keys are scoped to the organization", async () => {
        await claim(T0, { requestId: "req_1" });
        await succeed("req_1");
        assert.deepEqual(await claim(T0 + 1, { orgId: "org_b" }), ADMITTED);
        assert.deepEqual(await claim(T0 + 1, { key: "key-2" }), ADMITTED);
        assert.deepEqual(await claim(T0 + 2, { orgId: "org_b" }), IN_PROGRESS);
      });

      it("a failed completion drops the claim: a retry with the same key runs anew, whatever its body", async () => {
        await claim(T0, { requestId: "req_1" });
        assert.deepEqual(await fail("req_1"), { kind: "completed" });
        assert.deepEqual(await claim(T0 + 1, { requestId: "req_2", hash: "hash-2" }), ADMITTED);
        assert.deepEqual(await claim(T0 + 2), IN_PROGRESS);
        await succeed("req_2");
        assert.deepEqual(await claim(T0 + 3, { hash: "hash-2" }), { kind: "replay", response: response("req_2") });
      });

      it("a success that finds its reservation expired drops the claim", async () => {
        await funded("org_a", 1000);
        const idempotency = { key: "key-1", requestHash: "hash-1", lockUntilMs: T0 + MINUTE, expiresAtMs: T0 + DAY_MS };
        await admit({ ...paid("req_1", "org_a", 300, { nowMs: T0, expiresAtMs: T0 + 10 }), idempotency });
        const late = completion({
          requestId: "req_1",
          orgId: "org_a",
          nowMs: T0 + 10,
          costMicrousd: 100,
          reserved: true,
          idempotency: { key: "key-1", response: response("req_1") },
        });
        assert.deepEqual(await complete(late), [{ kind: "reservation_expired" }]);
        assert.deepEqual(await claim(T0 + 11, { requestId: "req_2" }), ADMITTED);
      });

      it("only the request that holds the claim completes or drops it", async () => {
        await claim(T0, { requestId: "req_1" });
        assert.deepEqual(
          await claim(T0 + MINUTE, { requestId: "req_2", hash: "hash-2" }),
          ADMITTED,
          "lockUntilMs ≤ nowMs: the lock passed",
        );
        assert.deepEqual(await succeed("req_1"), { kind: "completed" }, "req_1 itself completes");
        assert.deepEqual(await claim(T0 + MINUTE + 1, { hash: "hash-2" }), IN_PROGRESS, "but req_2's claim is untouched");
        await claim(T0 + MINUTE, { requestId: "req_3", key: "key-2" });
        assert.deepEqual(await fail("req_3", "key-1"), { kind: "completed" });
        assert.deepEqual(await claim(T0 + MINUTE + 2, { hash: "hash-2" }), IN_PROGRESS, "a stranger's failure does not drop it");
        await succeed("req_2");
        assert.deepEqual(await claim(T0 + MINUTE + 3, { hash: "hash-2" }), { kind: "replay", response: response("req_2") });
        assert.deepEqual(await claim(T0 + MINUTE + 3), MISMATCH, "the new claim's body counts now");
        assert.deepEqual(await claim(T0 + MINUTE + 3, { key: "key-2" }), IN_PROGRESS, "req_3's own claim is untouched too");
      });

      it("takes over an expired entry, completed or not", async () => {
        await claim(T0, { requestId: "req_1", ttlMs: 10 * MINUTE });
        await succeed("req_1");
        assert.deepEqual(await claim(T0 + 10 * MINUTE, { requestId: "req_2", hash: "hash-2" }), ADMITTED, "expiresAtMs ≤ nowMs");
        await succeed("req_2");
        assert.deepEqual(await claim(T0 + 10 * MINUTE + 1, { hash: "hash-2" }), { kind: "replay", response: response("req_2") });

        await claim(T0, { key: "key-2", lockMs: DAY_MS, ttlMs: MINUTE });
        assert.deepEqual(await claim(T0 + MINUTE, { key: "key-2" }), ADMITTED, "expired although its lock had not passed");
      });

      it("replays a stored body byte for byte", async () => {
        const body = '{"z":1,"a":"é\\u00e9 👩‍💻","n":1.50}';
        await claim(T0, { requestId: "req_1" });
        await succeed("req_1", { body });
        assert.deepEqual(await claim(T0 + 1), { kind: "replay", response: { status: 200, body, requestId: "req_1" } });
      });
    });

    describe("sweep", () => {
      it("completes requests in flight since before inFlightBeforeMs as gateway_error, expiring their reservations, oldest first, at most limit", async () => {
        await funded("org_a", 10_000);
        await admit(
          paid("req_p1", "org_a", 100),
          { ...preview("req_v1", "org_a", 5, 5), nowMs: T0 + 5 },
          paid("req_p2", "org_a", 200, { nowMs: T0 + 10 }),
          paid("req_late", "org_a", 400, { nowMs: T0 + 20 }),
          paid("req_done", "org_a", 800, { nowMs: T0 + 1 }),
        );
        await complete(completion({ requestId: "req_done", orgId: "org_a", nowMs: T0 + 2, costMicrousd: 8, reserved: true }));
        const sweep = (limit: number, nowMs = T0 + 1000) => store.sweep({ nowMs, inFlightBeforeMs: T0 + 20, limit });
        assert.deepEqual(await sweep(0), { abandoned: 0 });
        assert.deepEqual(await sweep(2), { abandoned: 2 });
        const outcomes = async () =>
          Promise.all(["req_p1", "req_v1", "req_p2", "req_late"].map(async (id) => (await store.getUsage("org_a", id))?.outcome));
        assert.deepEqual(await outcomes(), ["gateway_error", "gateway_error", "in_flight", "in_flight"], "the oldest two");
        assert.deepEqual(await sweep(2, T0 + 2000), { abandoned: 1 });
        assert.deepEqual(await sweep(2, T0 + 2000), { abandoned: 0 });
        assert.deepEqual(
          await outcomes(),
          ["gateway_error", "gateway_error", "gateway_error", "in_flight"],
          "created at inFlightBeforeMs: not abandoned",
        );

        const abandoned = (requestId: string, createdAtMs: number, completedAtMs: number, mode: UsageRecord["mode"]): UsageRecord => ({
          ...usageRecord({ requestId, orgId: "org_a", createdAtMs, outcome: "in_flight", mode }),
          completedAtMs,
          outcome: "gateway_error",
          errorDetail: ABANDONED_DETAIL,
        });
        assert.deepEqual(await store.getUsage("org_a", "req_p1"), abandoned("req_p1", T0, T0 + 1000, "paid"));
        assert.deepEqual(await store.getUsage("org_a", "req_v1"), abandoned("req_v1", T0 + 5, T0 + 1000, "preview"));
        assert.deepEqual(await store.getUsage("org_a", "req_p2"), abandoned("req_p2", T0 + 10, T0 + 2000, "paid"));
        for (const [id, at] of [
          ["req_p1", T0 + 1000],
          ["req_p2", T0 + 2000],
        ] as const) {
          const r = await store.getReservation(id);
          assert.deepEqual([r?.status, r?.costMicrousd, r?.resolvedAtMs], ["expired", null, at], id);
        }
        assert.equal((await store.getReservation("req_late"))?.status, "pending");
        assert.equal((await store.getReservation("req_done"))?.status, "settled");
        assert.deepEqual((await store.listLedger("org_a")).filter((e) => e.kind === "expire").map(entryOf), [
          ["expire", "req_p1", 0, 0, 0, 0, T0 + 1000],
          ["expire", "req_p2", 0, 0, 0, 0, T0 + 2000],
        ]);
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), {
          available: 10_000 - 400 - 8,
          reserved: 400,
          spent: 8,
          granted: 10_000,
        });
        assert.deepEqual(await store.previewUsage("org_a", DAY), { org: 1, global: 1 }, "the quota stays consumed");

        const before = await books("org_a", ["req_p1", "req_v1", "req_p2"]);
        assert.deepEqual(
          await complete(
            completion({ requestId: "req_p1", orgId: "org_a", nowMs: T0 + 3000, costMicrousd: 50, reserved: true }),
            completion({ requestId: "req_v1", orgId: "org_a", nowMs: T0 + 3000 }),
          ),
          [{ kind: "not_in_flight" }, { kind: "not_in_flight" }],
          "a completion arriving after the sweep changes nothing",
        );
        assert.deepEqual(await books("org_a", ["req_p1", "req_v1", "req_p2"]), before);
      });

      it("a reservation is pending exactly while its request is in flight: a completion that does not name it fails and writes nothing", async () => {
        await funded("org_a", 1000);
        await admit(paid("req_1", "org_a", 300, { nowMs: T0, expiresAtMs: T0 + 5 }));
        const before = await books("org_a", ["req_1"]);
        await assert.rejects(
          complete(completion({ requestId: "req_1", orgId: "org_a", nowMs: T0 + 1, outcome: "model_error", httpStatus: 502 })),
          /holds a reservation its completion does not name/,
        );
        assert.deepEqual(await books("org_a", ["req_1"]), before);
        assert.deepEqual(await store.sweep({ nowMs: T0 + 20, inFlightBeforeMs: T0, limit: 10 }), { abandoned: 0 });
        assert.equal((await store.getReservation("req_1"))?.status, "pending", "past its expiry, but its request is in flight");
        assert.deepEqual(
          await complete(completion({ requestId: "req_1", orgId: "org_a", nowMs: T0 + 21, costMicrousd: 5, reserved: true })),
          [{ kind: "reservation_expired" }],
          "the request in flight finds its reservation past expiry at completion",
        );
        assert.deepEqual((await store.listLedger("org_a")).map(entryOf).at(-1), ["expire", "req_1", 0, 0, 0, 0, T0 + 21]);
        assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 1000, reserved: 0, spent: 0, granted: 1000 });
      });
    });

    describe("purge", () => {
      it("deletes exactly the idempotency entries expired at nowMs and the counters of days before keepFromDay, at most limit of each", async () => {
        const keyed = (requestId: string, key: string, nowMs: number, expiresAtMs: number, lockUntilMs = nowMs + MINUTE) =>
          admission({ requestId, orgId: "org_a", nowMs, idempotency: { key, requestHash: "hash-1", lockUntilMs, expiresAtMs } });
        await admit(
          keyed("req_old1", "k-old1", T0, T0 + 100),
          keyed("req_old2", "k-old2", T0, T0 + 200),
          keyed("req_edge", "k-edge", T0, T0 + 300),
          keyed("req_keep", "k-keep", T0, T0 + 301),
          keyed("req_keep2", "k-keep2", T0, T0 + DAY_MS, T0 + DAY_MS),
        );
        const kept = (requestId: string): StoredResponse => ({ status: 200, body: `{"id":"${requestId}"}`, requestId });
        await complete(
          ...["req_old1", "req_edge", "req_keep"].map((id) =>
            completion({
              requestId: id,
              orgId: "org_a",
              nowMs: T0 + 50,
              idempotency: { key: id.replace("req_", "k-"), response: kept(id) },
            }),
          ),
        );
        await admit(
          preview("req_d1", "org_a", 9, 9, "2025-12-30"),
          preview("req_d2", "org_a", 9, 9, "2025-12-31"),
          preview("req_d3", "org_b", 9, 9, "2025-12-31"),
          preview("req_d4", "org_a", 9, 9, "2026-01-01"),
          preview("req_d5", "org_b", 9, 9, "2026-01-02"),
        );
        const usageBefore = [await store.listUsage("org_a", { limit: 200 }), await store.listUsage("org_b", { limit: 200 })];
        const purge = (limit: number) => store.purge({ nowMs: T0 + 300, keepFromDay: "2026-01-01", limit });
        // Old counters: (org_a, 12-30), (*, 12-30), (org_a, 12-31), (org_b, 12-31), (*, 12-31).
        assert.deepEqual(await purge(0), { idempotencyKeys: 0, previewCounters: 0 });
        assert.deepEqual(await purge(2), { idempotencyKeys: 2, previewCounters: 2 });
        assert.deepEqual(await purge(2), { idempotencyKeys: 1, previewCounters: 2 });
        assert.deepEqual(await purge(2), { idempotencyKeys: 0, previewCounters: 1 });
        assert.deepEqual(await purge(2), { idempotencyKeys: 0, previewCounters: 0 });

        for (const day of ["2025-12-30", "2025-12-31"]) {
          assert.deepEqual(await store.previewUsage("org_a", day), { org: 0, global: 0 }, day);
          assert.deepEqual(await store.previewUsage("org_b", day), { org: 0, global: 0 }, day);
        }
        assert.deepEqual(await store.previewUsage("org_a", "2026-01-01"), { org: 1, global: 1 });
        assert.deepEqual(await store.previewUsage("org_b", "2026-01-02"), { org: 1, global: 1 });
        assert.deepEqual(
          [await store.listUsage("org_a", { limit: 200 }), await store.listUsage("org_b", { limit: 200 })],
          usageBefore,
          "usage records are kept",
        );
        const probe = (requestId: string, key: string) =>
          admission({
            requestId,
            orgId: "org_a",
            nowMs: T0 + 300,
            idempotency: { key, requestHash: "hash-1", lockUntilMs: T0 + 400, expiresAtMs: T0 + DAY_MS },
          });
        assert.deepEqual(await admit(probe("req_x1", "k-keep"), probe("req_x2", "k-keep2")), [
          { kind: "replay", response: kept("req_keep") },
          { kind: "idempotency_in_progress" },
        ]);
      });

      it("rejects bad arguments with StoreInputError", async () => {
        await assert.rejects(store.purge({ nowMs: Number.NaN, keepFromDay: DAY, limit: 10 }), StoreInputError);
        await assert.rejects(store.purge({ nowMs: T0, keepFromDay: "2026-13-01", limit: 10 }), StoreInputError);
        await assert.rejects(store.purge({ nowMs: T0, keepFromDay: DAY, limit: -1 }), StoreInputError);
        await assert.rejects(store.purge({ nowMs: T0, keepFromDay: DAY, limit: 1.5 }), StoreInputError);
        await assert.rejects(store.sweep({ nowMs: Number.NaN, inFlightBeforeMs: T0, limit: 10 }), StoreInputError);
        await assert.rejects(store.sweep({ nowMs: T0, inFlightBeforeMs: 1.5, limit: 10 }), StoreInputError);
        await assert.rejects(store.sweep({ nowMs: T0, inFlightBeforeMs: T0, limit: -1 }), StoreInputError);
      });
    });

    describe("input checks", () => {
      it("refuses a malformed command with StoreInputError naming the field, before anything of its batch is written", async () => {
        await funded("org_a", 1000);
        await admit(paid("req_live", "org_a", 100));
        const a = (overrides: Partial<AdmitCommand>) => admission({ requestId: "req_bad", orgId: "org_a", ...overrides });
        const idem = { key: "k", requestHash: "h", lockUntilMs: T0 + 1, expiresAtMs: T0 + 2 };
        const quota = { day: DAY, orgLimit: 5, globalLimit: 5 };
        const reservation = { amountMicrousd: 5, expiresAtMs: T0 + 5 };
        const badAdmissions: [AdmitCommand, string][] = [
          [a({ requestId: "" }), "requestId"],
          [a({ orgId: "" }), "orgId"],
          [a({ keyId: "" }), "keyId"],
          [a({ nowMs: 1.5 }), "nowMs"],
          [a({ nowMs: Number.NaN }), "nowMs"],
          [a({ idempotency: { ...idem, key: "" } }), "idempotency.key"],
          [a({ idempotency: { ...idem, requestHash: "" } }), "idempotency.requestHash"],
          [a({ idempotency: { ...idem, lockUntilMs: Number.NaN } }), "idempotency.lockUntilMs"],
          [a({ idempotency: { ...idem, expiresAtMs: Number.POSITIVE_INFINITY } }), "idempotency.expiresAtMs"],
          [a({ quota: { ...quota, day: "2026-1-1" } }), "quota.day"],
          [a({ quota: { ...quota, orgLimit: -1 } }), "quota.orgLimit"],
          [a({ quota: { ...quota, globalLimit: 1.5 } }), "quota.globalLimit"],
          [a({ quota: { ...quota, globalBlock: 0 } }), "quota.globalBlock"],
          [a({ quota: { ...quota, globalBlock: 2.5 } }), "quota.globalBlock"],
          [a({ orgId: "*", quota }), "orgId"],
          [a({ reservation: { ...reservation, amountMicrousd: -1 } }), "reservation.amountMicrousd"],
          [a({ reservation: { ...reservation, amountMicrousd: 2 ** 53 } }), "reservation.amountMicrousd"],
          [a({ reservation: { ...reservation, expiresAtMs: Number.NaN } }), "reservation.expiresAtMs"],
        ];
        const c = (overrides: Partial<CompleteCommand>) =>
          completion({ requestId: "req_live", orgId: "org_a", reserved: true, ...overrides });
        const kept = { status: 200, body: "{}", requestId: "req_live" };
        const badCompletions: [CompleteCommand, string][] = [
          [c({ requestId: "" }), "requestId"],
          [c({ orgId: "" }), "orgId"],
          [c({ nowMs: Number.NaN }), "nowMs"],
          [c({ httpStatus: 99 }), "httpStatus"],
          [c({ httpStatus: 600 }), "httpStatus"],
          [c({ httpStatus: 200.5 }), "httpStatus"],
          [c({ inputTokens: -1 }), "inputTokens"],
          [c({ outputTokens: 1.5 }), "outputTokens"],
          [c({ costMicrousd: -1 }), "costMicrousd"],
          [c({ idempotency: { key: "", response: null } }), "idempotency.key"],
          [c({ idempotency: { key: "k", response: { ...kept, status: 700 } } }), "idempotency.response.status"],
          [c({ idempotency: { key: "k", response: { ...kept, body: 5 as unknown as string } } }), "idempotency.response.body"],
          [c({ idempotency: { key: "k", response: { ...kept, requestId: "" } } }), "idempotency.response.requestId"],
        ];
        const before = await books("org_a", ["req_live", "req_ok", "req_bad"]);
        const good = {
          admission: paid("req_ok", "org_a", 10),
          completion: completion({ requestId: "req_live", orgId: "org_a", costMicrousd: 10, reserved: true }),
        };
        for (const [bad, field] of badAdmissions) {
          await assert.rejects(store.commitBatch({ admissions: [good.admission, bad], completions: [good.completion] }), (err) => {
            assert.ok(err instanceof StoreInputError, String(err));
            assert.equal(err.field, field);
            return true;
          });
        }
        for (const [bad, field] of badCompletions) {
          await assert.rejects(store.commitBatch({ admissions: [good.admission], completions: [good.completion, bad] }), (err) => {
            assert.ok(err instanceof StoreInputError, String(err));
            assert.equal(err.field, field);
            return true;
          });
        }
        assert.deepEqual(await books("org_a", ["req_live", "req_ok", "req_bad"]), before);
        assert.deepEqual(await store.commitBatch({ admissions: [good.admission], completions: [good.completion] }), {
          admissions: [{ kind: "admitted" }],
          completions: [{ kind: "completed" }],
        });
      });
    });

    describe("invariants", () => {
      it("keeps invariants 1–3 under random batches, duplicate deliveries, sweeps with clock jumps and grants (property)", async () => {
        interface AdmitSpec {
          org: number;
          preview: boolean;
          amount: number;
          ttl: number;
          orgLimit: number;
          globalLimit: number;
        }
        interface CompleteSpec {
          pick: number;
          success: boolean;
          costPercent: number;
          /** Charge one microUSD more than reserved: the batch must fail with RangeError if it settles. */
          over: boolean;
          /** Complete without naming the reservation the request holds (reserved: false): the batch must fail. */
          keep: boolean;
        }
        type Cmd =
          | { t: "grant"; org: number; amount: number }
          | { t: "batch"; admits: AdmitSpec[]; completes: CompleteSpec[] }
          | { t: "redeliver"; pick: number; success: boolean }
          | { t: "sweep"; advance: number; inFlightTtl: number; limit: number }
          | { t: "tick"; advance: number };
        const orgIdx = fc.integer({ min: 0, max: 1 });
        const admitArb: fc.Arbitrary<AdmitSpec> = fc.record({
          org: orgIdx,
          preview: fc.integer({ min: 0, max: 2 }).map((n) => n === 0),
          amount: fc.integer({ min: 0, max: 400 }),
          ttl: fc.integer({ min: 0, max: 12 }),
          orgLimit: fc.integer({ min: 0, max: 4 }),
          globalLimit: fc.integer({ min: 0, max: 6 }),
        });
        const completeArb: fc.Arbitrary<CompleteSpec> = fc.record({
          pick: fc.nat(),
          success: fc.boolean(),
          costPercent: fc.integer({ min: 0, max: 100 }),
          over: fc.integer({ min: 0, max: 19 }).map((n) => n === 0),
          keep: fc.integer({ min: 0, max: 9 }).map((n) => n === 0),
        });
        const cmd: fc.Arbitrary<Cmd> = fc.oneof(
          { arbitrary: fc.record({ t: fc.constant("grant" as const), org: orgIdx, amount: fc.integer({ min: 1, max: 1000 }) }), weight: 2 },
          {
            arbitrary: fc.record({
              t: fc.constant("batch" as const),
              admits: fc.array(admitArb, { maxLength: 3 }),
              completes: fc.array(completeArb, { maxLength: 3 }),
            }),
            weight: 6,
          },
          fc.record({ t: fc.constant("redeliver" as const), pick: fc.nat(), success: fc.boolean() }),
          {
            arbitrary: fc.record({
              t: fc.constant("sweep" as const),
              advance: fc.integer({ min: 0, max: 8 }),
              inFlightTtl: fc.integer({ min: 0, max: 10 }),
              limit: fc.integer({ min: 1, max: 3 }),
            }),
            weight: 2,
          },
          fc.record({ t: fc.constant("tick" as const), advance: fc.integer({ min: 1, max: 8 }) }),
        );
        const FAILURES = [
          ["model_error", 502],
          ["context_rejected", 422],
          ["gateway_error", 500],
        ] as const;

        interface ModelRequest {
          id: string;
          orgId: string;
          amount: number;
          createdAtMs: number;
          expiresAtMs: number;
          outcome: UsageOutcome;
          httpStatus: number | null;
          cost: number;
          /** null for a preview request. */
          reservation: ReservationStatus | null;
          /** The stored reservation once resolved: it must never change again. */
          resolved: Reservation | null;
        }
        interface Model {
          balances: Map<string, Balance>;
          grants: Map<string, number>;
          requests: Map<string, ModelRequest>;
          previews: Map<string, number>;
          global: number;
        }
        const RANGE_ERROR = "RangeError" as const;
        const UNNAMED = "a reservation its completion does not name" as const;

        /** What the store must answer for a batch, applied to the model; RANGE_ERROR or UNNAMED when the whole batch must fail. */
        function decide(m: Model, admissions: AdmitCommand[], completions: CompleteCommand[]) {
          const completed: CompleteResult[] = [];
          for (const c of completions) {
            const r = m.requests.get(c.requestId);
            if (r?.outcome !== "in_flight") {
              completed.push({ kind: "not_in_flight" });
              continue;
            }
            if (!c.reserved && r.reservation === "pending") return UNNAMED;
            const b = m.balances.get(r.orgId)!;
            r.outcome = c.outcome;
            r.httpStatus = c.httpStatus;
            r.cost = 0;
            if (!c.reserved) {
              completed.push({ kind: "completed" });
            } else if (c.outcome === "succeeded" && r.expiresAtMs <= c.nowMs) {
              r.reservation = "expired";
              b.available += r.amount;
              b.reserved -= r.amount;
              r.outcome = "reservation_expired";
              r.httpStatus = 409;
              completed.push({ kind: "reservation_expired" });
            } else if (c.outcome === "succeeded") {
              if (c.costMicrousd > r.amount) return RANGE_ERROR;
              r.reservation = "settled";
              r.cost = c.costMicrousd;
              b.available += r.amount - c.costMicrousd;
              b.reserved -= r.amount;
              b.spent += c.costMicrousd;
              completed.push({ kind: "completed" });
            } else {
              r.reservation = "released";
              b.available += r.amount;
              b.reserved -= r.amount;
              completed.push({ kind: "completed" });
            }
          }
          const admitted: AdmitResult[] = [];
          for (const a of admissions) {
            const b = m.balances.get(a.orgId)!;
            const counted = m.previews.get(a.orgId) ?? 0;
            if (a.quota && counted >= a.quota.orgLimit) {
              admitted.push({ kind: "quota_exhausted", scope: "org" });
            } else if (a.quota && m.global >= a.quota.globalLimit) {
              admitted.push({ kind: "quota_exhausted", scope: "global" });
            } else if (a.reservation && b.available < a.reservation.amountMicrousd) {
              admitted.push({ kind: "insufficient_credits", availableMicrousd: b.available });
            } else {
              const amount = a.reservation?.amountMicrousd ?? 0;
              if (a.quota) {
                m.previews.set(a.orgId, counted + 1);
                m.global += 1;
              } else {
                b.available -= amount;
                b.reserved += amount;
              }
              m.requests.set(a.requestId, {
                id: a.requestId,
                orgId: a.orgId,
                amount,
                createdAtMs: a.nowMs,
                expiresAtMs: a.reservation?.expiresAtMs ?? 0,
                outcome: "in_flight",
                httpStatus: null,
                cost: 0,
                reservation: a.reservation ? "pending" : null,
                resolved: null,
              });
              admitted.push({ kind: "admitted" });
            }
          }
          return { admissions: admitted, completions: completed };
        }

        let runs = 0;
        await fc.assert(
          fc.asyncProperty(fc.array(cmd, { minLength: 1, maxLength: 40, size: "max" }), async (cmds) => {
            // One store for all runs: each run has its own organizations, ids and preview day, and ends by sweeping
            // everything it left in flight or pending, so the global sweep of a later run sees only its own.
            const s = store;
            const run = runs++;
            const day = utcDay(T0 + run * DAY_MS);
            try {
              const orgIds = [`org_r${run}_0`, `org_r${run}_1`];
              let t = T0;
              for (const id of orgIds) await s.createOrganization({ id, name: id, nowMs: t });
              let m: Model = {
                balances: new Map(orgIds.map((id) => [id, { ...ZERO_BALANCE }])),
                grants: new Map(orgIds.map((id) => [id, 0])),
                requests: new Map(),
                previews: new Map(),
                global: 0,
              };
              /** Every request id tried, admitted or not, with its organization. */
              const tried: { id: string; orgId: string }[] = [];

              const checkReservation = async (r: ModelRequest) => {
                const got = await s.getReservation(r.id);
                assert.ok(got, r.id);
                assert.deepEqual(
                  [got.status, got.orgId, got.requestId, got.amountMicrousd, got.costMicrousd, got.expiresAtMs],
                  [r.reservation, r.orgId, r.id, r.amount, r.reservation === "settled" ? r.cost : null, r.expiresAtMs],
                  r.id,
                );
                if (got.costMicrousd !== null) assert.ok(got.costMicrousd <= got.amountMicrousd, "settled cost ≤ reservation");
                if (r.resolved) assert.deepEqual(got, r.resolved, "a resolved reservation never changes");
                else if (got.status !== "pending") r.resolved = got;
              };

              const check = async (touched: Iterable<string>, rejected: string[]) => {
                await Promise.all(
                  orgIds.map(async (orgId) => {
                    const balance = await checkBalanceInvariants(s, orgId);
                    assert.deepEqual(balance, m.balances.get(orgId), `the balance the model expects for ${orgId}`);
                    const mine = [...m.requests.values()].filter((r) => r.orgId === orgId);
                    const paidOnes = mine.filter((r) => r.reservation !== null);
                    const pending = paidOnes.filter((r) => r.reservation === "pending").reduce((sum, r) => sum + r.amount, 0);
                    assert.equal(balance.reserved, pending, "reserved = sum of pending reservations");
                    // A reservation has no entry while pending, and once resolved exactly one: settle (its cost), release or expire (no change).
                    const ledger = await s.listLedger(orgId);
                    assert.equal(ledger.filter((e) => e.reservationId === null && e.kind === "grant").length, m.grants.get(orgId));
                    const byReservation = new Map<string, unknown[][]>();
                    assert.equal(
                      ledger.length - (m.grants.get(orgId) ?? 0),
                      paidOnes.filter((r) => r.reservation !== "pending").length,
                      "one ledger entry per resolved paid request",
                    );
                    for (const e of ledger) {
                      if (e.reservationId === null) continue;
                      const list = byReservation.get(e.reservationId) ?? [];
                      list.push([e.kind, e.availableDelta, e.reservedDelta, e.spentDelta, e.grantedDelta]);
                      byReservation.set(e.reservationId, list);
                    }
                    const resolved = paidOnes.filter((r) => r.reservation !== "pending");
                    assert.deepEqual(
                      [...byReservation.keys()].sort(),
                      resolved.map((r) => r.id).sort(),
                      "ledger entries only for resolved reservations",
                    );
                    for (const r of resolved) {
                      assert.ok(r.cost <= r.amount);
                      const resolution = {
                        settled: ["settle", 0 - r.cost, 0, r.cost, 0],
                        released: ["release", 0, 0, 0, 0],
                        expired: ["expire", 0, 0, 0, 0],
                      }[r.reservation as Exclude<ReservationStatus, "pending">];
                      assert.deepEqual(byReservation.get(r.id), [resolution], `the ledger of ${r.id}`);
                    }
                    // Exactly one usage record per admitted request: in flight, or final with the outcome the model expects.
                    const usage = (await listAll(s, orgId, { limit: 200 })).records;
                    assert.equal(new Set(ids(usage)).size, usage.length, "never two records of one request");
                    const row = (id: string, outcome: UsageOutcome, cost: number, status: number | null, final: boolean) =>
                      JSON.stringify([id, outcome, cost, status, final]);
                    assert.deepEqual(
                      usage.map((u) => row(u.requestId, u.outcome, u.costMicrousd, u.httpStatus, u.completedAtMs !== null)).sort(),
                      mine.map((r) => row(r.id, r.outcome, r.cost, r.httpStatus, r.outcome !== "in_flight")).sort(),
                    );
                    assert.deepEqual(await s.previewUsage(orgId, day), { org: m.previews.get(orgId) ?? 0, global: m.global });
                  }),
                );
                for (const id of rejected) assert.equal(await s.getReservation(id), null, `no reservation for the rejected ${id}`);
                for (const id of touched) {
                  const r = m.requests.get(id);
                  if (r?.reservation) await checkReservation(r);
                }
              };

              const commit = async (admissions: AdmitCommand[], completions: CompleteCommand[]) => {
                const next = structuredClone(m);
                const expected = decide(next, admissions, completions);
                const call = s.commitBatch({ admissions, completions });
                if (expected === RANGE_ERROR) {
                  await assert.rejects(call, RangeError);
                } else if (expected === UNNAMED) {
                  await assert.rejects(call, new RegExp(UNNAMED));
                } else {
                  assert.deepEqual(await call, expected);
                  m = next;
                }
                tried.push(...admissions.map((a) => ({ id: a.requestId, orgId: a.orgId })));
                const touched = [...admissions, ...completions].map((x) => x.requestId);
                await check(
                  touched,
                  touched.filter((id) => !m.requests.has(id)),
                );
              };

              const completionOf = (
                target: { id: string; orgId: string },
                spec: { pick: number; success: boolean; costPercent?: number; over?: boolean; keep?: boolean },
              ) => {
                const r = m.requests.get(target.id);
                const amount = r?.amount ?? 0;
                const cost = spec.over ? amount + 1 : Math.floor((amount * (spec.costPercent ?? 0)) / 100);
                const [outcome, httpStatus] = spec.success ? (["succeeded", 200] as const) : FAILURES[spec.pick % FAILURES.length]!;
                return completion({
                  requestId: target.id,
                  orgId: target.orgId,
                  nowMs: t,
                  outcome,
                  httpStatus,
                  costMicrousd: cost,
                  reserved: (r?.reservation ?? null) !== null && !spec.keep,
                });
              };

              const sweep = async (inFlightBeforeMs: number, limit: number) => {
                const all = [...m.requests.values()];
                const dueInFlight = all.filter((r) => r.outcome === "in_flight" && r.createdAtMs < inFlightBeforeMs);
                const got = await s.sweep({ nowMs: t, inFlightBeforeMs, limit });
                assert.deepEqual(got, { abandoned: Math.min(limit, dueInFlight.length) });
                // Oldest first; among equal times the store may take any.
                const abandoned = [];
                for (const r of dueInFlight) if ((await s.getUsage(r.orgId, r.id))?.outcome === "gateway_error") abandoned.push(r);
                assert.equal(abandoned.length, got.abandoned);
                for (const r of dueInFlight)
                  if (!abandoned.includes(r))
                    assert.ok(
                      abandoned.every((a) => a.createdAtMs <= r.createdAtMs),
                      "oldest in flight first",
                    );
                for (const r of abandoned) {
                  r.outcome = "gateway_error";
                  r.httpStatus = null;
                  r.cost = 0;
                  if (r.reservation === "pending") {
                    r.reservation = "expired";
                    const b = m.balances.get(r.orgId)!;
                    b.available += r.amount;
                    b.reserved -= r.amount;
                  }
                }
                await check(
                  dueInFlight.map((r) => r.id),
                  [],
                );
              };

              for (const c of cmds) {
                switch (c.t) {
                  case "grant": {
                    const orgId = orgIds[c.org]!;
                    const got = await s.grantCredits({ orgId, amountMicrousd: c.amount, nowMs: t });
                    const b = m.balances.get(orgId)!;
                    b.available += c.amount;
                    b.granted += c.amount;
                    m.grants.set(orgId, m.grants.get(orgId)! + 1);
                    assert.deepEqual(got, b);
                    await check([], []);
                    break;
                  }
                  case "batch": {
                    const admissions = c.admits.map((a, i) => {
                      const requestId = `req_r${run}_${tried.length + i}`;
                      const orgId = orgIds[a.org]!;
                      return a.preview
                        ? admission({ requestId, orgId, nowMs: t, quota: { day, orgLimit: a.orgLimit, globalLimit: a.globalLimit } })
                        : admission({ requestId, orgId, nowMs: t, reservation: { amountMicrousd: a.amount, expiresAtMs: t + a.ttl } });
                    });
                    // Completions may name any request tried so far or admitted in this very batch (then not yet in flight).
                    const targets = [...tried, ...admissions.map((a) => ({ id: a.requestId, orgId: a.orgId }))];
                    const completions =
                      targets.length === 0 ? [] : c.completes.map((spec) => completionOf(targets[spec.pick % targets.length]!, spec));
                    await commit(admissions, completions);
                    break;
                  }
                  case "redeliver": {
                    const done = [...m.requests.values()].filter((r) => r.outcome !== "in_flight");
                    if (done.length === 0) break;
                    const r = done[c.pick % done.length]!;
                    await commit([], [completionOf({ id: r.id, orgId: r.orgId }, { pick: c.pick, success: c.success, costPercent: 100 })]);
                    break;
                  }
                  case "sweep":
                    t += c.advance;
                    await sweep(t - c.inFlightTtl, c.limit);
                    break;
                  case "tick":
                    t += c.advance;
                    break;
                }
              }
              t += 1000;
              await sweep(t, 1000);
              assert.ok([...m.requests.values()].every((r) => r.outcome !== "in_flight" && r.reservation !== "pending"));
              for (const r of m.requests.values()) if (r.reservation) await checkReservation(r);
            } finally {
              // After a failure too (fast-check then shrinks, re-running on this store): leave nothing in flight or pending.
              await s.sweep({ nowMs: Number.MAX_SAFE_INTEGER, inFlightBeforeMs: Number.MAX_SAFE_INTEGER, limit: 100_000 });
            }
          }),
          { numRuns: 100 },
        );
      });
    });

    describe("administration", () => {
      const HTTP: AuditActor = { source: "http", client: "console", remoteAddress: "203.0.113.7" };
      const CLI: AuditActor = { source: "cli", client: null, remoteAddress: null };

      /** Every audit entry, newest first, through pages of `limit`; fails if a page is over-full or paging does not end. */
      async function allAudit(query: { orgId?: string; limit: number } = { limit: 200 }): Promise<AuditEntry[]> {
        const entries: AuditEntry[] = [];
        let cursor: string | undefined;
        for (let pages = 1; pages <= 1000; pages++) {
          const page = await store.listAudit({ ...query, ...(cursor === undefined ? {} : { cursor }) });
          assert.ok(page.entries.length <= query.limit, "a page never holds more than limit entries");
          entries.push(...page.entries);
          if (page.nextCursor === null) return entries;
          assert.equal(page.entries.length, query.limit, "a page followed by more is full");
          cursor = page.nextCursor;
        }
        throw new Error("paging did not end");
      }

      /** The entries without their ids, oldest first, after checking the ids grow. */
      async function auditTrail(orgId?: string): Promise<Omit<AuditEntry, "id">[]> {
        const entries = (await allAudit({ limit: 200, ...(orgId === undefined ? {} : { orgId }) })).reverse();
        for (const [i, e] of entries.entries()) {
          assert.ok(Number.isSafeInteger(e.id) && e.id > 0, `ids are whole numbers: ${e.id}`);
          if (i > 0) assert.ok(e.id > entries[i - 1]!.id, "newer entries have larger ids");
        }
        return entries.map(({ id: _id, ...rest }) => rest);
      }

      const entry = (
        action: AuditEntry["action"],
        orgId: string,
        targetId: string,
        atMs: number,
        details: AuditEntry["details"],
        actor = HTTP,
      ) => ({
        ...actor,
        atMs,
        action,
        orgId,
        targetId,
        details,
      });

      /** Runs SQL on the store's own database, for tests that break it on purpose. */
      async function execSql(sql: string): Promise<void> {
        if (store.dialect === "sqlite") (store as SqliteStore).db.exec(sql);
        else await (store as PostgresStore).pool.query(sql);
      }

      describe("audit", () => {
        it("each audited change writes one entry with its facts, in the change's own time", async () => {
          await store.createOrganization({ id: "org_a", name: "Acme ☕", nowMs: T0 + 1, audit: HTTP });
          assert.equal(await store.setOrganizationPaused("org_a", true, { actor: CLI, nowMs: T0 + 2 }), true);
          assert.equal(await store.setOrganizationPaused("org_a", false, { actor: HTTP, nowMs: T0 + 3 }), true);
          const hash = hashApiKey("raw-k1");
          await store.createApiKey({ id: "k1", orgId: "org_a", name: "ci", hash, nowMs: T0 + 4, audit: HTTP });
          await store.createApiKey({ id: "k2", orgId: "org_a", name: null, hash: hashApiKey("raw-k2"), nowMs: T0 + 5, audit: CLI });
          assert.equal(await store.revokeApiKey("k1", T0 + 6, HTTP), true);
          assert.deepEqual(
            await store.grantCredits({ orgId: "org_a", amountMicrousd: 1_500_000, nowMs: T0 + 7, note: "welcome", audit: CLI }),
            { available: 1_500_000, reserved: 0, spent: 0, granted: 1_500_000 },
          );
          await store.grantCredits({ orgId: "org_a", amountMicrousd: 1, nowMs: T0 + 8, audit: HTTP });
          assert.deepEqual(await auditTrail(), [
            entry("organization.created", "org_a", "org_a", T0 + 1, { name: "Acme ☕" }),
            entry("organization.paused", "org_a", "org_a", T0 + 2, {}, CLI),
            entry("organization.resumed", "org_a", "org_a", T0 + 3, {}),
            entry("key.created", "org_a", "k1", T0 + 4, { name: "ci" }),
            entry("key.created", "org_a", "k2", T0 + 5, { name: null }, CLI),
            entry("key.revoked", "org_a", "k1", T0 + 6, { name: "ci" }),
            entry("credits.granted", "org_a", "org_a", T0 + 7, { amount_microusd: 1_500_000, note: "welcome" }, CLI),
            entry("credits.granted", "org_a", "org_a", T0 + 8, { amount_microusd: 1, note: null }),
          ]);
          const text = JSON.stringify(await allAudit());
          assert.ok(!text.includes(hash) && !text.includes("raw-k1"), "no key or hash in the audit log");
          // The changes themselves are as without an audit.
          assert.deepEqual(await store.findOrganization("org_a"), { id: "org_a", name: "Acme ☕", paused: false, createdAtMs: T0 + 1 });
          assert.equal((await store.findApiKey("k1"))?.key.revokedAtMs, T0 + 6);
          assert.equal((await store.listLedger("org_a")).length, 2);
          await checkBalanceInvariants(store, "org_a");
        });

        it("a change that changes nothing writes nothing: pausing twice, revoking twice, unknown organizations and keys", async () => {
          await store.createOrganization({ id: "org_a", name: "Acme", nowMs: T0, audit: CLI });
          await store.createApiKey({ id: "k1", orgId: "org_a", name: "ci", hash: hashApiKey("raw-k1"), nowMs: T0, audit: CLI });
          const before = await auditTrail();
          assert.equal(
            await store.setOrganizationPaused("org_a", false, { actor: HTTP, nowMs: T0 + 1 }),
            true,
            "already running: true, it exists",
          );
          assert.equal(await store.setOrganizationPaused("org_a", true, { actor: HTTP, nowMs: T0 + 2 }), true);
          assert.equal(
            await store.setOrganizationPaused("org_a", true, { actor: HTTP, nowMs: T0 + 3 }),
            true,
            "already paused: true, it exists",
          );
          assert.equal(await store.setOrganizationPaused("org_missing", true, { actor: HTTP, nowMs: T0 + 4 }), false);
          assert.equal(await store.setOrganizationPaused("Acme", true, { actor: HTTP, nowMs: T0 + 4 }), false, "by id only");
          assert.equal(await store.revokeApiKey("k1", T0 + 5, HTTP), true);
          assert.equal(await store.revokeApiKey("k1", T0 + 6, HTTP), false);
          assert.equal(await store.revokeApiKey("k_missing", T0 + 6, HTTP), false);
          assert.deepEqual(await auditTrail(), [
            ...before,
            entry("organization.paused", "org_a", "org_a", T0 + 2, {}),
            entry("key.revoked", "org_a", "k1", T0 + 5, { name: "ci" }),
          ]);
          assert.equal((await store.findApiKey("k1"))?.key.revokedAtMs, T0 + 5, "the first revocation time stays");
        });

        it("concurrent pauses of one organization change it, and audit it, once", async () => {
          await org("org_a");
          const results = await Promise.all(
            Array.from({ length: 8 }, (_, i) => store.setOrganizationPaused("org_a", true, { actor: HTTP, nowMs: T0 + i })),
          );
          assert.deepEqual(results, Array(8).fill(true));
          assert.deepEqual(
            (await allAudit()).map((e) => e.action),
            ["organization.paused"],
          );
        });

        it("without an audit actor nothing is written to the audit log", async () => {
          await org("org_a");
          await key("k1", "org_a", "ci");
          await store.setOrganizationPaused("org_a", true);
          await store.setOrganizationPaused("org_a", false);
          await store.revokeApiKey("k1", now());
          await store.grantCredits({ orgId: "org_a", amountMicrousd: 1000, nowMs: now(), note: "n" });
          await admit(paid("req_1", "org_a", 10));
          await complete(completion({ requestId: "req_1", orgId: "org_a", costMicrousd: 5, reserved: true }));
          assert.deepEqual(await store.listAudit({ limit: 200 }), { entries: [], nextCursor: null });
        });

        it("a change that fails writes no entry", async () => {
          await store.createOrganization({ id: "org_a", name: "Acme", nowMs: T0, audit: CLI });
          const before = await auditTrail();
          await assert.rejects(store.createOrganization({ id: "org_b", name: "Acme", nowMs: T0 + 1, audit: CLI }), StoreConflictError);
          await assert.rejects(store.createOrganization({ id: "org_a", name: "Other", nowMs: T0 + 1, audit: CLI }), StoreConflictError);
          await assert.rejects(
            store.createApiKey({ id: "k1", orgId: "org_missing", name: null, hash: hashApiKey("x"), nowMs: T0 + 2, audit: CLI }),
          );
          await store.createApiKey({ id: "k1", orgId: "org_a", name: null, hash: hashApiKey("x"), nowMs: T0 + 2 });
          await assert.rejects(
            store.createApiKey({ id: "k1", orgId: "org_a", name: null, hash: hashApiKey("y"), nowMs: T0 + 3, audit: CLI }),
            StoreConflictError,
          );
          await assert.rejects(store.grantCredits({ orgId: "org_missing", amountMicrousd: 5, nowMs: T0 + 4, audit: CLI }), StoreInputError);
          await assert.rejects(store.grantCredits({ orgId: "org_a", amountMicrousd: 0, nowMs: T0 + 4, audit: CLI }), StoreInputError);
          assert.deepEqual(await auditTrail(), before);
          assert.deepEqual(await store.getBalance("org_a"), ZERO_BALANCE);
          assert.equal(await store.countOrganizations(), 1);
        });

        it("refuses a malformed audit actor with StoreInputError before changing anything", async () => {
          await org("org_a");
          await key("k1", "org_a");
          const bad = [
            { source: "web", client: null, remoteAddress: null },
            { source: "cli", client: 5, remoteAddress: null },
            { source: "http", client: null },
            null,
          ] as unknown as AuditActor[];
          for (const actor of bad) {
            await assert.rejects(store.createOrganization({ id: "org_b", name: "B", nowMs: now(), audit: actor }), StoreInputError);
            await assert.rejects(store.setOrganizationPaused("org_a", true, { actor, nowMs: now() }), StoreInputError);
            await assert.rejects(
              store.createApiKey({ id: "k2", orgId: "org_a", name: null, hash: hashApiKey("k2"), nowMs: now(), audit: actor }),
              StoreInputError,
            );
            await assert.rejects(store.revokeApiKey("k1", now(), actor), StoreInputError);
            await assert.rejects(store.grantCredits({ orgId: "org_a", amountMicrousd: 5, nowMs: now(), audit: actor }), StoreInputError);
          }
          await assert.rejects(store.setOrganizationPaused("org_a", true, { actor: CLI, nowMs: 1.5 }), StoreInputError);
          assert.equal(await store.findOrganization("org_b"), null);
          assert.equal((await store.findOrganization("org_a"))?.paused, false);
          assert.equal(await store.findApiKey("k2"), null);
          assert.equal((await store.findApiKey("k1"))?.key.revokedAtMs, null);
          assert.deepEqual(await store.getBalance("org_a"), ZERO_BALANCE);
          assert.deepEqual(await auditTrail(), []);
        });

        it("a change whose audit entry cannot be written is not made", async () => {
          await org("org_a");
          await key("k1", "org_a");
          await execSql("ALTER TABLE admin_audit RENAME TO admin_audit_gone");
          await assert.rejects(store.createOrganization({ id: "org_b", name: "B", nowMs: now(), audit: CLI }));
          await assert.rejects(store.setOrganizationPaused("org_a", true, { actor: CLI, nowMs: now() }));
          await assert.rejects(
            store.createApiKey({ id: "k2", orgId: "org_a", name: null, hash: hashApiKey("k2"), nowMs: now(), audit: CLI }),
          );
          await assert.rejects(store.revokeApiKey("k1", now(), CLI));
          await assert.rejects(store.grantCredits({ orgId: "org_a", amountMicrousd: 5, nowMs: now(), audit: CLI }));
          await assert.rejects(
            store.grantCreditsOnce({
              orgId: "org_a",
              amountMicrousd: 5,
              nowMs: now(),
              audit: CLI,
              idempotency: { key: "idem-1", requestHash: "h" },
            }),
          );
          assert.equal(await store.findOrganization("org_b"), null);
          assert.equal((await store.findOrganization("org_a"))?.paused, false);
          assert.equal(await store.findApiKey("k2"), null);
          assert.equal((await store.findApiKey("k1"))?.key.revokedAtMs, null);
          assert.deepEqual(await store.getBalance("org_a"), ZERO_BALANCE);
          assert.deepEqual(await store.listLedger("org_a"), []);
          await execSql("ALTER TABLE admin_audit_gone RENAME TO admin_audit");
          assert.deepEqual(
            await store.grantCreditsOnce({
              orgId: "org_a",
              amountMicrousd: 5,
              nowMs: now(),
              audit: CLI,
              idempotency: { key: "idem-1", requestHash: "h" },
            }),
            { kind: "granted", balance: { available: 5, reserved: 0, spent: 0, granted: 5 } },
            "the failed call stored no answer for its key",
          );
        });

        it("lists newest first, per organization, page by page", async () => {
          await store.createOrganization({ id: "org_a", name: "A", nowMs: T0, audit: CLI });
          await store.createOrganization({ id: "org_b", name: "B", nowMs: T0 + 1, audit: HTTP });
          for (let i = 0; i < 6; i++) {
            await store.grantCredits({ orgId: i % 3 === 0 ? "org_b" : "org_a", amountMicrousd: i + 1, nowMs: T0 + 10 + i, audit: HTTP });
          }
          await store.setOrganizationPaused("org_b", true, { actor: CLI, nowMs: T0 + 20 });
          const all = await store.listAudit({ limit: 200 });
          assert.equal(all.nextCursor, null);
          assert.equal(all.entries.length, 9);
          assert.deepEqual(
            all.entries.map((e) => e.atMs),
            [T0 + 20, T0 + 15, T0 + 14, T0 + 13, T0 + 12, T0 + 11, T0 + 10, T0 + 1, T0],
            "newest first",
          );
          for (const limit of [1, 2, 4, 9, 10]) assert.deepEqual(await allAudit({ limit }), all.entries, `pages of ${limit}`);
          const ofB = all.entries.filter((e) => e.orgId === "org_b");
          assert.deepEqual(
            ofB.map((e) => e.action),
            ["organization.paused", "credits.granted", "credits.granted", "organization.created"],
          );
          assert.deepEqual((await store.listAudit({ orgId: "org_b", limit: 200 })).entries, ofB);
          assert.deepEqual(await allAudit({ orgId: "org_b", limit: 1 }), ofB);
          assert.deepEqual(
            await allAudit({ orgId: "org_a", limit: 3 }),
            all.entries.filter((e) => e.orgId === "org_a"),
          );
          assert.deepEqual(await store.listAudit({ orgId: "org_missing", limit: 10 }), { entries: [], nextCursor: null });
          assert.deepEqual(await store.listAudit({ orgId: "A", limit: 10 }), { entries: [], nextCursor: null }, "by id only");
          const first = await store.listAudit({ limit: 2 });
          assert.equal(first.entries.length, 2);
          assert.ok(first.nextCursor !== null);
          await store.grantCredits({ orgId: "org_a", amountMicrousd: 1, nowMs: T0 + 30, audit: CLI });
          assert.deepEqual(
            (await store.listAudit({ limit: 2, cursor: first.nextCursor })).entries,
            all.entries.slice(2, 4),
            "a cursor stays valid when newer entries arrive",
          );
        });

        it("rejects a malformed cursor or a limit outside 1 to 200 with StoreInputError", async () => {
          await store.createOrganization({ id: "org_a", name: "A", nowMs: T0, audit: CLI });
          await store.createOrganization({ id: "org_b", name: "B", nowMs: T0, audit: CLI });
          const orgCursor = (await store.listOrganizationsPage({ limit: 1 })).nextCursor!;
          const b64 = (text: string) => Buffer.from(text, "utf8").toString("base64url");
          for (const cursor of [
            "",
            "!!!",
            "abc=",
            b64("audit:"),
            b64("audit:0"),
            b64("audit:-1"),
            b64("audit:1.5"),
            b64("audit:99999999999999999"),
            b64("7"),
            orgCursor,
            "a".repeat(5000),
          ]) {
            await assert.rejects(
              store.listAudit({ limit: 10, cursor }),
              (err: unknown) => err instanceof StoreInputError && err.field === "cursor",
              JSON.stringify(cursor),
            );
          }
          for (const limit of [0, 201, 1.5, -1, Number.NaN]) {
            await assert.rejects(
              store.listAudit({ limit }),
              (err: unknown) => err instanceof StoreInputError && err.field === "limit",
              String(limit),
            );
          }
          assert.equal((await store.listAudit({ limit: 200 })).entries.length, 2);
        });
      });

      describe("organization pages", () => {
        it("an empty store has an empty first page", async () => {
          assert.deepEqual(await store.listOrganizationsPage({ limit: 10 }), { organizations: [], nextCursor: null });
        });

        it("pages through every organization exactly once, oldest first, ties by id", async () => {
          const times = [5, 1, 1, 3, 1, 9, 3, 2];
          for (const [i, t] of times.entries())
            await store.createOrganization({ id: `org_${String.fromCharCode(104 - i)}`, name: `name ${i}`, nowMs: T0 + t });
          const all = await store.listOrganizations();
          assert.deepEqual(
            all.map((o) => o.id),
            ["org_c", "org_f", "org_h", "org_a", "org_d", "org_e", "org_g", "org_b"].sort((a, b) => {
              const ta = all.find((o) => o.id === a)!.createdAtMs;
              const tb = all.find((o) => o.id === b)!.createdAtMs;
              return ta - tb || (a < b ? -1 : 1);
            }),
          );
          for (const limit of [1, 2, 3, 8, 200]) {
            const seen = [];
            let cursor: string | undefined;
            for (;;) {
              const page = await store.listOrganizationsPage({ limit, ...(cursor === undefined ? {} : { cursor }) });
              assert.ok(page.organizations.length <= limit);
              seen.push(...page.organizations);
              if (page.nextCursor === null) break;
              assert.equal(page.organizations.length, limit, "a page followed by more is full");
              cursor = page.nextCursor;
            }
            assert.deepEqual(seen, all, `pages of ${limit}`);
          }
          assert.equal((await store.listOrganizationsPage({ limit: 8 })).nextCursor, null, "no cursor when the last page is exactly full");
        });

        it("keeps ids and names like __proto__ and unicode exactly across pages", async () => {
          const made = [];
          for (const [i, id] of ["__proto__", "org_ü☕", "org_'; --", "org_a b"].entries())
            made.push(await store.createOrganization({ id, name: `名 ${i}`, nowMs: T0 }));
          const seen = [];
          let cursor: string | undefined;
          do {
            const page: OrganizationPage = await store.listOrganizationsPage({ limit: 1, ...(cursor === undefined ? {} : { cursor }) });
            seen.push(...page.organizations);
            cursor = page.nextCursor ?? undefined;
          } while (cursor !== undefined);
          assert.deepEqual(seen, await store.listOrganizations());
          assert.equal(seen.length, made.length);
        });

        it("rejects a malformed cursor or a limit outside 1 to 200 with StoreInputError", async () => {
          await store.createOrganization({ id: "org_a", name: "A", nowMs: T0, audit: CLI });
          await store.createOrganization({ id: "org_b", name: "B", nowMs: T0, audit: CLI });
          const auditCursor = (await store.listAudit({ limit: 1 })).nextCursor!;
          const b64 = (text: string) => Buffer.from(text, "utf8").toString("base64url");
          for (const cursor of [
            "",
            "%%",
            b64("org:"),
            b64("org:1"),
            b64("org:1:"),
            b64("org:-1:x"),
            b64("org:01:x"),
            b64(`${T0}:org_a`),
            auditCursor,
          ]) {
            await assert.rejects(
              store.listOrganizationsPage({ limit: 10, cursor }),
              (err: unknown) => err instanceof StoreInputError && err.field === "cursor",
              JSON.stringify(cursor),
            );
          }
          for (const limit of [0, 201, 2.5]) {
            await assert.rejects(
              store.listOrganizationsPage({ limit }),
              (err: unknown) => err instanceof StoreInputError && err.field === "limit",
              String(limit),
            );
          }
        });
      });

      describe("idempotent grants", () => {
        const once = (nowMs: number, options: { key?: string; hash?: string; amount?: number; orgId?: string; note?: string } = {}) =>
          store.grantCreditsOnce({
            orgId: options.orgId ?? "org_a",
            amountMicrousd: options.amount ?? 1000,
            nowMs,
            ...(options.note === undefined ? {} : { note: options.note }),
            audit: HTTP,
            idempotency: { key: options.key ?? "idem-1", requestHash: options.hash ?? "hash-1" },
          });
        const grants = async (orgId = "org_a") =>
          (await store.listLedger(orgId)).filter((e) => e.kind === "grant").map((e) => [e.grantedDelta, e.createdAtMs, e.note]);

        it("grants once; the same request again replays the first answer and grants nothing; another request is a mismatch", async () => {
          await org("org_a");
          const first = await once(T0, { note: "promo ✓" });
          assert.deepEqual(first, { kind: "granted", balance: { available: 1000, reserved: 0, spent: 0, granted: 1000 } });
          await store.grantCredits({ orgId: "org_a", amountMicrousd: 5, nowMs: T0 + 1 });
          assert.deepEqual(
            await once(T0 + 2, { note: "promo ✓" }),
            { kind: "replayed", balance: first.kind === "granted" ? first.balance : null },
            "the first grant's balance",
          );
          assert.deepEqual(await once(T0 + 3, { hash: "hash-2" }), { kind: "mismatch" });
          assert.deepEqual(
            await once(T0 + ADMIN_IDEMPOTENCY_TTL_MS - 1),
            { kind: "replayed", balance: { available: 1000, reserved: 0, spent: 0, granted: 1000 } },
            "kept until its expiry",
          );
          assert.deepEqual(await grants(), [
            [1000, T0, "promo ✓"],
            [5, T0 + 1, null],
          ]);
          assert.deepEqual((await store.getBalance("org_a")).granted, 1005);
          assert.deepEqual(
            (await allAudit()).map((e) => [e.action, e.atMs, e.details]),
            [["credits.granted", T0, { amount_microusd: 1000, note: "promo ✓" }]],
            "one audit entry, for the grant that happened",
          );
          await checkBalanceInvariants(store, "org_a");
        });

        it("an expired key is as if it was never used: the grant runs again and replaces it", async () => {
          await org("org_a");
          await once(T0);
          assert.deepEqual(await once(T0 + ADMIN_IDEMPOTENCY_TTL_MS, { hash: "hash-2", amount: 7 }), {
            kind: "granted",
            balance: { available: 1007, reserved: 0, spent: 0, granted: 1007 },
          });
          assert.deepEqual(await once(T0 + ADMIN_IDEMPOTENCY_TTL_MS + 1, { hash: "hash-2", amount: 7 }), {
            kind: "replayed",
            balance: { available: 1007, reserved: 0, spent: 0, granted: 1007 },
          });
          assert.deepEqual(await once(T0 + ADMIN_IDEMPOTENCY_TTL_MS + 2), { kind: "mismatch" }, "the first request's entry is gone");
          assert.deepEqual(await grants(), [
            [1000, T0, null],
            [7, T0 + ADMIN_IDEMPOTENCY_TTL_MS, null],
          ]);
        });

        it("keys are separate; a failed grant stores nothing for its key", async () => {
          await org("org_a");
          await org("org_b");
          await assert.rejects(once(T0, { key: "idem-x", orgId: "org_missing" }), StoreInputError);
          await assert.rejects(once(T0, { key: "idem-x", amount: 0 }), StoreInputError);
          assert.equal(
            (await once(T0, { key: "idem-x", orgId: "org_b", hash: "other" })).kind,
            "granted",
            "the failed calls left no entry",
          );
          assert.equal((await once(T0, { key: "idem-y" })).kind, "granted");
          assert.equal((await once(T0, { key: "idem-z" })).kind, "granted");
          assert.deepEqual(await grants("org_a"), [
            [1000, T0, null],
            [1000, T0, null],
          ]);
          assert.deepEqual(await grants("org_b"), [[1000, T0, null]]);
        });

        it("rejects malformed input with StoreInputError", async () => {
          await org("org_a");
          const valid = { orgId: "org_a", amountMicrousd: 5, nowMs: T0, audit: HTTP, idempotency: { key: "k", requestHash: "h" } };
          for (const bad of [
            { idempotency: { key: "", requestHash: "h" } },
            { idempotency: { key: "k", requestHash: "" } },
            { idempotency: undefined },
            { audit: undefined },
            { audit: { source: "x", client: null, remoteAddress: null } },
            { nowMs: 1.5 },
            { amountMicrousd: -5 },
          ]) {
            await assert.rejects(
              store.grantCreditsOnce({ ...valid, ...bad } as unknown as typeof valid),
              StoreInputError,
              JSON.stringify(bad),
            );
          }
          assert.deepEqual(await grants(), []);
        });

        it("concurrent calls with one key grant exactly once; the others replay its answer", async () => {
          await org("org_a");
          const results = await Promise.all(Array.from({ length: 10 }, (_, i) => once(T0 + i, { amount: 2500 })));
          const granted = results.filter((r) => r.kind === "granted");
          assert.equal(granted.length, 1, JSON.stringify(results));
          const balance = { available: 2500, reserved: 0, spent: 0, granted: 2500 };
          assert.deepEqual(
            results.filter((r) => r.kind !== "granted"),
            Array(9).fill({ kind: "replayed", balance }),
          );
          assert.deepEqual(granted[0], { kind: "granted", balance });
          assert.deepEqual(await store.getBalance("org_a"), balance);
          assert.equal((await grants()).length, 1);
          assert.equal((await allAudit()).length, 1);
          // Different keys at once each grant.
          const many = await Promise.all(Array.from({ length: 10 }, (_, i) => once(T0, { key: `idem-many-${i}`, amount: 1 })));
          assert.deepEqual(
            many.map((r) => r.kind),
            Array(10).fill("granted"),
          );
          assert.deepEqual(await checkBalanceInvariants(store, "org_a"), { available: 2510, reserved: 0, spent: 0, granted: 2510 });
        });

        it("purge deletes expired keys, at most limit of each kind of key", async () => {
          await org("org_a");
          await once(T0, { key: "idem-1" });
          await once(T0 + 10, { key: "idem-2" });
          await once(T0 + HOUR, { key: "idem-3" });
          await admit(
            admission({
              requestId: "req_1",
              orgId: "org_a",
              nowMs: T0,
              idempotency: { key: "k-1", requestHash: "h", lockUntilMs: T0 + MINUTE, expiresAtMs: T0 + 100 },
            }),
          );
          const purge = (limit: number) => store.purge({ nowMs: T0 + ADMIN_IDEMPOTENCY_TTL_MS + 10, keepFromDay: DAY, limit });
          assert.deepEqual(await purge(0), { idempotencyKeys: 0, previewCounters: 0 });
          assert.deepEqual(await purge(1), { idempotencyKeys: 2, previewCounters: 0 }, "one of each table");
          assert.deepEqual(await purge(1), { idempotencyKeys: 1, previewCounters: 0 });
          assert.deepEqual(await purge(1), { idempotencyKeys: 0, previewCounters: 0 });
          // What expired is gone (another request with its key is no mismatch); what did not is kept.
          assert.equal((await once(T0 + ADMIN_IDEMPOTENCY_TTL_MS + 20, { key: "idem-2", hash: "other" })).kind, "granted");
          assert.equal((await once(T0 + ADMIN_IDEMPOTENCY_TTL_MS + 20, { key: "idem-3" })).kind, "replayed");
        });
      });

      describe("usage totals", () => {
        const sums = (requests: number, inputTokens: number, outputTokens: number, costMicrousd: number) => ({
          requests,
          inputTokens,
          outputTokens,
          costMicrousd,
        });

        async function seed() {
          await recordUsage(store, [
            usageRecord({ requestId: "r_before", orgId: "org_c", createdAtMs: T0 - 1, costMicrousd: 9000 }),
            usageRecord({ requestId: "r_a1", orgId: "org_a", createdAtMs: T0, costMicrousd: 300, inputTokens: 100, outputTokens: 10 }),
            usageRecord({ requestId: "r_a2", orgId: "org_a", createdAtMs: T0 + HOUR, outcome: "in_flight" }),
            usageRecord({
              requestId: "r_a3",
              orgId: "org_a",
              createdAtMs: T0 + DAY_MS - 1,
              outcome: "model_error",
              inputTokens: 5,
              outputTokens: 0,
            }),
            usageRecord({
              requestId: "r_b1",
              orgId: "org_b",
              createdAtMs: T0 + DAY_MS,
              costMicrousd: 500,
              inputTokens: 7,
              outputTokens: 3,
            }),
            usageRecord({
              requestId: "r_a4",
              orgId: "org_a",
              createdAtMs: T0 + DAY_MS + 5,
              outcome: "gateway_error",
              httpStatus: 500,
              inputTokens: 0,
              outputTokens: 0,
            }),
            usageRecord({ requestId: "r_d1", orgId: "org_d", createdAtMs: T0 + 2 * DAY_MS, inputTokens: 1, outputTokens: 1 }),
            usageRecord({ requestId: "r_e1", orgId: "org_e", createdAtMs: T0 + 2 * DAY_MS + 1, inputTokens: 1, outputTokens: 1 }),
            usageRecord({ requestId: "r_e2", orgId: "org_e", createdAtMs: T0 + 2 * DAY_MS + 2, inputTokens: 1, outputTokens: 1 }),
            usageRecord({ requestId: "r_f1", orgId: "org_f", createdAtMs: T0 + 2 * DAY_MS + 3, inputTokens: 2, outputTokens: 2 }),
            usageRecord({ requestId: "r_after", orgId: "org_b", createdAtMs: T0 + 3 * DAY_MS, costMicrousd: 7000 }),
          ]);
        }

        const named = (orgId: string) => `usage of ${orgId}`;

        it("sums every record of the days [fromMs, toMs), in flight too, per UTC day and per organization (with its name)", async () => {
          await seed();
          assert.deepEqual(await store.usageTotals({ fromMs: T0, toMs: T0 + 3 * DAY_MS }), {
            days: [
              { dayStartMs: T0, ...sums(3, 105, 10, 300) },
              { dayStartMs: T0 + DAY_MS, ...sums(2, 7, 3, 500) },
              { dayStartMs: T0 + 2 * DAY_MS, ...sums(4, 5, 5, 0) },
            ],
            organizations: [
              { orgId: "org_b", name: named("org_b"), ...sums(1, 7, 3, 500) },
              { orgId: "org_a", name: named("org_a"), ...sums(4, 105, 10, 300) },
              { orgId: "org_e", name: null, ...sums(2, 2, 2, 0) },
              { orgId: "org_d", name: null, ...sums(1, 1, 1, 0) },
              { orgId: "org_f", name: null, ...sums(1, 2, 2, 0) },
            ],
          });
        });

        it("whole UTC days: fromMs inclusive, toMs exclusive; days with no record are left out; other bounds are refused", async () => {
          await seed();
          assert.deepEqual(await store.usageTotals({ fromMs: T0 - DAY_MS, toMs: T0 }), {
            days: [{ dayStartMs: T0 - DAY_MS, ...sums(1, 120, 7, 9000) }],
            organizations: [{ orgId: "org_c", name: named("org_c"), ...sums(1, 120, 7, 9000) }],
          });
          const dayTwo = await store.usageTotals({ fromMs: T0 + DAY_MS, toMs: T0 + 2 * DAY_MS });
          assert.deepEqual(dayTwo.days, [{ dayStartMs: T0 + DAY_MS, ...sums(2, 7, 3, 500) }]);
          const gap = await store.usageTotals({ fromMs: T0 - DAY_MS, toMs: T0 + 5 * DAY_MS });
          assert.deepEqual(
            gap.days.map((d) => d.dayStartMs),
            [T0 - DAY_MS, T0, T0 + DAY_MS, T0 + 2 * DAY_MS, T0 + 3 * DAY_MS],
          );
          assert.equal(
            gap.days.reduce((n, d) => n + d.requests, 0),
            11,
          );
          assert.equal(
            gap.organizations.reduce((n, o) => n + o.costMicrousd, 0),
            9000 + 300 + 500 + 7000,
          );
          assert.deepEqual(await store.usageTotals({ fromMs: T0, toMs: T0 }), { days: [], organizations: [] });
          assert.deepEqual(await store.usageTotals({ fromMs: T0 + 5 * DAY_MS, toMs: T0 + 6 * DAY_MS }), { days: [], organizations: [] });
          for (const bad of [{ fromMs: T0 + 1 }, { toMs: T0 + DAY_MS - 1 }, { fromMs: -DAY_MS }]) {
            await assert.rejects(store.usageTotals({ fromMs: T0, toMs: T0 + DAY_MS, ...bad }), StoreInputError, JSON.stringify(bad));
          }
        });

        it("for one organization only", async () => {
          await seed();
          assert.deepEqual(await store.usageTotals({ fromMs: T0, toMs: T0 + 3 * DAY_MS, orgId: "org_a" }), {
            days: [
              { dayStartMs: T0, ...sums(3, 105, 10, 300) },
              { dayStartMs: T0 + DAY_MS, ...sums(1, 0, 0, 0) },
            ],
            organizations: [{ orgId: "org_a", name: named("org_a"), ...sums(4, 105, 10, 300) }],
          });
          assert.deepEqual(await store.usageTotals({ fromMs: T0, toMs: T0 + 4 * DAY_MS, orgId: "org_missing" }), {
            days: [],
            organizations: [],
          });
        });

        it("counts a record in the day it was accepted, through its completion on a later day and the sweep", async () => {
          await org("org_a");
          await admit(admission({ requestId: "late", orgId: "org_a", nowMs: T0 + DAY_MS - 1 }));
          await admit(admission({ requestId: "lost", orgId: "org_a", nowMs: T0 + DAY_MS - 2 }));
          const total = async () => (await store.usageTotals({ fromMs: T0, toMs: T0 + 2 * DAY_MS, orgId: "org_a" })).days;
          assert.deepEqual(await total(), [{ dayStartMs: T0, ...sums(2, 0, 0, 0) }], "in flight");
          await complete(completion({ requestId: "late", orgId: "org_a", nowMs: T0 + DAY_MS + 5, inputTokens: 11, outputTokens: 3 }));
          assert.deepEqual(await total(), [{ dayStartMs: T0, ...sums(2, 11, 3, 0) }], "completed the next day");
          assert.deepEqual(await store.sweep({ nowMs: T0 + 2 * DAY_MS, inFlightBeforeMs: T0 + DAY_MS, limit: 10 }), { abandoned: 1 });
          assert.deepEqual(await total(), [{ dayStartMs: T0, ...sums(2, 11, 3, 0) }], "swept: still counted, nothing added");
          assert.deepEqual(await complete(completion({ requestId: "late", orgId: "org_a", nowMs: T0 + DAY_MS + 6, inputTokens: 99 })), [
            { kind: "not_in_flight" },
          ]);
          assert.deepEqual(await total(), [{ dayStartMs: T0, ...sums(2, 11, 3, 0) }], "a second completion changes nothing");
        });

        it("an empty store has no totals; bad arguments are StoreInputError", async () => {
          const lastMidnight = Math.floor(Number.MAX_SAFE_INTEGER / DAY_MS) * DAY_MS;
          assert.deepEqual(await store.usageTotals({ fromMs: 0, toMs: lastMidnight }), { days: [], organizations: [] });
          for (const bad of [{ fromMs: Number.NaN }, { toMs: 1.5 }, { fromMs: T0 + DAY_MS, toMs: T0 }, { orgId: "" }]) {
            await assert.rejects(store.usageTotals({ fromMs: T0, toMs: T0 + DAY_MS, ...bad }), StoreInputError, JSON.stringify(bad));
          }
        });
      });
    });

    it("close can be called twice", async () => {
      await store.close();
      await store.close();
    });
  });
}
