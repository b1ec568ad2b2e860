/**
 * The batch storage contract (src/store/batches.ts): every adapter runs this suite unchanged.
 *
 *   describeBatchStoreContract("sqlite", async () => sqliteFixture());
 *
 * `makeFixture` is called once per test and must return a database with no batches; the suite closes it.
 */
import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";
import { ERROR_CATALOGUE } from "../../src/domain/errors.ts";
import { IDEMPOTENCY_WINDOW_MS } from "../../src/domain/idempotency.ts";
import {
  BATCH_ROWS_PER_CHUNK,
  type BatchLine,
  type BatchRecord,
  type BatchStore,
  type ClaimedRequest,
  DuplicateCustomIdError,
  type FinishInput,
  MAX_FINISHES_PER_CALL,
  MAX_LINE_BYTES_PER_CALL,
  MAX_LINES_PER_CALL,
  MAX_RESULTS_PAGE,
} from "../../src/store/batches.ts";
import { StoreConflictError, StoreInputError } from "../../src/store/store-errors.ts";

export const T0 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
const SECOND = 1000;
const HOUR = 3_600_000;
const DAY = 24 * HOUR;

export interface BatchStoreFixture {
  batches: BatchStore;
  createOrganization(id: string): Promise<void>;
  /** The rows of batch_requests of a batch (whatever its state). */
  countRequests(batchId: string): Promise<number>;
  close(): Promise<void>;
}

/** Requests at positions `from` … `from + count - 1`, custom ids `c<position>`, bodies naming their position. */
export function lines(count: number, from = 0): BatchLine[] {
  return Array.from({ length: count }, (_, i) => ({
    position: from + i,
    customId: `c${from + i}`,
    body: JSON.stringify({ state: { n: from + i }, questions: { q: { type: "boolean" } } }),
  }));
}

const CANCELLED_BODY = JSON.stringify({ detail: ERROR_CATALOGUE.batch_cancelled.detail });
const EXPIRED_BODY = JSON.stringify({ detail: ERROR_CATALOGUE.batch_expired.detail });

export function describeBatchStoreContract(name: string, makeFixture: () => Promise<BatchStoreFixture>): void {
  describe(`Batch store contract: ${name}`, () => {
    let fixture: BatchStoreFixture;
    let store: BatchStore;

    beforeEach(async () => {
      fixture = await makeFixture();
      store = fixture.batches;
      for (const org of ["org_a", "org_b", "org_c"]) await fixture.createOrganization(org);
    });
    afterEach(async () => {
      await fixture.close();
    });

    /** A batch of `count` lines opened at `createdAtMs`, its window `windowMs`. */
    async function submit(
      id: string,
      count: number,
      options: { orgId?: string; createdAtMs?: number; windowMs?: number; model?: string | null } = {},
    ): Promise<BatchRecord> {
      const createdAtMs = options.createdAtMs ?? T0;
      await store.beginBatch({
        id,
        orgId: options.orgId ?? "org_a",
        keyId: "key_1",
        model: options.model ?? null,
        nowMs: createdAtMs,
        expiresAtMs: createdAtMs + (options.windowMs ?? DAY),
      });
      if (count > 0) await store.addLines(id, lines(count), createdAtMs);
      const opened = await store.openBatch({ batchId: id, total: count, inputBytes: count * 10, nowMs: createdAtMs, idempotency: null });
      assert.equal(opened.kind, "opened");
      return (opened as { batch: BatchRecord }).batch;
    }

    const claim = (nowMs: number, limit: number, instanceId = "i1", perOrgLimit?: number) =>
      store.claimRequests({
        instanceId,
        nowMs,
        leaseUntilMs: nowMs + 30 * SECOND,
        limit,
        ...(perOrgLimit === undefined ? {} : { perOrgLimit }),
      });

    const at = (claims: ClaimedRequest[]) => claims.map((c) => `${c.batchId}:${c.position}`);

    const finish = (c: ClaimedRequest, nowMs: number, costMicrousd = 0, succeeded = true) =>
      store.finishRequest({
        batchId: c.batchId,
        position: c.position,
        requestId: c.requestId,
        status: succeeded ? 200 : 502,
        body: JSON.stringify({ answers: { q: c.position } }),
        costMicrousd,
        nowMs,
      });

    async function allResults(orgId: string, id: string, limit = 1000) {
      return (await store.results(orgId, id, { afterPosition: -1, limit })) ?? assert.fail("no such batch");
    }

    it("a batch is invisible while validating, queued once opened, running once claimed and completed with its last result", async () => {
      const begun = await store.beginBatch({
        id: "batch_1",
        orgId: "org_a",
        keyId: "key_1",
        model: "jev-1",
        nowMs: T0,
        expiresAtMs: T0 + DAY,
      });
      assert.equal(begun.status, "validating");
      assert.equal(await store.getBatch("org_a", "batch_1"), null, "not shown while validating");
      assert.deepEqual((await store.listBatches("org_a", { limit: 10 })).batches, []);
      assert.deepEqual(await claim(T0, 10), [], "never run while validating");
      // Chunks of sizes that are not powers of two.
      await store.addLines("batch_1", lines(300), T0);
      await store.addLines("batch_1", lines(5, 300), T0);
      await store.addLines("batch_1", [], T0);
      const opened = await store.openBatch({ batchId: "batch_1", total: 305, inputBytes: 12_345, nowMs: T0 + SECOND, idempotency: null });
      assert.equal(opened.kind, "opened");
      const queued = await store.getBatch("org_a", "batch_1");
      assert.deepEqual(queued, {
        id: "batch_1",
        orgId: "org_a",
        keyId: "key_1",
        model: "jev-1",
        status: "queued",
        createdAtMs: T0,
        startedAtMs: null,
        endedAtMs: null,
        expiresAtMs: T0 + DAY,
        total: 305,
        succeeded: 0,
        failed: 0,
        costMicrousd: 0,
        inputBytes: 12_345,
      });
      assert.deepEqual(opened.kind === "opened" && opened.batch, queued);

      const claimed: ClaimedRequest[] = [];
      for (let n = 0; claimed.length < 305; n++) claimed.push(...(await claim(T0 + 2 * SECOND + n, 100)));
      assert.deepEqual(
        claimed.map((c) => c.position),
        Array.from({ length: 305 }, (_, i) => i),
        "in input order",
      );
      assert.deepEqual(claimed[7], {
        batchId: "batch_1",
        position: 7,
        orgId: "org_a",
        keyId: "key_1",
        model: "jev-1",
        customId: "c7",
        body: lines(1, 7)[0]!.body,
        requestId: claimed[7]!.requestId,
        leaseUntilMs: T0 + 2 * SECOND + 30 * SECOND,
        takenOver: false,
      });
      assert.ok(
        claimed.every((c) => /^req_\w+$/.test(c.requestId)),
        "the API's request ids",
      );
      assert.equal(new Set(claimed.map((c) => c.requestId)).size, 305, "a request id each");
      const running = await store.getBatch("org_a", "batch_1");
      assert.deepEqual([running?.status, running?.startedAtMs], ["running", T0 + 2 * SECOND]);
      assert.deepEqual(await claim(T0 + 3 * SECOND, 10), [], "nothing left to claim");

      let cost = 0;
      for (const c of claimed) {
        const ok = c.position % 10 !== 3;
        assert.equal(await finish(c, T0 + 10 * SECOND + c.position, ok ? c.position * 7 : 0, ok), true);
        cost += ok ? c.position * 7 : 0;
      }
      const done = await store.getBatch("org_a", "batch_1");
      assert.deepEqual(
        { status: done?.status, endedAtMs: done?.endedAtMs, succeeded: done?.succeeded, failed: done?.failed, cost: done?.costMicrousd },
        { status: "completed", endedAtMs: T0 + 10 * SECOND + 304, succeeded: 274, failed: 31, cost },
      );
      const results = await allResults("org_a", "batch_1");
      assert.deepEqual(
        results.map((r) => [r.position, r.customId, r.requestId, r.status]),
        claimed.map((c) => [c.position, c.customId, c.requestId, c.position % 10 !== 3 ? 200 : 502]),
      );
      assert.equal(
        results.reduce((sum, r) => sum + r.costMicrousd, 0),
        cost,
        "the batch's cost is the sum of its results'",
      );
      assert.deepEqual(JSON.parse(results[5]!.body), { answers: { q: 5 } });
    });

    it("an empty batch is completed when opened; total must be the number of lines written; a batch is opened once", async () => {
      const empty = await submit("batch_empty", 0);
      assert.deepEqual([empty.status, empty.total, empty.endedAtMs], ["completed", 0, T0]);
      await store.beginBatch({ id: "batch_2", orgId: "org_a", keyId: "key_1", model: null, nowMs: T0, expiresAtMs: T0 + DAY });
      await store.addLines("batch_2", lines(3), T0);
      await assert.rejects(
        store.openBatch({ batchId: "batch_2", total: 4, inputBytes: 1, nowMs: T0, idempotency: null }),
        (err: unknown) => err instanceof StoreInputError && err.field === "total",
      );
      await store.openBatch({ batchId: "batch_2", total: 3, inputBytes: 1, nowMs: T0, idempotency: null });
      await assert.rejects(
        store.openBatch({ batchId: "batch_2", total: 3, inputBytes: 1, nowMs: T0, idempotency: null }),
        StoreConflictError,
      );
      await assert.rejects(store.addLines("batch_2", lines(1, 3), T0), StoreConflictError, "no line is added to an opened batch");
      assert.equal(await store.dropBatch("batch_2"), false, "only a validating batch is dropped");
      assert.equal(await fixture.countRequests("batch_2"), 3);
    });

    it("beginBatch refuses an unknown organization, a taken id and a window that ends before it starts", async () => {
      const input = { id: "batch_1", orgId: "org_a", keyId: "key_1", model: null, nowMs: T0, expiresAtMs: T0 + DAY };
      await assert.rejects(
        store.beginBatch({ ...input, orgId: "org_missing" }),
        (err: unknown) => err instanceof StoreInputError && err.field === "orgId",
      );
      await store.beginBatch(input);
      await assert.rejects(store.beginBatch(input), StoreConflictError);
      await assert.rejects(store.beginBatch({ ...input, id: "batch_2", expiresAtMs: T0 }), StoreInputError);
    });

    it("dropBatch deletes a validating batch and its lines", async () => {
      await store.beginBatch({ id: "batch_1", orgId: "org_a", keyId: "key_1", model: null, nowMs: T0, expiresAtMs: T0 + DAY });
      await store.addLines("batch_1", lines(20), T0);
      assert.equal(await fixture.countRequests("batch_1"), 20);
      assert.equal(await store.dropBatch("batch_1"), true);
      assert.equal(await fixture.countRequests("batch_1"), 0);
      assert.equal(await store.dropBatch("batch_1"), false);
      await assert.rejects(store.addLines("batch_1", lines(1), T0), StoreConflictError);
    });

    it("Idempotency-Key: the same body answers the first batch, another body is a mismatch, both drop the new upload; the key is per organization and for 24 h", async () => {
      const open = async (id: string, orgId: string, hash: string, nowMs: number) => {
        await store.beginBatch({ id, orgId, keyId: "key_1", model: null, nowMs, expiresAtMs: nowMs + DAY });
        await store.addLines(id, lines(4), nowMs);
        return store.openBatch({ batchId: id, total: 4, inputBytes: 40, nowMs, idempotency: { key: "k-1", requestHash: hash } });
      };
      const first = await open("batch_1", "org_a", "h1", T0);
      assert.equal(first.kind, "opened");
      assert.deepEqual(await store.findIdempotentBatch("org_a", "k-1", T0 + HOUR), {
        batch: (await store.getBatch("org_a", "batch_1"))!,
        requestHash: "h1",
      });
      assert.equal(await store.findIdempotentBatch("org_b", "k-1", T0 + HOUR), null);

      const replayed = await open("batch_2", "org_a", "h1", T0 + HOUR);
      assert.deepEqual(replayed, { kind: "replayed", batch: await store.getBatch("org_a", "batch_1") });
      assert.equal(await store.getBatch("org_a", "batch_2"), null);
      assert.equal(await fixture.countRequests("batch_2"), 0, "the replayed upload's lines are gone");

      assert.deepEqual(await open("batch_3", "org_a", "h2", T0 + HOUR), { kind: "mismatch" });
      assert.equal(await fixture.countRequests("batch_3"), 0);

      assert.equal((await open("batch_4", "org_b", "h2", T0 + HOUR)).kind, "opened", "another organization's key is its own");

      const later = T0 + IDEMPOTENCY_WINDOW_MS;
      assert.equal(await store.findIdempotentBatch("org_a", "k-1", later), null, "the window ended");
      const reused = await open("batch_5", "org_a", "h2", later);
      assert.equal(reused.kind, "opened", "a key older than the window names a new batch");
      assert.equal((await store.findIdempotentBatch("org_a", "k-1", later))?.batch.id, "batch_5");
      assert.equal((await store.getBatch("org_a", "batch_1"))?.status, "queued", "the first batch is kept");
    });

    it("a repeated custom_id is a DuplicateCustomIdError naming both positions, and nothing of the call is written", async () => {
      await store.beginBatch({ id: "batch_1", orgId: "org_a", keyId: "key_1", model: null, nowMs: T0, expiresAtMs: T0 + DAY });
      await store.addLines("batch_1", lines(10), T0);
      const twiceInOneCall = [...lines(2, 10), { position: 12, customId: "c10", body: "{}" }];
      await assert.rejects(
        store.addLines("batch_1", twiceInOneCall, T0),
        (err: unknown) =>
          err instanceof DuplicateCustomIdError && err.customId === "c10" && err.position === 12 && err.firstPosition === 10,
      );
      const repeatsEarlier = [...lines(3, 10), { position: 13, customId: "c4", body: "{}" }];
      await assert.rejects(
        store.addLines("batch_1", repeatsEarlier, T0),
        (err: unknown) =>
          err instanceof DuplicateCustomIdError && err instanceof StoreConflictError && err.position === 13 && err.firstPosition === 4,
      );
      assert.equal(await fixture.countRequests("batch_1"), 10, "nothing of either call was written");
      await store.beginBatch({ id: "batch_2", orgId: "org_a", keyId: "key_1", model: null, nowMs: T0, expiresAtMs: T0 + DAY });
      await store.addLines("batch_2", lines(10), T0);
      assert.equal(await fixture.countRequests("batch_2"), 10, "custom ids are unique within a batch only");
    });

    it("another organization's batch is not found anywhere", async () => {
      await submit("batch_1", 3, { orgId: "org_a" });
      assert.equal(await store.getBatch("org_b", "batch_1"), null);
      assert.deepEqual((await store.listBatches("org_b", { limit: 10 })).batches, []);
      assert.equal(await store.results("org_b", "batch_1", { afterPosition: -1, limit: 10 }), null);
      assert.equal(await store.cancelBatch("org_b", "batch_1", T0 + SECOND), null);
      assert.equal((await store.getBatch("org_a", "batch_1"))?.status, "queued", "the cancel of another organization changed nothing");
      assert.equal(await store.getBatch("org_a", "batch_missing"), null);
    });

    it("lists the organization's batches newest first in keyset pages, ties by id", async () => {
      const created = [T0, T0 + 5, T0 + 5, T0 + 5, T0 + 9, T0 + 12, T0 + 20];
      for (const [i, createdAtMs] of created.entries()) await submit(`batch_${i}`, 1, { createdAtMs });
      await submit("batch_other", 1, { orgId: "org_b", createdAtMs: T0 + 7 });
      await store.beginBatch({ id: "batch_uploading", orgId: "org_a", keyId: "key_1", model: null, nowMs: T0 + 30, expiresAtMs: T0 + DAY });
      const all = (await store.listBatches("org_a", { limit: 100 })).batches.map((b) => b.id);
      assert.deepEqual(all, ["batch_6", "batch_5", "batch_4", "batch_3", "batch_2", "batch_1", "batch_0"]);
      for (const limit of [1, 2, 3, 7]) {
        const ids: string[] = [];
        let cursor: string | undefined;
        do {
          const page = await store.listBatches("org_a", { limit, ...(cursor === undefined ? {} : { cursor }) });
          assert.ok(page.batches.length <= limit);
          ids.push(...page.batches.map((b) => b.id));
          cursor = page.nextCursor ?? undefined;
        } while (cursor !== undefined);
        assert.deepEqual(ids, all, `pages of ${limit}`);
      }
      await assert.rejects(store.listBatches("org_a", { limit: 10, cursor: "not-a-cursor" }), StoreInputError);
      await assert.rejects(store.listBatches("org_a", { limit: 0 }), StoreInputError);
    });

    it("claims the oldest batch first, in line order, across organizations, at most perOrgLimit live claims per organization", async () => {
      await submit("batch_a1", 3, { orgId: "org_a", createdAtMs: T0 });
      await submit("batch_b", 3, { orgId: "org_b", createdAtMs: T0 + 1 });
      await submit("batch_a2", 2, { orgId: "org_a", createdAtMs: T0 + 2 });
      const now = T0 + SECOND;
      const firstClaims = await claim(now, 4);
      assert.deepEqual(at(firstClaims), ["batch_a1:0", "batch_a1:1", "batch_a1:2", "batch_b:0"]);
      assert.deepEqual(at(await claim(now, 2, "i2", 4)), ["batch_b:1", "batch_b:2"], "the older batch first");
      const third = await claim(now, 10, "i2", 4);
      assert.deepEqual(at(third), ["batch_a2:0"], "org_a has room for one more");
      assert.deepEqual(await claim(now, 10, "i2", 4), []);
      const [first] = await claim(now - 1, 0);
      assert.equal(first, undefined, "limit 0 claims nothing");
      // A finished claim frees room for the organization.
      const a1 = await store.results("org_a", "batch_a1", { afterPosition: -1, limit: 10 });
      assert.deepEqual(a1, []);
      assert.equal(await finish(firstClaims[0]!, now), true);
      assert.deepEqual(at(await claim(now, 10, "i2", 4)), ["batch_a2:1"]);
      const statuses = await Promise.all(["batch_a1", "batch_a2"].map((id) => store.getBatch("org_a", id)));
      assert.deepEqual(
        statuses.map((b) => [b?.status, b?.startedAtMs]),
        [
          ["running", now],
          ["running", now],
        ],
      );
    });

    it("a claim whose lease ended is taken over with its request id; renewals keep it; the first finish wins", async () => {
      await submit("batch_1", 4);
      const leased = await store.claimRequests({ instanceId: "i1", nowMs: T0, leaseUntilMs: T0 + 10 * SECOND, limit: 2 });
      assert.deepEqual(at(leased), ["batch_1:0", "batch_1:1"]);
      assert.deepEqual(at(await claim(T0 + 5 * SECOND, 10, "i2")), ["batch_1:2", "batch_1:3"], "live leases are not taken");
      assert.equal(await store.renewClaims("i1", T0 + 20 * SECOND), 2);
      assert.deepEqual(await claim(T0 + 15 * SECOND, 10, "i3"), [], "renewed");
      const taken = await store.claimRequests({ instanceId: "i3", nowMs: T0 + 21 * SECOND, leaseUntilMs: T0 + 60 * SECOND, limit: 10 });
      assert.deepEqual(at(taken), ["batch_1:0", "batch_1:1"], "taken over once the lease ended (i2's leases end later)");
      assert.deepEqual(
        taken.map((c) => c.requestId),
        leased.map((c) => c.requestId),
        "the request keeps its id",
      );
      assert.equal(await store.renewClaims("i1", T0 + 90 * SECOND), 0, "i1 holds nothing any more");
      // i1 was still running the request: its finish is the first, the takeover's is a no-op.
      assert.equal(await finish(leased[0]!, T0 + 22 * SECOND, 11), true);
      assert.equal(await finish(taken[0]!, T0 + 23 * SECOND, 11), false);
      const batch = await store.getBatch("org_a", "batch_1");
      assert.deepEqual([batch?.succeeded, batch?.costMicrousd], [1, 11]);
      assert.equal(await store.releaseClaims("i3"), 1);
      assert.deepEqual(at(await claim(T0 + 24 * SECOND, 10, "i4")), ["batch_1:1"], "released claims are taken at once");
    });

    it("a claim says whether its request was claimed before (takeover or deferral)", async () => {
      await submit("batch_1", 3);
      const first = await claim(T0, 2, "i1");
      assert.deepEqual(
        first.map((c) => c.takenOver),
        [false, false],
      );
      const taken = await claim(T0 + 31 * SECOND, 3, "i2");
      assert.deepEqual(
        taken.map((c) => [c.position, c.takenOver]),
        [
          [0, true],
          [1, true],
          [2, false],
        ],
      );
    });

    it("a deferred claim is renewed by no instance and claimed again, with its request id, once its time has passed", async () => {
      await submit("batch_1", 2);
      const [c0] = await claim(T0, 1, "i1");
      assert.equal(await store.deferClaim({ batchId: "batch_1", position: 0, requestId: "req_other", untilMs: T0 + 5 * SECOND }), false);
      assert.equal(await store.deferClaim({ batchId: c0!.batchId, position: 0, requestId: c0!.requestId, untilMs: T0 + 5 * SECOND }), true);
      assert.equal(await store.renewClaims("i1", T0 + 60 * SECOND), 0, "i1 holds it no longer");
      assert.deepEqual(at(await claim(T0 + 4 * SECOND, 1, "i2")), ["batch_1:1"], "not before its time");
      const [again] = await claim(T0 + 6 * SECOND, 1, "i2");
      assert.deepEqual([again?.position, again?.requestId, again?.takenOver], [0, c0!.requestId, true]);
    });

    it("a reissued claim runs under its new request id: a finish under the old one changes nothing", async () => {
      await submit("batch_1", 1);
      const [c0] = await claim(T0, 1, "i1");
      const ref = { batchId: c0!.batchId, position: 0, requestId: c0!.requestId };
      assert.equal(await store.reissueClaim({ ...ref, newRequestId: "req_second" }), true);
      assert.equal(await store.reissueClaim({ ...ref, newRequestId: "req_third" }), false, "no longer claimed under the old id");
      assert.equal(await finish(c0!, T0 + SECOND, 7), false);
      assert.equal(await finish({ ...c0!, requestId: "req_second" }, T0 + SECOND, 7), true);
      const [result] = await allResults("org_a", "batch_1");
      assert.deepEqual([result?.requestId, result?.costMicrousd], ["req_second", 7]);
    });

    it("releaseClaimsOfOthers ends the leases of every other instance's claims (the one SQLite process restarted)", async () => {
      await submit("batch_1", 3);
      await claim(T0, 1, "i1");
      await claim(T0, 1, "i2");
      await claim(T0, 1, "i3");
      assert.equal(await store.releaseClaimsOfOthers("i3"), 2);
      assert.deepEqual(at(await claim(T0 + SECOND, 10, "i3")), ["batch_1:0", "batch_1:1"]);
    });

    it("a result is written once: a second finish, a finish under another request id or of an unclaimed request change nothing", async () => {
      await submit("batch_1", 3);
      const [c0, c1] = await claim(T0 + SECOND, 2);
      assert.equal(await finish(c0!, T0 + 2 * SECOND, 100), true);
      assert.equal(await finish(c0!, T0 + 3 * SECOND, 100), false);
      assert.equal(await finish(c0!, T0 + 3 * SECOND, 5, false), false);
      assert.equal(await finish({ ...c1!, requestId: "req_other" }, T0 + 3 * SECOND, 100), false);
      assert.equal(await finish({ ...c1!, position: 2 }, T0 + 3 * SECOND, 100), false, "position 2 was never claimed");
      assert.equal(await finish(c1!, T0 + 4 * SECOND, 50, false), true);
      const batch = await store.getBatch("org_a", "batch_1");
      assert.deepEqual([batch?.status, batch?.succeeded, batch?.failed, batch?.costMicrousd], ["running", 1, 1, 150]);
      const results = await allResults("org_a", "batch_1");
      assert.deepEqual(
        results.map((r) => [r.position, r.status, r.costMicrousd, r.requestId]),
        [
          [0, 200, 100, c0!.requestId],
          [1, 502, 50, c1!.requestId],
        ],
      );
      await assert.rejects(finish({ ...c1!, position: -1 }, T0, 0), StoreInputError);
      await assert.rejects(store.finishRequest({ ...c1!, status: 99, body: "{}", costMicrousd: 0, nowMs: T0 }), StoreInputError);
    });

    it("finishRequests writes finishes of several batches in one call, each once, answering whether each was written, in order", async () => {
      await submit("batch_1", 2, { orgId: "org_a", createdAtMs: T0 });
      await submit("batch_2", 3, { orgId: "org_b", createdAtMs: T0 + 1 });
      const claimed = await claim(T0 + SECOND, 5);
      assert.deepEqual(at(claimed), ["batch_1:0", "batch_1:1", "batch_2:0", "batch_2:1", "batch_2:2"]);
      const [a0, a1, b0, b1, b2] = claimed;
      assert.equal(await finish(a0!, T0 + 2 * SECOND, 100), true);
      const finishOf = (c: ClaimedRequest, status: number, costMicrousd: number, nowMs: number): FinishInput => ({
        batchId: c.batchId,
        position: c.position,
        requestId: c.requestId,
        status,
        body: JSON.stringify({ answers: { q: c.position } }),
        costMicrousd,
        nowMs,
      });
      assert.deepEqual(await store.finishRequests([]), []);
      const written = await store.finishRequests([
        finishOf(a1!, 200, 10, T0 + 3 * SECOND),
        finishOf(b0!, 502, 20, T0 + 4 * SECOND),
        finishOf(a0!, 200, 1000, T0 + 9 * SECOND),
        finishOf({ ...b1!, requestId: "req_other" }, 200, 1000, T0 + 9 * SECOND),
        finishOf(b2!, 200, 30, T0 + 5 * SECOND),
      ]);
      assert.deepEqual(written, [true, true, false, false, true]);
      const first = await store.getBatch("org_a", "batch_1");
      assert.deepEqual(
        [first?.status, first?.succeeded, first?.failed, first?.costMicrousd, first?.endedAtMs],
        ["completed", 2, 0, 110, T0 + 3 * SECOND],
        "ended with its last request, at that finish (the duplicate changed nothing)",
      );
      const second = await store.getBatch("org_b", "batch_2");
      assert.deepEqual(
        [second?.status, second?.succeeded, second?.failed, second?.costMicrousd, second?.endedAtMs],
        ["running", 1, 1, 50, null],
      );
      assert.deepEqual(
        (await allResults("org_b", "batch_2")).map((r) => [r.position, r.status, r.costMicrousd, r.requestId]),
        [
          [0, 502, 20, b0!.requestId],
          [2, 200, 30, b2!.requestId],
        ],
      );

      const tooMany = [
        finishOf(b1!, 200, 40, T0 + 6 * SECOND),
        ...Array(MAX_FINISHES_PER_CALL).fill(finishOf(a1!, 200, 1, T0 + 6 * SECOND)),
      ];
      await assert.rejects(store.finishRequests(tooMany), (err: unknown) => err instanceof StoreInputError && err.field === "inputs");
      assert.deepEqual(
        (await allResults("org_b", "batch_2")).map((r) => r.position),
        [0, 2],
        "nothing of the refused call is written",
      );
      assert.deepEqual(await store.finishRequests(tooMany.slice(0, MAX_FINISHES_PER_CALL)), [
        true,
        ...Array(MAX_FINISHES_PER_CALL - 1).fill(false),
      ]);
      const ended = await store.getBatch("org_b", "batch_2");
      assert.deepEqual([ended?.status, ended?.succeeded, ended?.failed, ended?.costMicrousd], ["completed", 2, 1, 90]);
    });

    it("cancel: pending requests end batch_cancelled (failed, no charge, no request id), running ones finish, then the batch is cancelled", async () => {
      await submit("batch_1", 5);
      const running = await claim(T0 + SECOND, 2);
      const cancelling = await store.cancelBatch("org_a", "batch_1", T0 + 2 * SECOND);
      assert.deepEqual([cancelling?.status, cancelling?.failed, cancelling?.endedAtMs], ["cancelling", 3, null]);
      assert.deepEqual(await claim(T0 + 3 * SECOND, 10), [], "nothing new starts");
      assert.deepEqual((await store.cancelBatch("org_a", "batch_1", T0 + 3 * SECOND))?.failed, 3, "a second cancel changes nothing");
      assert.equal(await finish(running[0]!, T0 + 4 * SECOND, 30), true);
      // The other running request's instance died: it is taken over and finished.
      const [takenOver] = await claim(T0 + 40 * SECOND, 10, "i2");
      assert.deepEqual([takenOver?.position, takenOver?.requestId], [1, running[1]!.requestId]);
      assert.equal(await finish(takenOver!, T0 + 41 * SECOND, 20), true);
      const cancelled = await store.getBatch("org_a", "batch_1");
      assert.deepEqual(
        [cancelled?.status, cancelled?.succeeded, cancelled?.failed, cancelled?.costMicrousd, cancelled?.endedAtMs],
        ["cancelled", 2, 3, 50, T0 + 41 * SECOND],
      );
      const results = await allResults("org_a", "batch_1");
      assert.deepEqual(
        results.map((r) => [r.position, r.status, r.requestId, r.costMicrousd]),
        [
          [0, 200, running[0]!.requestId, 30],
          [1, 200, running[1]!.requestId, 20],
          [2, 409, null, 0],
          [3, 409, null, 0],
          [4, 409, null, 0],
        ],
      );
      assert.equal(results[2]!.body, CANCELLED_BODY);
      assert.equal((await store.cancelBatch("org_a", "batch_1", T0 + 50 * SECOND))?.status, "cancelled", "an ended batch stays as it is");
    });

    it("cancel of a batch with nothing running ends it at once", async () => {
      await submit("batch_1", 3);
      const cancelled = await store.cancelBatch("org_a", "batch_1", T0 + SECOND);
      assert.deepEqual(
        [cancelled?.status, cancelled?.failed, cancelled?.endedAtMs, cancelled?.costMicrousd],
        ["cancelled", 3, T0 + SECOND, 0],
      );
      await submit("batch_2", 2);
      const [only] = await claim(T0 + SECOND, 1);
      assert.equal(only?.batchId, "batch_2", "a cancelled batch has nothing to claim");
      await finish(only!, T0 + 2 * SECOND, 5);
      const [second] = await claim(T0 + 2 * SECOND, 1);
      await finish(second!, T0 + 3 * SECOND, 5);
      assert.equal((await store.cancelBatch("org_a", "batch_2", T0 + 4 * SECOND))?.status, "completed");
    });

    it("expiry: at the end of the window pending requests end batch_expired, running ones finish, then the batch is expired", async () => {
      await submit("batch_1", 5, { windowMs: HOUR });
      await submit("batch_idle", 2, { windowMs: HOUR });
      await submit("batch_late", 2, { windowMs: 2 * HOUR, createdAtMs: T0 + 2 });
      const [c0, c1] = await store.claimRequests({ instanceId: "i1", nowMs: T0 + SECOND, leaseUntilMs: T0 + 2 * HOUR, limit: 2 });
      assert.equal(await finish(c0!, T0 + 2 * SECOND, 10), true);
      assert.equal(await store.expireBatches(T0 + HOUR - 1), 0, "not before the window ends");
      assert.equal(await store.expireBatches(T0 + HOUR), 3 + 2);
      assert.equal(await store.expireBatches(T0 + HOUR + 1), 0, "once");
      const [b1, idle, late] = await Promise.all(["batch_1", "batch_idle", "batch_late"].map((id) => store.getBatch("org_a", id)));
      assert.deepEqual([b1?.status, b1?.failed, b1?.endedAtMs], ["running", 3, null], "one request still runs");
      assert.deepEqual([idle?.status, idle?.failed, idle?.endedAtMs], ["expired", 2, T0 + HOUR]);
      assert.equal(late?.status, "queued");
      assert.deepEqual(at(await claim(T0 + HOUR + 1, 10)), ["batch_late:0", "batch_late:1"], "no new request of an expired window starts");
      assert.equal(await finish(c1!, T0 + HOUR + 5, 7), true);
      const ended = await store.getBatch("org_a", "batch_1");
      assert.deepEqual(
        [ended?.status, ended?.succeeded, ended?.failed, ended?.costMicrousd, ended?.endedAtMs],
        ["expired", 2, 3, 17, T0 + HOUR + 5],
      );
      const results = await allResults("org_a", "batch_1");
      assert.deepEqual(
        results.map((r) => [r.position, r.status, r.requestId]),
        [
          [0, 200, c0!.requestId],
          [1, 200, c1!.requestId],
          [2, 409, null],
          [3, 409, null],
          [4, 409, null],
        ],
      );
      assert.equal(results[4]!.body, EXPIRED_BODY);
    });

    it("a batch whose requests all started before the window ended completes, whenever the last finishes", async () => {
      await submit("batch_1", 2, { windowMs: HOUR });
      const claimed = await claim(T0 + SECOND, 10);
      assert.equal(await store.expireBatches(T0 + HOUR), 0);
      for (const c of claimed) await finish(c, T0 + 2 * HOUR, 1);
      assert.equal((await store.getBatch("org_a", "batch_1"))?.status, "completed");
    });

    it("results: the finished requests in line order, in pages after a line", async () => {
      await submit("batch_1", 12);
      const claimed = await claim(T0 + SECOND, 12);
      for (const c of claimed) if (c.position % 3 !== 1) await finish(c, T0 + 2 * SECOND + (11 - c.position), c.position);
      const finished = claimed.filter((c) => c.position % 3 !== 1).map((c) => c.position);
      assert.deepEqual(
        (await allResults("org_a", "batch_1")).map((r) => r.position),
        finished,
      );
      for (const limit of [1, 2, 5]) {
        const seen: number[] = [];
        for (let afterPosition = -1; ; ) {
          const page = (await store.results("org_a", "batch_1", { afterPosition, limit })) ?? [];
          if (page.length === 0) break;
          assert.ok(page.length <= limit);
          seen.push(...page.map((r) => r.position));
          afterPosition = page[page.length - 1]!.position;
        }
        assert.deepEqual(seen, finished, `pages of ${limit}`);
      }
      assert.deepEqual(
        (await store.results("org_a", "batch_1", { afterPosition: 5, limit: 2 }))?.map((r) => r.customId),
        ["c6", "c8"],
      );
      await assert.rejects(store.results("org_a", "batch_1", { afterPosition: -2, limit: 2 }), StoreInputError);
    });

    it("purge: ended batches past retention and uploads that never finished go, with their requests; others stay", async () => {
      await submit("batch_old", 3);
      await store.cancelBatch("org_a", "batch_old", T0 + SECOND);
      await submit("batch_recent", 2);
      await store.cancelBatch("org_a", "batch_recent", T0 + DAY);
      await submit("batch_queued", 2);
      await store.beginBatch({ id: "batch_stale", orgId: "org_b", keyId: "key_1", model: null, nowMs: T0, expiresAtMs: T0 + DAY });
      await store.addLines("batch_stale", lines(4), T0);
      await store.beginBatch({
        id: "batch_uploading",
        orgId: "org_b",
        keyId: "key_1",
        model: null,
        nowMs: T0 + HOUR,
        expiresAtMs: T0 + DAY,
      });
      await store.addLines("batch_uploading", lines(2), T0 + HOUR);

      const purge = (limit: number) => store.purgeBatches({ endedBeforeMs: T0 + HOUR, untouchedBeforeMs: T0 + HOUR, limit });
      assert.equal(await purge(1), 2, "one of each kind");
      assert.equal(await purge(1), 0);
      for (const [id, rows] of [
        ["batch_old", 0],
        ["batch_stale", 0],
        ["batch_recent", 2],
        ["batch_queued", 2],
        ["batch_uploading", 2],
      ] as const) {
        assert.equal(await fixture.countRequests(id), rows, id);
      }
      assert.equal(await store.getBatch("org_a", "batch_old"), null);
      assert.equal((await store.getBatch("org_a", "batch_recent"))?.status, "cancelled");
      assert.equal(await store.purgeBatches({ endedBeforeMs: T0 + 2 * DAY, untouchedBeforeMs: T0 + 2 * DAY, limit: 10 }), 2);
      assert.equal((await store.getBatch("org_a", "batch_queued"))?.status, "queued", "a batch that has not ended is never purged");
    });

    it("work on a whole batch goes in chunks: cancel, expiry, drop and purge of batches larger than one chunk", async () => {
      const size = 2 * BATCH_ROWS_PER_CHUNK + 500;
      /** A batch of `size` lines written MAX_LINES_PER_CALL a call; opened unless `validating`. */
      const large = async (id: string, options: { windowMs?: number; validating?: boolean } = {}) => {
        await store.beginBatch({ id, orgId: "org_a", keyId: "key_1", model: null, nowMs: T0, expiresAtMs: T0 + (options.windowMs ?? DAY) });
        for (let from = 0; from < size; from += MAX_LINES_PER_CALL)
          await store.addLines(id, lines(Math.min(MAX_LINES_PER_CALL, size - from), from), T0);
        if (!options.validating) await store.openBatch({ batchId: id, total: size, inputBytes: size, nowMs: T0, idempotency: null });
      };
      await large("batch_cancel");
      const [running] = await claim(T0 + SECOND, 1);
      const cancelling = await store.cancelBatch("org_a", "batch_cancel", T0 + 2 * SECOND);
      assert.deepEqual([cancelling?.status, cancelling?.failed], ["cancelling", size - 1]);
      assert.equal(await finish(running!, T0 + 3 * SECOND, 5), true);
      const cancelled = await store.getBatch("org_a", "batch_cancel");
      assert.deepEqual([cancelled?.status, cancelled?.succeeded, cancelled?.failed], ["cancelled", 1, size - 1]);

      await large("batch_expire", { windowMs: HOUR });
      assert.equal(await store.expireBatches(T0 + HOUR), size);
      const expired = await store.getBatch("org_a", "batch_expire");
      assert.deepEqual([expired?.status, expired?.failed, expired?.endedAtMs], ["expired", size, T0 + HOUR]);
      let results = 0;
      for (let after = -1; ; ) {
        const page = (await store.results("org_a", "batch_expire", { afterPosition: after, limit: MAX_RESULTS_PAGE }))!;
        if (page.length === 0) break;
        assert.ok(page.every((r, i) => r.position === after + 1 + i && r.status === 409 && r.requestId === null));
        results += page.length;
        after = page[page.length - 1]!.position;
      }
      assert.equal(results, size, "one result a request");

      await large("batch_drop", { validating: true });
      assert.equal(await fixture.countRequests("batch_drop"), size);
      assert.equal(await store.dropBatch("batch_drop"), true);
      assert.equal(await fixture.countRequests("batch_drop"), 0);

      assert.equal(await store.purgeBatches({ endedBeforeMs: T0 + 2 * HOUR, untouchedBeforeMs: T0, limit: 10 }), 2);
      for (const id of ["batch_cancel", "batch_expire"]) {
        assert.equal(await fixture.countRequests(id), 0, id);
        assert.equal(await store.getBatch("org_a", id), null, id);
      }
    });

    it("addLines is bounded by lines and bytes a call; results by MAX_RESULTS_PAGE", async () => {
      await store.beginBatch({ id: "batch_1", orgId: "org_a", keyId: "key_1", model: null, nowMs: T0, expiresAtMs: T0 + DAY });
      await assert.rejects(
        store.addLines("batch_1", lines(MAX_LINES_PER_CALL + 1), T0),
        (err: unknown) => err instanceof StoreInputError && err.field === "lines",
      );
      const big = "x".repeat(Math.ceil(MAX_LINE_BYTES_PER_CALL / 4));
      const heavy = lines(4).map((l) => ({ ...l, body: JSON.stringify({ big }) }));
      await assert.rejects(store.addLines("batch_1", heavy, T0), (err: unknown) => err instanceof StoreInputError && err.field === "lines");
      await store.addLines("batch_1", heavy.slice(0, 3), T0);
      assert.equal(await fixture.countRequests("batch_1"), 3);
      await store.openBatch({ batchId: "batch_1", total: 3, inputBytes: 1, nowMs: T0, idempotency: null });
      await assert.rejects(store.results("org_a", "batch_1", { afterPosition: -1, limit: MAX_RESULTS_PAGE + 1 }), StoreInputError);
      await assert.rejects(store.results("org_a", "batch_1", { afterPosition: -1, limit: 0 }), StoreInputError);
    });
  });
}
